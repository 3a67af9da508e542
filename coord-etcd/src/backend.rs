//! The backend object: connection, sessions, local claim bookkeeping, the
//! reaper and the watch tasks.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use coord_core::util::{Kind, bounded};
use coord_core::wake::{Waiter, Wakeups};
use coord_core::{
    Attempt, Capabilities, Coord, Error, FencingDurability, FencingToken, OwnerToken, Result,
};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, EventType, GetOptions, KeyValue,
    PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchFilterType,
    WatchOptions,
};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until};

use crate::keys::{BACKEND, Keys, map_err, not_sent, prefix_end};
use crate::options::EtcdOptions;
use crate::session::{Grant, Session, expired_error};

/// The etcd backend: implements every coord-core trait
/// ([`Lock`](coord_core::Lock), [`Lease`](coord_core::Lease),
/// [`FencingSource`](coord_core::FencingSource),
/// [`Election`](coord_core::Election), [`Barrier`](coord_core::Barrier),
/// [`Limiter`](coord_core::Limiter)).
///
/// Most users want [`connect`](crate::connect), which wraps it in a
/// [`Coord`]. Background tasks (session keepalives, watches, the reaper
/// that deletes claims whose TTL ran out) end when the last handle is
/// dropped; the server then expires the client's session leases by itself.
pub struct EtcdBackend {
    pub(crate) shared: Arc<Shared>,
    _shutdown: watch::Sender<()>,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.shared.endpoints)
            .field("prefix", &self.shared.prefix)
            .field("capabilities", &self.shared.caps)
            .finish_non_exhaustive()
    }
}

/// Where a local claim stands.
pub(crate) enum EntryState {
    /// Granted; the claim ends at `deadline` unless extended.
    Held { deadline: Instant },
    /// An attempt is in flight (or was cancelled mid-flight): if nothing
    /// replaces this by `deadline`, the reaper deletes the owner's key, so
    /// a grant that raced a cancellation still ends at its TTL.
    Pending { deadline: Instant },
    /// Queued behind `pred` (FIFO locks only).
    Queued {
        pred: Option<Vec<u8>>,
        watch: Option<AbortOnDrop>,
        /// When the predecessor's deletion was seen (the waiter should
        /// attempt again soon; if it does not within `grace`, it is
        /// presumed gone and its key is removed).
        pending_since: Option<Instant>,
        /// Whether another local waiter already passed the wake-up on to
        /// this one (once per predecessor deletion, so nobody spins).
        renotified: bool,
        last_attempt: Instant,
        grace: Duration,
    },
    /// The queued key vanished (its session lease expired) or was removed
    /// as abandoned: every attempt fails until `release`.
    Lost,
}

pub(crate) struct Entry {
    pub(crate) key: Vec<u8>,
    pub(crate) rev: i64,
    pub(crate) lease: i64,
    pub(crate) lease_ttl: u64,
    pub(crate) session: Option<Arc<Session>>,
    pub(crate) state: EntryState,
}

pub(crate) type EntryKey = (Kind, Box<str>, [u8; 16]);

/// What is claimed, and how: the kind, the value stored in the key
/// (elections: the candidate), whether waiters queue (FIFO locks), and the
/// operation's name for errors.
#[derive(Clone, Copy)]
pub(crate) struct ClaimSpec<'a> {
    pub(crate) kind: Kind,
    pub(crate) value: &'a [u8],
    pub(crate) fair: bool,
    pub(crate) op: &'static str,
}

/// Something the reaper must delete.
#[derive(Debug, Clone)]
pub(crate) enum Deletion {
    /// Delete `key` if its create revision is `rev` (0: unconditionally).
    Key { key: Vec<u8>, rev: i64 },
    /// Revoke a lease (and so every key attached to it).
    Lease(i64),
}

/// A spawned task aborted when this handle is dropped.
pub(crate) struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct WatchSlot {
    ready: watch::Receiver<bool>,
    _task: AbortOnDrop,
}

/// What a shared (per name) watch does with events.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum WatchKind {
    /// Wake every local waiter on any change (elections).
    AnyChange,
    /// Wake every local waiter when the barrier's generation changes.
    BarrierGeneration,
}

pub(crate) struct Shared {
    pub(crate) client: Client,
    pub(crate) keys: Keys,
    pub(crate) timeout: Duration,
    pub(crate) caps: Capabilities,
    pub(crate) wakeups: Wakeups,
    endpoints: Vec<String>,
    prefix: String,
    sessions: Mutex<HashMap<u64, Arc<Session>>>,
    session_create: tokio::sync::Mutex<()>,
    pub(crate) entries: Mutex<HashMap<EntryKey, Entry>>,
    reaper: Notify,
    retry: Mutex<Vec<Deletion>>,
    watchers: Mutex<HashMap<String, WatchSlot>>,
    /// Pending limiter checks per key, combined into one compare-and-swap.
    pub(crate) limiter_queue: Mutex<HashMap<Vec<u8>, Vec<LimiterRequest>>>,
    pub(crate) shutdown: watch::Receiver<()>,
}

pub(crate) type LimiterRequest = (
    coord_core::Quota,
    u64,
    tokio::sync::oneshot::Sender<Result<coord_core::Decision>>,
);

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whole seconds, rounded up, at least 1.
pub(crate) fn secs(d: Duration) -> u64 {
    (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
}

pub(crate) fn wake_key(kind: Kind, name: &str) -> String {
    format!("{}\u{0}{}", kind.as_str(), name)
}

fn entry_key(kind: Kind, name: &str, owner: &OwnerToken) -> EntryKey {
    (kind, name.into(), *owner.as_bytes())
}

/// How long a queued waiter whose predecessor is gone may take to attempt
/// again before it is presumed gone and its key is removed, so that it
/// cannot block the queue: at least this, and at least two call timeouts
/// plus this (see [`Shared::pending_grace`]). A live waiter is woken at
/// once and attempts within milliseconds, but during a leader election its
/// attempts can each take up to a call timeout; a cancelled waiter's key is
/// normally removed at once by coord-core's cleanup, so this is only the
/// safety net for a cleanup that could not reach the cluster.
const PENDING_GRACE: Duration = Duration::from_secs(2);

/// Not retryable on purpose: the wait loop returns it at once (and
/// releases), as etcd's own mutex returns `ErrSessionExpired`.
fn lost_in_queue(name: &str) -> Error {
    Error::Store {
        backend: BACKEND,
        operation: "lock acquire",
        message: format!(
            "the queued request for `{name}` lost its place in line (its session lease expired, \
             or it stopped attempting); nothing is held. Release and acquire again"
        ),
    }
}

fn first_sorted(key: &[u8], end: &[u8], order: SortOrder, limit: i64) -> TxnOp {
    TxnOp::get(
        key.to_vec(),
        Some(
            GetOptions::new()
                .with_range(end.to_vec())
                .with_sort(SortTarget::Create, order)
                .with_limit(limit),
        ),
    )
}

pub(crate) fn kvs(resp: &TxnResponse, idx: usize) -> Vec<KeyValue> {
    match resp.op_responses().into_iter().nth(idx) {
        Some(TxnOpResponse::Get(mut g)) => g.take_kvs(),
        Some(TxnOpResponse::Delete(mut d)) => d.take_prev_kvs(),
        _ => Vec::new(),
    }
}

pub(crate) fn header_rev(resp: &TxnResponse) -> i64 {
    resp.header().map(|h| h.revision()).unwrap_or(0)
}

fn is_lease_not_found(e: &Error) -> bool {
    matches!(e, Error::Store { message, .. } if message.contains("lease not found"))
}

impl EtcdBackend {
    /// Connect to the cluster named by `opts`: authenticate if a user is
    /// given, then grant the first session lease, which also tells the
    /// server's minimum lease TTL (reported as
    /// [`Capabilities::min_ttl`]).
    ///
    /// Errors: [`Error::Unavailable`] when no endpoint answers within the
    /// timeouts, [`Error::Store`] for a refused login, [`Error::Config`] for
    /// unreadable TLS files. None of them contains the password.
    pub async fn connect(opts: EtcdOptions) -> Result<Arc<EtcdBackend>> {
        let scheme = if opts.tls { "https://" } else { "http://" };
        let endpoints: Vec<String> = opts.hosts.iter().map(|h| format!("{scheme}{h}")).collect();
        let mut co = ConnectOptions::new()
            .with_connect_timeout(opts.connect_timeout)
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_keep_alive_while_idle(true)
            .with_require_leader(true)
            .with_auto_token_refresh(true);
        if opts.tls {
            let mut tls = etcd_client::TlsOptions::new();
            match &opts.ca_file {
                Some(ca) => {
                    let pem = std::fs::read(ca).map_err(|e| {
                        Error::Config(format!("cannot read CA file {}: {e}", ca.display()))
                    })?;
                    tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
                }
                None => tls = tls.with_native_roots(),
            }
            if let Some((cert, key)) = &opts.identity {
                let c = std::fs::read(cert).map_err(|e| {
                    Error::Config(format!("cannot read certificate {}: {e}", cert.display()))
                })?;
                let k = std::fs::read(key).map_err(|e| {
                    Error::Config(format!("cannot read key file {}: {e}", key.display()))
                })?;
                tls = tls.identity(etcd_client::Identity::from_pem(c, k));
            }
            if let Some(d) = &opts.domain {
                tls = tls.domain_name(d.clone());
            }
            co = co.with_tls(tls);
        }
        if let Some((user, password)) = &opts.user {
            co = co.with_user(user.clone(), password.expose().to_string());
        }
        let limit = opts.call_timeout + opts.connect_timeout;
        let client = bounded(BACKEND, "connect", limit, async {
            Client::connect(endpoints.clone(), Some(co))
                .await
                .map_err(|e| map_err("connect", e))
        })
        .await?;
        // The first session lease: asking for 1 s tells the server's minimum.
        let start = Instant::now();
        let grant = bounded(BACKEND, "connect", limit, async {
            client
                .lease_client()
                .grant(1, None)
                .await
                .map_err(|e| map_err("connect", e))
        })
        .await?;
        let min = grant.ttl().max(1) as u64;
        let mut caps = Capabilities::new(BACKEND);
        caps.min_ttl = Duration::from_secs(min);
        caps.ttl_granularity = Duration::from_secs(1);
        caps.fair = true;
        caps.fencing = FencingDurability::Durable;
        caps.server_clock = false;
        caps.notifications = true;
        let (tx, rx) = watch::channel(());
        let shared = Arc::new(Shared {
            client,
            keys: Keys::new(&opts.prefix),
            timeout: opts.call_timeout,
            caps,
            wakeups: Wakeups::new(),
            endpoints: opts.hosts.clone(),
            prefix: opts.prefix.clone(),
            sessions: Mutex::new(HashMap::new()),
            session_create: tokio::sync::Mutex::new(()),
            entries: Mutex::new(HashMap::new()),
            reaper: Notify::new(),
            retry: Mutex::new(Vec::new()),
            watchers: Mutex::new(HashMap::new()),
            limiter_queue: Mutex::new(HashMap::new()),
            shutdown: rx,
        });
        shared.insert_session(grant.id(), min, min, start);
        tokio::spawn(reaper_task(shared.clone()));
        Ok(Arc::new(EtcdBackend {
            shared,
            _shutdown: tx,
        }))
    }

    /// A [`Coord`] handle over this backend (every primitive).
    pub fn coord(self: &Arc<Self>) -> Coord {
        Coord::from_backend(self.clone())
    }

    /// What this backend promises.
    pub fn capabilities(&self) -> &Capabilities {
        &self.shared.caps
    }

    /// The lease ids of this client's live session leases (for tests and
    /// operators: `etcdctl lease timetolive <id>`).
    pub fn session_leases(&self) -> Vec<i64> {
        lock(&self.shared.sessions)
            .values()
            .filter(|s| !s.is_dead())
            .map(|s| s.id)
            .collect()
    }
}

impl Shared {
    /// See [`PENDING_GRACE`].
    fn pending_grace(&self) -> Duration {
        self.timeout * 2 + PENDING_GRACE
    }

    /// Run one etcd call with the call timeout, mapping its error. A call
    /// that was never sent (the connection to a member was refused, or the
    /// member has no leader) is retried on another member within the same
    /// time limit: that is always safe.
    pub(crate) async fn call<T, F, Fut>(&self, op: &'static str, mut f: F) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        bounded(BACKEND, op, self.timeout, async {
            let mut tries = 0u32;
            loop {
                match f(self.client.clone()).await {
                    Ok(v) => return Ok(v),
                    Err(e) if tries < 20 && not_sent(&e) => {
                        tries += 1;
                        sleep(Duration::from_millis(10 * u64::from(tries.min(10)))).await;
                    }
                    Err(e) => return Err(map_err(op, e)),
                }
            }
        })
        .await
    }

    pub(crate) async fn txn(&self, op: &'static str, txn: Txn) -> Result<TxnResponse> {
        self.call(op, |mut c| {
            let t = txn.clone();
            async move { c.txn(t).await }
        })
        .await
    }

    pub(crate) async fn get(
        &self,
        op: &'static str,
        key: Vec<u8>,
        opts: Option<GetOptions>,
    ) -> Result<Vec<KeyValue>> {
        self.call(op, |mut c| {
            let (k, o) = (key.clone(), opts.clone());
            async move { c.get(k, o).await }
        })
        .await
        .map(|mut r| r.take_kvs())
    }

    fn insert_session(
        self: &Arc<Self>,
        id: i64,
        ttl: u64,
        granted: u64,
        start: Instant,
    ) -> Arc<Session> {
        let weak: Weak<Shared> = Arc::downgrade(self);
        let on_death = Box::new(move |id: i64| {
            if let Some(s) = weak.upgrade() {
                lock(&s.sessions).retain(|_, v| v.id != id);
                s.reaper.notify_one();
            }
        });
        let grant = Grant {
            id,
            ttl,
            granted_ttl: granted,
            granted_at: start,
        };
        let s = Session::start(
            self.client.clone(),
            grant,
            self.timeout,
            self.shutdown.clone(),
            on_death,
        );
        lock(&self.sessions).insert(ttl, s.clone());
        s
    }

    /// The live session lease for `ttl` seconds, granting it on first use.
    pub(crate) async fn session(
        self: &Arc<Self>,
        ttl: u64,
        op: &'static str,
    ) -> Result<Arc<Session>> {
        if let Some(s) = lock(&self.sessions).get(&ttl).filter(|s| !s.is_dead()) {
            return Ok(s.clone());
        }
        let _creating = self.session_create.lock().await;
        if let Some(s) = lock(&self.sessions).get(&ttl).filter(|s| !s.is_dead()) {
            return Ok(s.clone());
        }
        let start = Instant::now();
        let resp = self
            .call(
                op,
                |mut c| async move { c.lease_grant(ttl as i64, None).await },
            )
            .await?;
        Ok(self.insert_session(resp.id(), ttl, resp.ttl().max(1) as u64, start))
    }

    pub(crate) fn schedule(&self, d: Deletion) {
        lock(&self.retry).push(d);
        self.reaper.notify_one();
    }

    fn deletion_of(kind: Kind, e: &Entry) -> Deletion {
        if kind == Kind::Lease {
            Deletion::Lease(e.lease)
        } else {
            Deletion::Key {
                key: e.key.clone(),
                rev: e.rev,
            }
        }
    }

    async fn run_deletion(&self, d: &Deletion) -> Result<()> {
        match d {
            Deletion::Key { key, rev } => {
                let txn = if *rev > 0 {
                    Txn::new()
                        .when([Compare::create_revision(
                            key.clone(),
                            CompareOp::Equal,
                            *rev,
                        )])
                        .and_then([TxnOp::delete(key.clone(), None)])
                } else {
                    Txn::new().and_then([TxnOp::delete(key.clone(), None)])
                };
                self.txn("expire claim", txn).await.map(|_| ())
            }
            Deletion::Lease(id) => {
                match self
                    .call(
                        "expire lease",
                        |mut c| async move { c.lease_revoke(*id).await },
                    )
                    .await
                {
                    Err(e) if is_lease_not_found(&e) => Ok(()),
                    other => other.map(|_| ()),
                }
            }
        }
    }

    /// One round of the reaper: end expired claims, drop abandoned queue
    /// entries, retry failed deletions. Returns when to run next.
    async fn reap_once(&self) -> Instant {
        let now = Instant::now();
        let mut next = now + Duration::from_millis(500);
        let mut todo = std::mem::take(&mut *lock(&self.retry));
        {
            let mut entries = lock(&self.entries);
            let mut expired = Vec::new();
            for (ek, e) in entries.iter_mut() {
                match &mut e.state {
                    EntryState::Held { deadline } | EntryState::Pending { deadline } => {
                        if *deadline <= now {
                            expired.push(ek.clone());
                        } else {
                            next = next.min(*deadline);
                        }
                    }
                    EntryState::Queued {
                        pending_since,
                        last_attempt,
                        grace,
                        ..
                    } => {
                        let stale = pending_since.is_some_and(|p| p + *grace <= now);
                        let orphan = *last_attempt + Duration::from_secs(2) <= now
                            && !self.wakeups.has_waiters(&wake_key(ek.0, &ek.1));
                        if stale || orphan {
                            tracing::debug!(name = %ek.1, "etcd lock waiter presumed gone; leaving the queue");
                            todo.push(Deletion::Key {
                                key: e.key.clone(),
                                rev: e.rev,
                            });
                            e.state = EntryState::Lost;
                        }
                    }
                    EntryState::Lost => {}
                }
            }
            for ek in expired {
                if let Some(e) = entries.remove(&ek) {
                    todo.push(Self::deletion_of(ek.0, &e));
                }
            }
        }
        let mut failed = Vec::new();
        for d in todo {
            if let Err(e) = self.run_deletion(&d).await {
                tracing::debug!(error = %e, "etcd reaper: deletion failed; will retry");
                failed.push(d);
            }
        }
        if !failed.is_empty() {
            lock(&self.retry).extend(failed);
            next = next.min(Instant::now() + Duration::from_millis(250));
        }
        next
    }

    // ---------------------------------------------------------------
    // Claims: locks (FIFO queue) and elections (one key).
    // ---------------------------------------------------------------

    /// One attempt at a claim. `fair`: queue (key-per-waiter) when a local
    /// waiter is subscribed.
    pub(crate) async fn try_claim(
        self: &Arc<Self>,
        spec: ClaimSpec<'_>,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Attempt> {
        let ClaimSpec {
            kind,
            value,
            fair,
            op,
        } = spec;
        let start = Instant::now();
        let ek = entry_key(kind, name, owner);
        let queue = self.keys.queue(kind, name);
        let end = prefix_end(&queue);
        let mut key = queue.clone();
        key.extend_from_slice(owner.to_hex().as_bytes());
        let wake = wake_key(kind, name);

        #[derive(Clone, Copy)]
        enum Known {
            Fresh,
            Held(i64),
            Queued(i64),
        }
        let known = {
            let mut entries = lock(&self.entries);
            match entries.get(&ek) {
                Some(Entry {
                    state: EntryState::Lost,
                    ..
                }) => return Err(lost_in_queue(name)),
                Some(Entry {
                    state: EntryState::Held { deadline },
                    ..
                }) if *deadline <= start => {
                    if let Some(e) = entries.remove(&ek) {
                        self.schedule(Self::deletion_of(kind, &e));
                    }
                    Known::Fresh
                }
                Some(
                    e @ Entry {
                        state: EntryState::Queued { .. },
                        ..
                    },
                ) => {
                    if e.session.as_ref().is_some_and(|s| s.is_dead()) {
                        let d = Self::deletion_of(kind, e);
                        if let Some(e) = entries.get_mut(&ek) {
                            e.state = EntryState::Lost;
                        }
                        drop(entries);
                        self.schedule(d);
                        return Err(lost_in_queue(name));
                    }
                    Known::Queued(e.rev)
                }
                Some(Entry {
                    state: EntryState::Pending { .. },
                    ..
                }) => Known::Fresh,
                Some(e) => Known::Held(e.rev),
                None => Known::Fresh,
            }
        };
        let session = match known {
            Known::Queued(_) | Known::Held(_) => {
                let s = lock(&self.entries).get(&ek).and_then(|e| e.session.clone());
                match s {
                    Some(s) if !s.is_dead() => s,
                    _ => self.session(secs(ttl), op).await?,
                }
            }
            Known::Fresh => self.session(secs(ttl), op).await?,
        };
        if let Known::Fresh = known {
            // Before anything is sent: if this future is dropped mid-flight,
            // the reaper removes whatever the attempt may have written.
            let mut entries = lock(&self.entries);
            let placeholder = Entry {
                key: key.clone(),
                rev: 0,
                lease: session.id,
                lease_ttl: session.ttl,
                session: Some(session.clone()),
                state: EntryState::Pending {
                    deadline: start + ttl,
                },
            };
            match entries.get(&ek) {
                None
                | Some(Entry {
                    state: EntryState::Pending { .. },
                    ..
                }) => {
                    entries.insert(ek.clone(), placeholder);
                }
                Some(_) => {}
            }
        }
        let queue_mode = fair
            && match known {
                Known::Queued(_) => true,
                Known::Held(_) => false,
                Known::Fresh => self.wakeups.has_waiters(&wake),
            };

        let txn =
            match known {
                Known::Held(r) | Known::Queued(r) => Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, r)])
                    .and_then([
                        first_sorted(&queue, &end, SortOrder::Ascend, 1),
                        TxnOp::get(
                            queue.clone(),
                            Some(
                                GetOptions::new()
                                    .with_range(end.clone())
                                    .with_max_create_revision(r - 1)
                                    .with_sort(SortTarget::Create, SortOrder::Descend)
                                    .with_limit(1),
                            ),
                        ),
                    ]),
                Known::Fresh if queue_mode => Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then([
                        TxnOp::put(
                            key.clone(),
                            value.to_vec(),
                            Some(PutOptions::new().with_lease(session.id)),
                        ),
                        first_sorted(&queue, &end, SortOrder::Ascend, 1),
                        first_sorted(&queue, &end, SortOrder::Descend, 2),
                    ])
                    .or_else([
                        TxnOp::get(key.clone(), None),
                        first_sorted(&queue, &end, SortOrder::Ascend, 1),
                    ]),
                Known::Fresh => Txn::new()
                    .when([Compare::version(queue.clone(), CompareOp::Equal, 0)
                        .with_range(end.clone())])
                    .and_then([TxnOp::put(
                        key.clone(),
                        value.to_vec(),
                        Some(PutOptions::new().with_lease(session.id)),
                    )])
                    .or_else([first_sorted(&queue, &end, SortOrder::Ascend, 1)]),
            };

        let (resp, ka) = tokio::join!(self.txn(op, txn), session.keepalive(op, self.timeout));
        let resp = match resp {
            Ok(r) => r,
            Err(e) => {
                if is_lease_not_found(&e) {
                    // The session died under us: forget it; the caller retries.
                    lock(&self.sessions).retain(|_, v| v.id != session.id);
                    if let Known::Queued(_) = known {
                        if let Some(en) = lock(&self.entries).get_mut(&ek) {
                            en.state = EntryState::Lost;
                        }
                        return Err(lost_in_queue(name));
                    }
                    return Err(expired_error(op));
                }
                return Err(e);
            }
        };
        let rev_now = header_rev(&resp);

        // Work out (my revision, first key, predecessor).
        let (my_rev, first, pred): (i64, Option<KeyValue>, Option<KeyValue>) = match known {
            Known::Held(r) | Known::Queued(r) => {
                if !resp.succeeded() {
                    // Our key is gone.
                    let queued = {
                        let mut entries = lock(&self.entries);
                        if let Known::Queued(_) = known {
                            if let Some(en) = entries.get_mut(&ek) {
                                en.state = EntryState::Lost;
                            }
                            true
                        } else {
                            entries.remove(&ek);
                            false
                        }
                    };
                    if queued {
                        return Err(lost_in_queue(name));
                    }
                    // Held but gone (expired or forced): a fresh attempt.
                    return Box::pin(self.try_claim(spec, name, owner, ttl)).await;
                }
                (
                    r,
                    kvs(&resp, 0).into_iter().next(),
                    kvs(&resp, 1).into_iter().next(),
                )
            }
            Known::Fresh if queue_mode => {
                if resp.succeeded() {
                    let first = kvs(&resp, 1).into_iter().next();
                    let pred = kvs(&resp, 2).into_iter().nth(1);
                    (rev_now, first, pred)
                } else {
                    let mine = kvs(&resp, 0).into_iter().next();
                    let first = kvs(&resp, 1).into_iter().next();
                    let r = mine.map(|k| k.create_revision()).unwrap_or(0);
                    let pred = if first.as_ref().is_some_and(|f| f.key() != key.as_slice()) && r > 0
                    {
                        let g = self
                            .get(
                                op,
                                queue.clone(),
                                Some(
                                    GetOptions::new()
                                        .with_range(end.clone())
                                        .with_max_create_revision(r - 1)
                                        .with_sort(SortTarget::Create, SortOrder::Descend)
                                        .with_limit(1),
                                ),
                            )
                            .await?;
                        g.into_iter().next()
                    } else {
                        None
                    };
                    (r, first, pred)
                }
            }
            Known::Fresh => {
                if resp.succeeded() {
                    (rev_now, None, None)
                } else {
                    let first = kvs(&resp, 0).into_iter().next();
                    let r = first
                        .as_ref()
                        .filter(|f| f.key() == key.as_slice())
                        .map(|f| f.create_revision())
                        .unwrap_or(0);
                    (r, first, None)
                }
            }
        };

        let granted = match (&known, queue_mode) {
            (Known::Fresh, false) => {
                resp.succeeded() || first.as_ref().is_some_and(|f| f.key() == key.as_slice())
            }
            _ => first.as_ref().is_some_and(|f| f.key() == key.as_slice()),
        };

        if granted {
            let deadline = start + ttl;
            let entry = Entry {
                key: key.clone(),
                rev: my_rev,
                lease: session.id,
                lease_ttl: session.ttl,
                session: Some(session.clone()),
                state: EntryState::Held { deadline },
            };
            match ka {
                Ok(()) => {
                    lock(&self.entries).insert(ek, entry);
                    self.reaper.notify_one();
                    Ok(Attempt::Granted(FencingToken(my_rev as u64)))
                }
                Err(e) => {
                    if session.is_dead() {
                        lock(&self.entries).remove(&ek);
                        self.schedule(Deletion::Key { key, rev: my_rev });
                    } else {
                        // Held, but the lease could not be confirmed: keep
                        // the bookkeeping (release and the reaper clean up).
                        lock(&self.entries).insert(ek, entry);
                        self.reaper.notify_one();
                    }
                    Err(e)
                }
            }
        } else if queue_mode && my_rev > 0 {
            if let Err(e) = ka {
                if session.is_dead() {
                    let mut entries = lock(&self.entries);
                    if let Known::Queued(_) = known {
                        if let Some(en) = entries.get_mut(&ek) {
                            en.state = EntryState::Lost;
                        }
                        return Err(lost_in_queue(name));
                    }
                    entries.remove(&ek);
                    drop(entries);
                    self.schedule(Deletion::Key { key, rev: my_rev });
                    return Err(e);
                }
            }
            let now = Instant::now();
            let mut renotify = false;
            {
                let mut entries = lock(&self.entries);
                let e = entries.entry(ek.clone()).or_insert_with(|| Entry {
                    key: key.clone(),
                    rev: my_rev,
                    lease: session.id,
                    lease_ttl: session.ttl,
                    session: Some(session.clone()),
                    state: EntryState::Lost,
                });
                e.rev = my_rev;
                e.lease = session.id;
                e.lease_ttl = session.ttl;
                e.session = Some(session.clone());
                let (old_pred, old_watch) = match std::mem::replace(&mut e.state, EntryState::Lost)
                {
                    EntryState::Queued { pred, watch, .. } => (pred, watch),
                    _ => (None, None),
                };
                let pred_key = pred.as_ref().map(|p| p.key().to_vec());
                let watch = match (&pred_key, old_watch) {
                    (Some(p), Some(w)) if old_pred.as_deref() == Some(p.as_slice()) => Some(w),
                    (Some(p), _) => Some(self.spawn_pred_watch(
                        ek.clone(),
                        wake.clone(),
                        p.clone(),
                        rev_now + 1,
                    )),
                    (None, _) => {
                        renotify = true;
                        None
                    }
                };
                e.state = EntryState::Queued {
                    pred: pred_key,
                    watch,
                    pending_since: None,
                    renotified: false,
                    last_attempt: now,
                    grace: self.pending_grace(),
                };
                // The head is another local waiter that may not have been
                // the one woken: pass the wake-up on.
                if let Some(f) = &first {
                    if let Some(hex) = f.key().strip_prefix(queue.as_slice()) {
                        if let Some(o) =
                            std::str::from_utf8(hex).ok().and_then(OwnerToken::from_hex)
                        {
                            let other = entry_key(kind, name, &o);
                            if other != ek {
                                if let Some(Entry {
                                    state:
                                        EntryState::Queued {
                                            pending_since: Some(_),
                                            renotified,
                                            ..
                                        },
                                    ..
                                }) = entries.get_mut(&other)
                                {
                                    if !*renotified {
                                        *renotified = true;
                                        renotify = true;
                                    }
                                }
                            }
                        }
                    }
                }
            }
            if renotify {
                self.wakeups.notify_one(&wake);
            }
            Ok(Attempt::Held { expires_in: None })
        } else {
            {
                let mut entries = lock(&self.entries);
                if let Some(Entry {
                    state: EntryState::Pending { .. },
                    ..
                }) = entries.get(&ek)
                {
                    entries.remove(&ek);
                }
            }
            Ok(Attempt::Held {
                expires_in: self.remaining_of_local(first.as_ref()),
            })
        }
    }

    /// If `kv` is a claim this client holds, its remaining time.
    fn remaining_of_local(&self, kv: Option<&KeyValue>) -> Option<Duration> {
        let kv = kv?;
        let entries = lock(&self.entries);
        entries.values().find_map(|e| match e.state {
            EntryState::Held { deadline } if e.key == kv.key() && e.rev == kv.create_revision() => {
                Some(deadline.saturating_duration_since(Instant::now()))
            }
            _ => None,
        })
    }

    fn spawn_pred_watch(
        self: &Arc<Self>,
        ek: EntryKey,
        wake: String,
        pred: Vec<u8>,
        start_rev: i64,
    ) -> AbortOnDrop {
        let shared = self.clone();
        AbortOnDrop(tokio::spawn(async move {
            let mut shutdown = shared.shutdown.clone();
            let mut backoff = Duration::from_millis(50);
            loop {
                let opts = WatchOptions::new()
                    .with_start_revision(start_rev)
                    .with_filters([WatchFilterType::NoPut]);
                let mut wc = shared.client.watch_client();
                let opened = tokio::select! {
                    _ = shutdown.changed() => return,
                    r = tokio::time::timeout(shared.timeout, wc.watch(pred.clone(), Some(opts))) => r,
                };
                if let Ok(Ok(mut stream)) = opened {
                    loop {
                        let msg = tokio::select! {
                            _ = shutdown.changed() => return,
                            m = stream.message() => m,
                        };
                        match msg {
                            Ok(Some(resp)) => {
                                let gone = resp.canceled()
                                    || resp
                                        .events()
                                        .iter()
                                        .any(|e| e.event_type() == EventType::Delete);
                                if gone {
                                    shared.pred_gone(&ek, &wake);
                                    return;
                                }
                                backoff = Duration::from_millis(50);
                            }
                            _ => break,
                        }
                    }
                }
                tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }))
    }

    fn pred_gone(&self, ek: &EntryKey, wake: &str) {
        let watch = {
            let mut entries = lock(&self.entries);
            match entries.get_mut(ek) {
                Some(Entry {
                    state:
                        EntryState::Queued {
                            pred,
                            watch,
                            pending_since,
                            renotified,
                            ..
                        },
                    ..
                }) => {
                    *pred = None;
                    *pending_since = Some(Instant::now());
                    *renotified = false;
                    watch.take()
                }
                _ => None,
            }
        };
        self.wakeups.notify_one(wake);
        // This runs on the watch task itself, which returns right after:
        // aborting it now changes nothing.
        drop(watch);
    }

    /// Release (or resign, or leave the queue): delete the owner's key,
    /// whether it holds or waits. `Ok(true)` iff it held the claim.
    pub(crate) async fn release_claim(
        &self,
        kind: Kind,
        name: &str,
        owner: &OwnerToken,
        op: &'static str,
    ) -> Result<bool> {
        let now = Instant::now();
        let ek = entry_key(kind, name, owner);
        let queue = self.keys.queue(kind, name);
        let end = prefix_end(&queue);
        let mut key = queue.clone();
        key.extend_from_slice(owner.to_hex().as_bytes());
        let entry = lock(&self.entries).remove(&ek);
        let expired_locally = matches!(
            entry,
            Some(Entry { state: EntryState::Held { deadline }, .. }) if deadline <= now
        );
        let was_held_entry = matches!(
            entry,
            Some(Entry {
                state: EntryState::Held { .. },
                ..
            })
        );
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Greater, 0)])
            .and_then([
                first_sorted(&queue, &end, SortOrder::Ascend, 1),
                TxnOp::delete(key.clone(), None),
            ]);
        match self.txn(op, txn).await {
            Ok(resp) => {
                let was_first = kvs(&resp, 0)
                    .first()
                    .is_some_and(|f| f.key() == key.as_slice());
                let held = resp.succeeded() && was_first && !expired_locally;
                // A claim granted by another handle of the same owner still
                // counts; a queued entry never does.
                Ok(held && (was_held_entry || entry.is_none()))
            }
            Err(e) => {
                self.schedule(Deletion::Key { key, rev: 0 });
                Err(e)
            }
        }
    }

    /// Extend (or renew a leadership): only the holder, never resurrecting.
    pub(crate) async fn extend_claim(
        self: &Arc<Self>,
        kind: Kind,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
        op: &'static str,
    ) -> Result<bool> {
        let start = Instant::now();
        let ek = entry_key(kind, name, owner);
        let queue = self.keys.queue(kind, name);
        let end = prefix_end(&queue);
        let (key, rev, lease, old_session) = {
            let mut entries = lock(&self.entries);
            match entries.get(&ek) {
                Some(Entry {
                    state: EntryState::Held { deadline },
                    key,
                    rev,
                    lease,
                    session,
                    ..
                }) => {
                    if *deadline <= start || session.as_ref().is_some_and(|s| s.is_dead()) {
                        if let Some(e) = entries.remove(&ek) {
                            drop(entries);
                            self.schedule(Self::deletion_of(kind, &e));
                        }
                        return Ok(false);
                    }
                    (key.clone(), *rev, *lease, session.clone())
                }
                _ => return Ok(false),
            }
        };
        let session = self.session(secs(ttl), op).await?;
        let ops = if session.id != lease {
            vec![TxnOp::put(
                key.clone(),
                Vec::new(),
                Some(PutOptions::new().with_lease(session.id).with_ignore_value()),
            )]
        } else {
            Vec::new()
        };
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.clone(), CompareOp::Equal, rev),
                Compare::create_revision(queue.clone(), CompareOp::Greater, rev - 1)
                    .with_range(end),
            ])
            .and_then(ops);
        let (resp, ka) = tokio::join!(self.txn(op, txn), session.keepalive(op, self.timeout));
        let resp = resp?;
        if !resp.succeeded() {
            lock(&self.entries).remove(&ek);
            return Ok(false);
        }
        if let Err(e) = ka {
            if session.is_dead() || old_session.as_ref().is_some_and(|s| s.is_dead()) {
                lock(&self.entries).remove(&ek);
                return Ok(false);
            }
            return Err(e);
        }
        let mut entries = lock(&self.entries);
        match entries.get_mut(&ek) {
            Some(e) if e.rev == rev => {
                e.state = EntryState::Held {
                    deadline: start + ttl,
                };
                e.lease = session.id;
                e.lease_ttl = session.ttl;
                e.session = Some(session);
                drop(entries);
                self.reaper.notify_one();
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Delete the holder's key, whoever it is.
    pub(crate) async fn force_release_claim(
        &self,
        kind: Kind,
        name: &str,
        op: &'static str,
    ) -> Result<bool> {
        let queue = self.keys.queue(kind, name);
        let end = prefix_end(&queue);
        for _ in 0..5 {
            let g = self
                .get(
                    op,
                    queue.clone(),
                    Some(
                        GetOptions::new()
                            .with_range(end.clone())
                            .with_sort(SortTarget::Create, SortOrder::Ascend)
                            .with_limit(1),
                    ),
                )
                .await?;
            let Some(first) = g.into_iter().next() else {
                return Ok(false);
            };
            let txn = Txn::new()
                .when([Compare::create_revision(
                    first.key().to_vec(),
                    CompareOp::Equal,
                    first.create_revision(),
                )])
                .and_then([TxnOp::delete(first.key().to_vec(), None)]);
            if self.txn(op, txn).await?.succeeded() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The first key of a claim's queue (the holder / leader).
    pub(crate) async fn head(
        &self,
        kind: Kind,
        name: &str,
        op: &'static str,
    ) -> Result<Option<KeyValue>> {
        let queue = self.keys.queue(kind, name);
        let end = prefix_end(&queue);
        let g = self
            .get(
                op,
                queue,
                Some(
                    GetOptions::new()
                        .with_range(end)
                        .with_sort(SortTarget::Create, SortOrder::Ascend)
                        .with_limit(1),
                ),
            )
            .await?;
        Ok(g.into_iter().next())
    }

    // ---------------------------------------------------------------
    // Shared watches (elections, barriers).
    // ---------------------------------------------------------------

    /// Register a local waiter on `wake`, making sure a watch on `key`
    /// (`end`: range end) is established before returning.
    pub(crate) async fn subscribe_watch(
        self: &Arc<Self>,
        wake: String,
        key: Vec<u8>,
        end: Option<Vec<u8>>,
        kind: WatchKind,
    ) -> Result<Waiter> {
        let (waiter, mut ready) = {
            let mut w = lock(&self.watchers);
            let waiter = self.wakeups.subscribe(&wake);
            let slot = w.entry(wake.clone()).or_insert_with(|| {
                let (tx, rx) = watch::channel(false);
                let task = tokio::spawn(shared_watch_task(
                    self.clone(),
                    wake.clone(),
                    key,
                    end,
                    kind,
                    tx,
                ));
                WatchSlot {
                    ready: rx,
                    _task: AbortOnDrop(task),
                }
            });
            (waiter, slot.ready.clone())
        };
        // Best effort: if the watch is slow to start, polling covers it.
        let _ = tokio::time::timeout(self.timeout, ready.wait_for(|r| *r)).await;
        Ok(waiter)
    }

    /// Stop a shared watch nobody waits on. Returns whether it was retired.
    fn retire_watch(&self, wake: &str) -> Option<WatchSlot> {
        let mut w = lock(&self.watchers);
        if self.wakeups.has_waiters(wake) {
            return None;
        }
        w.remove(wake)
    }
}

async fn shared_watch_task(
    shared: Arc<Shared>,
    wake: String,
    key: Vec<u8>,
    end: Option<Vec<u8>>,
    kind: WatchKind,
    ready: watch::Sender<bool>,
) {
    let mut shutdown = shared.shutdown.clone();
    let mut start_rev = 0i64;
    let mut last_gen: Option<u64> = None;
    let mut backoff = Duration::from_millis(50);
    let mut check = tokio::time::interval(Duration::from_secs(1));
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let mut opts = WatchOptions::new();
        if let Some(e) = &end {
            opts = opts.with_range(e.clone());
        }
        if start_rev > 0 {
            opts = opts.with_start_revision(start_rev);
        }
        let mut wc = shared.client.watch_client();
        let opened = tokio::select! {
            _ = shutdown.changed() => return,
            r = tokio::time::timeout(shared.timeout, wc.watch(key.clone(), Some(opts))) => r,
        };
        if let Ok(Ok(mut stream)) = opened {
            loop {
                let msg = tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = check.tick() => {
                        if let Some(slot) = shared.retire_watch(&wake) {
                            drop(slot);
                            return;
                        }
                        continue;
                    }
                    m = stream.message() => m,
                };
                match msg {
                    Ok(Some(resp)) => {
                        if resp.created() {
                            if let Some(h) = resp.header() {
                                start_rev = h.revision() + 1;
                            }
                            ready.send_replace(true);
                            backoff = Duration::from_millis(50);
                        }
                        if resp.canceled() {
                            if resp.compact_revision() > 0 {
                                start_rev = 0;
                            }
                            shared.wakeups.notify_all(&wake);
                            break;
                        }
                        let mut wake_all = false;
                        for ev in resp.events() {
                            if let Some(kv) = ev.kv() {
                                start_rev = start_rev.max(kv.mod_revision() + 1);
                                match kind {
                                    WatchKind::AnyChange => wake_all = true,
                                    WatchKind::BarrierGeneration => {
                                        let g = if ev.event_type() == EventType::Delete {
                                            None
                                        } else {
                                            crate::barrier::generation_of(kv.value())
                                        };
                                        if g.is_none() || g != last_gen {
                                            wake_all = true;
                                        }
                                        last_gen = g;
                                    }
                                }
                            }
                        }
                        if wake_all {
                            shared.wakeups.notify_all(&wake);
                        }
                    }
                    _ => break,
                }
            }
        }
        // The stream broke: wake everybody to re-check, then resume from
        // the last revision seen.
        shared.wakeups.notify_all(&wake);
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(1));
        if let Some(slot) = shared.retire_watch(&wake) {
            drop(slot);
            return;
        }
    }
}

async fn reaper_task(shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.clone();
    loop {
        let next = tokio::select! {
            _ = shutdown.changed() => return,
            n = shared.reap_once() => n,
        };
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = sleep_until(next) => {}
            _ = shared.reaper.notified() => {}
        }
    }
}

/// `DeleteOptions` with the previous key-value returned.
pub(crate) fn delete_prev() -> DeleteOptions {
    DeleteOptions::new().with_prev_key()
}
