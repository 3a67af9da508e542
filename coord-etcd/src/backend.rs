//! The backend object: the connection, calls bounded by the call timeout,
//! and the etcd lease helpers every claim uses.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use coord_core::util::{Kind, bounded};
use coord_core::wake::Wakeups;
use coord_core::{Capabilities, Coord, Error, FencingDurability, Result};
use etcd_client::{
    Client, ConnectOptions, GetOptions, KeyValue, KvClient, Txn, TxnOpResponse, TxnResponse,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::sleep;

use crate::claim::entries::{Entry, EntryKey};
use crate::client::keys::{BACKEND, Keys, map_err, not_sent};
use crate::client::pool::Pool;
use crate::client::watch::WatchSlot;
use crate::limiter::LimiterRequest;
use crate::options::EtcdOptions;

/// The etcd backend: implements every coord-core trait
/// ([`Lock`](coord_core::Lock), [`Lease`](coord_core::Lease),
/// [`FencingSource`](coord_core::FencingSource),
/// [`Election`](coord_core::Election), [`Barrier`](coord_core::Barrier),
/// [`Limiter`](coord_core::Limiter), [`Semaphore`](coord_core::Semaphore),
/// [`Queue`](coord_core::Queue)).
///
/// Most users want [`connect`](crate::connect), which wraps it in a
/// [`Coord`]. Background tasks (keepalives of queued waiters, watches,
/// revocations retried after a failure) end when the last handle is
/// dropped; the server then expires the client's leases by itself.
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

/// A spawned task aborted when this handle is dropped.
pub(crate) struct AbortOnDrop(pub(crate) JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(crate) struct Shared {
    pub(crate) client: Client,
    /// `client`'s KV service alone: a call clones what it uses, and a
    /// whole `Client` is nine gRPC service handles (its clone and drop
    /// were a tenth of a lock cycle's client CPU).
    kv: KvClient,
    pub(crate) keys: Keys,
    pub(crate) timeout: Duration,
    pub(crate) caps: Capabilities,
    pub(crate) wakeups: Wakeups,
    endpoints: Vec<String>,
    prefix: String,
    /// This client's claims (held, queued, or with an attempt in flight).
    pub(crate) entries: Mutex<HashMap<EntryKey, Entry>>,
    /// The size of `entries` at which it is next swept.
    pub(crate) prune_at: AtomicUsize,
    /// One call at a time per claim (kind, name, owner) and per
    /// semaphore owner: see [`Shared::one_call`](crate::claim::entries).
    pub(crate) claim_calls:
        Mutex<HashMap<crate::claim::entries::Turn, std::sync::Weak<tokio::sync::Mutex<()>>>>,
    /// Owners whose one attempt was refused without writing anything: their
    /// next attempt (a waiter's, after subscribing) queues.
    pub(crate) tried: Mutex<HashMap<EntryKey, tokio::time::Instant>>,
    pub(crate) watchers: Mutex<HashMap<String, WatchSlot>>,
    /// Pending limiter checks per key, combined into one compare-and-swap.
    pub(crate) limiter_queue: Mutex<HashMap<Vec<u8>, Vec<LimiterRequest>>>,
    /// The lease limiter state is attached to, per retention (seconds):
    /// (lease id, the earliest instant the server may expire it).
    pub(crate) limiter_leases: Mutex<HashMap<u64, (i64, tokio::time::Instant)>>,
    /// This client's semaphore grants and queue places.
    pub(crate) sems: Mutex<HashMap<crate::semaphore::SemKey, crate::semaphore::SemLocal>>,
    /// Leases of claims that ended cleanly, for the next claims.
    pub(crate) pool: Mutex<Pool>,
    /// This client's work queue state (dedup leases, hints).
    pub(crate) wq: crate::work_queue::Local,
    pub(crate) shutdown: watch::Receiver<()>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whole seconds, rounded up, at least 1.
pub(crate) fn secs(d: Duration) -> u64 {
    (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
}

/// The wake-up key of every local waiter of a name.
pub(crate) fn wake_key(kind: Kind, name: &str) -> String {
    format!("{}\u{0}{}", kind.as_str(), name)
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

/// etcd 3.4 can answer a keepalive with "lease not found" for a lease it
/// granted a moment ago, when the leader has not applied the grant yet
/// (etcd-io/etcd#13675; 3.5 waits for the apply). Seen here: extends right
/// after a grant failed so on a loaded 3-node cluster. A lease is taken
/// for gone only once it was not found again after each of these delays
/// (ms); a truly gone lease is reported 350 ms later, nothing else changes
/// (a late "gone" never extends a claim's local validity).
pub(crate) const NOT_FOUND_RETRIES: [u64; 3] = [50, 100, 200];

/// Whether a mapped error says the lease a request used is gone.
pub(crate) fn is_lease_not_found(e: &Error) -> bool {
    matches!(e, Error::Store { message, .. } if message.contains("lease not found"))
}

impl EtcdBackend {
    /// Connect to the cluster named by `opts`: authenticate if a user is
    /// given, then grant (and revoke) one lease, which tells the server's
    /// minimum lease TTL (reported as [`Capabilities::min_ttl`]).
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
            co = co.with_tls(tls_options(&opts)?);
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
        // Asking for a 1 s lease tells the server's minimum. The channel
        // balances over every endpoint and connects to each lazily, so the
        // first call can land on a member that is down (refused), or on a
        // cluster between leaders: while the connect deadline allows, it
        // is tried again (the probe's lease is short and revoked, so a
        // retry of one that was applied leaves nothing for long).
        let grant = bounded(BACKEND, "connect", limit, async {
            let mut tries = 0u32;
            loop {
                match client.lease_client().grant(1, None).await {
                    Ok(g) => return Ok(g),
                    Err(e) => {
                        let e = map_err("connect", e);
                        if tries >= 40 || !matches!(e, Error::Unavailable { .. }) {
                            return Err(e);
                        }
                        tries += 1;
                        tracing::debug!(error = %e, "etcd connect probe failed; trying again");
                        tokio::time::sleep(Duration::from_millis(10 * u64::from(tries.min(10))))
                            .await;
                    }
                }
            }
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
        // One node or a cluster: a grant is on a majority before it is
        // acknowledged, so a new leader has it.
        caps.deployment = "raft";
        caps.exclusive_across_failover = true;
        let (tx, rx) = watch::channel(());
        let shared = Arc::new(Shared {
            kv: client.kv_client(),
            client,
            keys: Keys::new(&opts.prefix),
            timeout: opts.call_timeout,
            caps,
            wakeups: Wakeups::new(),
            endpoints: opts.hosts.clone(),
            prefix: opts.prefix.clone(),
            entries: Mutex::new(HashMap::new()),
            prune_at: AtomicUsize::new(crate::claim::entries::PRUNE_AT),
            claim_calls: Mutex::new(HashMap::new()),
            tried: Mutex::new(HashMap::new()),
            watchers: Mutex::new(HashMap::new()),
            limiter_queue: Mutex::new(HashMap::new()),
            limiter_leases: Mutex::new(HashMap::new()),
            sems: Mutex::new(HashMap::new()),
            pool: Mutex::new(Pool::default()),
            wq: crate::work_queue::Local::default(),
            shutdown: rx,
        });
        shared.revoke_later(grant.id());
        Ok(Arc::new(EtcdBackend {
            shared,
            _shutdown: tx,
        }))
    }

    /// A [`Coord`] handle over this backend (every primitive, FIFO
    /// semaphores and work queues included).
    pub fn coord(self: &Arc<Self>) -> Coord {
        Coord::from_backend(self.clone())
            .with_semaphores(self.clone())
            .with_queues(self.clone())
    }

    /// What this backend promises.
    pub fn capabilities(&self) -> &Capabilities {
        &self.shared.caps
    }

    /// The etcd lease ids of this client's claims (held locks, leases and
    /// leaderships, and queued lock waiters): one lease per claim, for
    /// tests and operators (`etcdctl lease timetolive <id>`).
    pub fn claim_leases(&self) -> Vec<i64> {
        lock(&self.shared.entries)
            .values()
            .map(|e| e.lease)
            .collect()
    }
}

fn tls_options(opts: &EtcdOptions) -> Result<etcd_client::TlsOptions> {
    let mut tls = etcd_client::TlsOptions::new();
    match &opts.ca_file {
        Some(ca) => {
            let pem = std::fs::read(ca)
                .map_err(|e| Error::Config(format!("cannot read CA file {}: {e}", ca.display())))?;
            tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
        }
        None => tls = tls.with_native_roots(),
    }
    if let Some((cert, key)) = &opts.identity {
        let c = std::fs::read(cert).map_err(|e| {
            Error::Config(format!("cannot read certificate {}: {e}", cert.display()))
        })?;
        let k = std::fs::read(key)
            .map_err(|e| Error::Config(format!("cannot read key file {}: {e}", key.display())))?;
        tls = tls.identity(etcd_client::Identity::from_pem(c, k));
    }
    if let Some(d) = &opts.domain {
        tls = tls.domain_name(d.clone());
    }
    Ok(tls)
}

impl Shared {
    /// Run one etcd call with the call timeout, mapping its error. A call
    /// that was never sent (the connection to a member was refused, or the
    /// member has no leader) is retried on another member within the same
    /// time limit: that is always safe.
    pub(crate) async fn call<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.retrying(op, || self.client.clone(), f).await
    }

    /// [`call`](Self::call) on the KV service only (transactions, reads).
    pub(crate) async fn call_kv<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T>
    where
        F: FnMut(KvClient) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.retrying(op, || self.kv.clone(), f).await
    }

    /// Run `f` on a fresh handle from `handle` within the call timeout,
    /// again while the request was not sent (the channel reconnecting).
    async fn retrying<C, T, F, Fut>(
        &self,
        op: &'static str,
        handle: impl Fn() -> C,
        mut f: F,
    ) -> Result<T>
    where
        F: FnMut(C) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        bounded(BACKEND, op, self.timeout, async {
            let mut tries = 0u32;
            loop {
                match f(handle()).await {
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
        self.call_kv(op, |mut c| {
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
        self.call_kv(op, |mut c| {
            let (k, o) = (key.clone(), opts.clone());
            async move { c.get(k, o).await }
        })
        .await
        .map(|mut r| r.take_kvs())
    }

    /// Grant a lease of `ttl` whole seconds: its id. The server expires it
    /// no earlier than `ttl` after this call began.
    pub(crate) async fn grant_lease(&self, ttl: u64, op: &'static str) -> Result<i64> {
        let resp = self
            .call(
                op,
                |mut c| async move { c.lease_grant(ttl as i64, None).await },
            )
            .await?;
        Ok(resp.id())
    }

    /// Refresh lease `id` once: `Ok(true)` once the server answered with a
    /// positive TTL (the lease then lives its full TTL from the start of
    /// this call), `Ok(false)` if the server no longer has it.
    pub(crate) async fn keepalive_once(&self, id: i64, op: &'static str) -> Result<bool> {
        let mut again = NOT_FOUND_RETRIES.iter();
        loop {
            match self
                .call(op, |c| async move { c.lease_client().keep_alive(id).await })
                .await
            {
                Ok(_) => return Ok(true),
                Err(e) if is_lease_not_found(&e) => match again.next() {
                    Some(ms) => sleep(Duration::from_millis(*ms)).await,
                    None => return Ok(false),
                },
                Err(e) => return Err(e),
            }
        }
    }

    /// Revoke lease `id` (and so every key attached to it): `Ok(false)` if
    /// it was already gone.
    pub(crate) async fn revoke(&self, id: i64, op: &'static str) -> Result<bool> {
        match self
            .call(op, |mut c| async move { c.lease_revoke(id).await })
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_lease_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Revoke lease `id` in the background, retrying a few times; if that
    /// never succeeds, the server expires it at its TTL (nobody renews it).
    pub(crate) fn revoke_later(self: &Arc<Self>, id: i64) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let shared = self.clone();
        rt.spawn(async move {
            let mut shutdown = shared.shutdown.clone();
            for attempt in 0..5u64 {
                if shared.revoke(id, "revoke lease").await.is_ok() {
                    return;
                }
                tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = sleep(Duration::from_millis(200 << attempt)) => {}
                }
            }
            tracing::debug!(lease = id, "revoking a lease failed; it expires at its TTL");
        });
    }
}
