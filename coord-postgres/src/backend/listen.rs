//! The LISTEN connection: one per client, dispatching NOTIFY payloads
//! (`<kind>:<name>`) to the local waiters through [`Wakeups`].

use std::time::Duration;

use coord_core::wake::Wakeups;
use coord_core::{Error, Result};
use deadpool_postgres::Pool;
use futures::StreamExt;
use std::sync::Arc;

use tokio::sync::{Notify, mpsc, oneshot};
use tokio_postgres::types::Type;
use tokio_postgres::{AsyncMessage, Notification};
use tokio_postgres_rustls::MakeRustlsConnect;
use tokio_util::sync::CancellationToken;

use super::map_pg;

/// How long the startup probe waits for its own NOTIFY to come back.
const PROBE_WAIT: Duration = Duration::from_secs(2);
/// How often an idle listening connection is checked. It is also checked
/// at once when a statement call timed out ([`Listener::check_now`]).
const PING_EVERY: Duration = Duration::from_secs(15);

pub(crate) struct Listener {
    pub(crate) pg: tokio_postgres::Config,
    pub(crate) tls: MakeRustlsConnect,
    pub(crate) channel: String,
    pub(crate) wakeups: Wakeups,
    pub(crate) cancel: CancellationToken,
    pub(crate) connect_timeout: Duration,
    /// Notified when a statement call timed out or could get no
    /// connection: the network path may be dead for the listening
    /// connection too (half-open: no error comes, nothing passes), so it is
    /// pinged at once instead of at the next [`PING_EVERY`].
    pub(crate) check_now: Arc<Notify>,
}

/// One live LISTEN session.
struct Session {
    client: tokio_postgres::Client,
    notes: mpsc::UnboundedReceiver<Notification>,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl Listener {
    async fn open(&self) -> Result<Session> {
        let connect = async {
            let (client, mut conn) = self
                .pg
                .connect(self.tls.clone())
                .await
                .map_err(|e| map_pg("listen connect", e))?;
            let (tx, notes) = mpsc::unbounded_channel();
            let driver = tokio::spawn(async move {
                let mut messages = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
                while let Some(m) = messages.next().await {
                    match m {
                        Ok(AsyncMessage::Notification(n)) => {
                            if tx.send(n).is_err() {
                                return;
                            }
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::debug!(error = %e, "coord-postgres: listening connection ended");
                            return;
                        }
                    }
                }
            });
            client
                .batch_execute(&format!("LISTEN \"{}\"", self.channel))
                .await
                .map_err(|e| map_pg("listen", e))?;
            Ok::<_, Error>(Session {
                client,
                notes,
                driver,
            })
        };
        coord_core::util::bounded("postgres", "listen connect", self.connect_timeout, connect).await
    }

    /// Whether this session really receives notifications: send one
    /// through the statement pool and wait for it here. Through PgBouncer
    /// in transaction mode the LISTEN is left on a server connection that is
    /// not pinned to us, and the probe never comes back (sending it on the
    /// listening connection itself could land on that same server
    /// connection and pass by luck).
    async fn probe(&self, session: &mut Session, pool: &Pool) -> Result<bool> {
        let payload = format!("probe:{:032x}", rand::random::<u128>());
        coord_core::util::bounded("postgres", "listen probe", self.connect_timeout, async {
            let client = pool.get().await.map_err(|e| Error::Unavailable {
                backend: "postgres",
                operation: "listen probe",
                message: e.to_string(),
                source: None,
            })?;
            client
                .query_typed(
                    "SELECT 1 FROM (SELECT pg_notify($1::text, $2::text)) x",
                    &[(&self.channel, Type::TEXT), (&payload, Type::TEXT)],
                )
                .await
                .map_err(|e| map_pg("listen probe", e))
        })
        .await?;
        let deadline = tokio::time::Instant::now() + PROBE_WAIT;
        loop {
            match tokio::time::timeout_at(deadline, session.notes.recv()).await {
                Ok(Some(n)) if n.payload() == payload => return Ok(true),
                Ok(Some(n)) => self.wakeups.dispatch(n.payload()),
                Ok(None) | Err(_) => return Ok(false),
            }
        }
    }

    /// Open the first session and prove it receives notifications. When
    /// it cannot connect (a retryable error), say so and keep trying in
    /// the background, as after a lost connection.
    pub(crate) async fn start(self, pool: Pool, ready: oneshot::Sender<Result<bool>>) {
        let first = match self.open().await {
            Ok(mut s) => match self.probe(&mut s, &pool).await {
                Ok(true) => Ok(s),
                Ok(false) => {
                    let _ = ready.send(Ok(false));
                    return;
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        match first {
            Ok(session) => {
                let _ = ready.send(Ok(true));
                self.run(Some(session)).await;
            }
            Err(e) => {
                let retry = e.is_retryable();
                let _ = ready.send(Err(e));
                if retry {
                    self.run(None).await;
                }
            }
        }
    }

    /// Dispatch until cancelled; reconnect (with backoff) when the
    /// connection drops, then wake every local waiter once, since
    /// notifications may have been missed meanwhile.
    async fn run(self, mut session: Option<Session>) {
        loop {
            if let Some(mut s) = session.take() {
                if !self.serve(&mut s).await {
                    return;
                }
            }
            tracing::debug!(channel = %self.channel, "coord-postgres: LISTEN connection lost, reconnecting");
            let mut backoff = Duration::from_millis(50);
            session = Some(loop {
                tokio::select! {
                    _ = self.cancel.cancelled() => return,
                    s = self.open() => match s {
                        Ok(s) => break s,
                        Err(e) => {
                            tracing::debug!(error = %e, "coord-postgres: LISTEN reconnect failed");
                        }
                    },
                }
                tokio::select! {
                    _ = self.cancel.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(2));
            });
            coord_core::metrics::reconnect("postgres", "listen");
            self.wakeups.notify_every();
        }
    }

    /// Whether the session answers within the connect timeout, on a
    /// writable server. A server that went read-only (a primary fenced in
    /// a failover) still answers and keeps the LISTEN, but the new
    /// primary's notifications never come there: reconnect, and with
    /// every host of the URL and target_session_attrs read-write the new
    /// connection finds the writable server.
    async fn alive(&self, session: &mut Session) -> bool {
        let answer = tokio::time::timeout(
            self.connect_timeout,
            session.client.simple_query("SHOW transaction_read_only"),
        )
        .await;
        let Ok(Ok(messages)) = answer else {
            return false;
        };
        let read_only = messages.iter().any(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0) == Some("on"),
            _ => false,
        });
        if read_only {
            tracing::debug!("coord-postgres: the LISTEN connection's server is read-only now");
        }
        !read_only
    }

    /// Dispatch the notifications of one session until it is lost (false:
    /// cancelled).
    async fn serve(&self, session: &mut Session) -> bool {
        let mut ping = tokio::time::interval(PING_EVERY);
        ping.tick().await;
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return false,
                n = session.notes.recv() => match n {
                    Some(n) => self.wakeups.dispatch(n.payload()),
                    None => return true,
                },
                _ = self.check_now.notified() => {
                    if !self.alive(session).await {
                        tracing::debug!("coord-postgres: the LISTEN connection did not answer after a statement timed out");
                        return true;
                    }
                }
                _ = ping.tick() => {
                    if !self.alive(session).await {
                        return true;
                    }
                }
            }
        }
    }
}
