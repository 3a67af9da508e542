//! Session leases: one etcd lease per client and TTL, granted once, kept
//! alive by one task over one keepalive stream, shared by every key the
//! client attaches to it (as etcd's own `concurrency.Session` does).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use coord_core::{Error, Result};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, sleep, sleep_until};

use crate::keys::{BACKEND, is_lease_not_found, map_err};

type Reply = oneshot::Sender<Result<()>>;

/// A lease just granted.
pub(crate) struct Grant {
    /// The lease id.
    pub(crate) id: i64,
    /// The TTL asked for, in seconds.
    pub(crate) ttl: u64,
    /// The TTL the server granted (at least its minimum).
    pub(crate) granted_ttl: u64,
    /// The instant before the grant request was sent.
    pub(crate) granted_at: Instant,
}

/// One session lease.
pub(crate) struct Session {
    /// The etcd lease id.
    pub(crate) id: i64,
    /// The TTL asked for, in seconds (the key of the sessions map).
    pub(crate) ttl: u64,
    tx: mpsc::UnboundedSender<Reply>,
    dead: Arc<AtomicBool>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("ttl", &self.ttl)
            .field("dead", &self.is_dead())
            .finish()
    }
}

pub(crate) fn expired_error(operation: &'static str) -> Error {
    Error::Unavailable {
        backend: BACKEND,
        operation,
        message: "the client's session lease expired (keepalives failed until its TTL ran out); \
                  everything attached to it is gone. Retry to start a new session"
            .into(),
    }
}

impl Session {
    /// Start the keepalive task of a lease granted at `granted_at` (the
    /// instant before the grant request was sent) with the server's
    /// `granted_ttl`. `on_death` runs once when the lease is known or
    /// presumed gone.
    pub(crate) fn start(
        client: etcd_client::Client,
        grant: Grant,
        call_timeout: Duration,
        shutdown: watch::Receiver<()>,
        on_death: Box<dyn FnOnce(i64) + Send>,
    ) -> Arc<Session> {
        let Grant {
            id,
            ttl,
            granted_ttl,
            granted_at,
        } = grant;
        let (tx, rx) = mpsc::unbounded_channel();
        let dead = Arc::new(AtomicBool::new(false));
        let session = Arc::new(Session {
            id,
            ttl,
            tx,
            dead: dead.clone(),
        });
        tokio::spawn(keepalive_task(KeepaliveTask {
            client,
            id,
            ttl: Duration::from_secs(granted_ttl.max(1)),
            confirmed: granted_at,
            call_timeout,
            rx,
            dead,
            shutdown,
            on_death: Some(on_death),
        }));
        session
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Refresh the lease now: `Ok` once the server has answered a keepalive
    /// sent after this call began with a positive TTL, so the lease lives
    /// at least its TTL from the start of this call.
    pub(crate) async fn keepalive(&self, operation: &'static str, limit: Duration) -> Result<()> {
        if self.is_dead() {
            return Err(expired_error(operation));
        }
        let (tx, rx) = oneshot::channel();
        if self.tx.send(tx).is_err() {
            return Err(expired_error(operation));
        }
        match tokio::time::timeout(limit, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(expired_error(operation)),
            Err(_) => Err(Error::Unavailable {
                backend: BACKEND,
                operation,
                message: format!("no lease keepalive answer within {limit:?}"),
            }),
        }
    }
}

struct KeepaliveTask {
    client: etcd_client::Client,
    id: i64,
    ttl: Duration,
    /// The lease lives at least `ttl` after this instant.
    confirmed: Instant,
    call_timeout: Duration,
    rx: mpsc::UnboundedReceiver<Reply>,
    dead: Arc<AtomicBool>,
    shutdown: watch::Receiver<()>,
    on_death: Option<Box<dyn FnOnce(i64) + Send>>,
}

impl KeepaliveTask {
    fn die(&mut self, pending: &mut VecDeque<(Instant, Option<Reply>)>) {
        self.dead.store(true, Ordering::Release);
        for (_, r) in pending.drain(..) {
            if let Some(r) = r {
                let _ = r.send(Err(expired_error("session keepalive")));
            }
        }
        self.rx.close();
        while let Ok(r) = self.rx.try_recv() {
            let _ = r.send(Err(expired_error("session keepalive")));
        }
        if let Some(f) = self.on_death.take() {
            f(self.id);
        }
        tracing::warn!(lease = self.id, "etcd session lease lost");
    }
}

fn unavailable(message: &str) -> Error {
    Error::Unavailable {
        backend: BACKEND,
        operation: "session keepalive",
        message: message.to_string(),
    }
}

async fn keepalive_task(mut t: KeepaliveTask) {
    let period = (t.ttl / 3).max(Duration::from_millis(100));
    let mut pending: VecDeque<(Instant, Option<Reply>)> = VecDeque::new();
    let mut backoff = Duration::from_millis(50);
    loop {
        // (Re)open the keepalive stream; opening it sends one keepalive.
        let sent = Instant::now();
        let mut lc = t.client.lease_client();
        let opened = tokio::select! {
            _ = t.shutdown.changed() => return,
            _ = sleep_until(t.confirmed + t.ttl) => { t.die(&mut pending); return; }
            r = tokio::time::timeout(t.call_timeout, lc.keep_alive(t.id)) => r,
        };
        let (mut keeper, mut stream) = match opened {
            Ok(Ok(pair)) => {
                t.confirmed = t.confirmed.max(sent);
                backoff = Duration::from_millis(50);
                pair
            }
            Ok(Err(e)) if is_lease_not_found(&e) => {
                t.die(&mut pending);
                return;
            }
            Ok(Err(e)) => {
                let err = map_err("session keepalive", e);
                tracing::debug!(lease = t.id, error = %err, "etcd keepalive stream failed; retrying");
                fail_all(&mut pending, &err);
                tokio::select! {
                    _ = t.shutdown.changed() => return,
                    _ = sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
            Err(_) => {
                fail_all(
                    &mut pending,
                    &unavailable("keepalive stream did not open in time"),
                );
                continue;
            }
        };
        let mut next = Instant::now() + period;
        loop {
            let stall = pending
                .front()
                .map(|(s, _)| *s + t.call_timeout)
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                _ = t.shutdown.changed() => return,
                _ = sleep_until(t.confirmed + t.ttl) => { t.die(&mut pending); return; }
                _ = sleep_until(stall) => {
                    fail_all(&mut pending, &unavailable("keepalive answer overdue"));
                    break;
                }
                _ = sleep_until(next) => {
                    let now = Instant::now();
                    next = now + period;
                    if keeper.keep_alive().await.is_err() {
                        break;
                    }
                    pending.push_back((now, None));
                }
                req = t.rx.recv() => {
                    let Some(reply) = req else { return };
                    let now = Instant::now();
                    if keeper.keep_alive().await.is_err() {
                        let _ = reply.send(Err(unavailable("keepalive stream closed")));
                        break;
                    }
                    pending.push_back((now, Some(reply)));
                }
                msg = stream.message() => match msg {
                    Ok(Some(resp)) => {
                        let (sent, reply) = pending.pop_front().unwrap_or((t.confirmed, None));
                        if resp.ttl() > 0 {
                            t.confirmed = t.confirmed.max(sent);
                            if let Some(r) = reply {
                                let _ = r.send(Ok(()));
                            }
                        } else {
                            if let Some(r) = reply {
                                let _ = r.send(Err(expired_error("session keepalive")));
                            }
                            t.die(&mut pending);
                            return;
                        }
                    }
                    Ok(None) | Err(_) => {
                        fail_all(&mut pending, &unavailable("keepalive stream broke"));
                        break;
                    }
                },
            }
        }
        tokio::select! {
            _ = t.shutdown.changed() => return,
            _ = sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

fn fail_all(pending: &mut VecDeque<(Instant, Option<Reply>)>, err: &Error) {
    for (_, r) in pending.drain(..) {
        if let Some(r) = r {
            let _ = r.send(Err(err.clone()));
        }
    }
}
