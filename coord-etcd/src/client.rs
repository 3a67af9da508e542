//! Everything the primitives share: the etcd calls (bounded by the call
//! timeout, retried while unsent), lease grants, keepalives and
//! revocations, the key layout and error mapping, shared watches, the
//! compare-and-swap loop and the lease pool.

pub(crate) mod cas;
pub(crate) mod connect;
pub(crate) mod keys;
pub(crate) mod pool;
pub(crate) mod turns;
pub(crate) mod watch;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use coord_core::util::{Kind, bounded, send_until_answered};
use coord_core::wake::Wakeups;
use coord_core::{Error, Result};
use etcd_client::{
    Client, GetOptions, GetResponse, KeyValue, KvClient, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse,
};
use tokio::sync::watch as channel;
use tokio::task::JoinHandle;
use tokio::time::sleep;

use keys::{BACKEND, Keys, map_err, not_sent, prefix_end};
use pool::Pool;
use watch::WatchSlot;

/// Entries per page of a range read with values. The largest entry
/// coord writes is a semaphore grant: a key of at most about 700 bytes
/// (a name is at most 512), a value of the owner, counts, its slot list
/// and at most 1 KiB of metadata, so a page is about 2 MiB, plus the
/// slot lists, which together name each slot at most once (at most
/// `MAX_PERMITS` slots of up to 7 digits: 8 MB).
pub(crate) const PAGE: i64 = 1_000;
/// Entries per page of a keys-only range read (keys of at most about
/// 700 bytes: about 7 MiB a page).
pub(crate) const KEYS_PAGE: i64 = 10_000;
/// The largest answer this client decodes (gRPC's default is 4 MiB).
/// Every range read is paged ([`PAGE`], [`KEYS_PAGE`]) or count-only, and
/// a transaction reads at most one page of each of three ranges (a
/// semaphore's grants, waiters and slots: about 2 + 2 + 8 MB of slot
/// lists + 7 MiB of slot keys), so 32 MiB leaves room above the largest
/// answer with the longest names and metadata allowed (and a prefix of a
/// few hundred bytes), while still refusing a runaway answer. etcd-client
/// 0.21's `ConnectOptions` has no such setting: it is set on the KV and
/// watch service handles made from the connected client (`Etcd::new`,
/// `Etcd::watch_client`); the lease calls' answers are small.
pub(crate) const MAX_MESSAGE_BYTES: usize = 32 << 20;

/// The options of one page of the range ending at `end` (keys only, or
/// with values).
pub(crate) fn page_opts(end: &[u8], keys_only: bool) -> GetOptions {
    let o = GetOptions::new().with_range(end.to_vec());
    if keys_only {
        o.with_keys_only().with_limit(KEYS_PAGE)
    } else {
        o.with_limit(PAGE)
    }
}

/// A read of the first page of `[start, end)` in a transaction (the rest
/// is read by [`Etcd::rest_of`] at the transaction's revision).
pub(crate) fn first_page(start: Vec<u8>, end: &[u8], keys_only: bool) -> TxnOp {
    TxnOp::get(start, Some(page_opts(end, keys_only)))
}

/// Whether a read failed because the revision it read at was compacted
/// away meanwhile (a paged read then starts again).
pub(crate) fn is_compacted(e: &Error) -> bool {
    matches!(e, Error::Store { message, .. } if message.contains("compacted"))
}

/// The connection and what every primitive of one backend shares: the
/// key layout, the call timeout, local wake-ups, shared watches and the
/// spare leases.
pub(crate) struct Etcd {
    pub(crate) client: Client,
    /// `client`'s KV service alone: a call clones what it uses, and a
    /// whole `Client` is nine gRPC service handles (its clone and drop
    /// were a tenth of a lock cycle's client CPU).
    kv: KvClient,
    pub(crate) keys: Keys,
    pub(crate) timeout: Duration,
    pub(crate) wakeups: Wakeups,
    /// Shared watches by wake-up key (see [`watch`]).
    pub(crate) watchers: Mutex<HashMap<String, WatchSlot>>,
    /// Leases of claims that ended cleanly, for the next claims.
    pub(crate) pool: Mutex<Pool>,
    /// Changes (closes) when the backend is dropped: background tasks end.
    pub(crate) shutdown: channel::Receiver<()>,
}

/// A spawned task aborted when this handle is dropped.
pub(crate) struct AbortOnDrop(pub(crate) JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
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

impl Etcd {
    /// The shared state over `client`, with keys under `prefix` and calls
    /// bounded by `timeout`; background tasks end when `shutdown` closes.
    pub(crate) fn new(
        client: Client,
        prefix: &str,
        timeout: Duration,
        shutdown: channel::Receiver<()>,
    ) -> Self {
        Etcd {
            kv: client
                .kv_client()
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
            client,
            keys: Keys::new(prefix),
            timeout,
            wakeups: Wakeups::new(),
            watchers: Mutex::new(HashMap::new()),
            pool: Mutex::new(Pool::default()),
            shutdown,
        }
    }

    /// For tests: reads and transactions through `other` (a client of
    /// another member), watches and leases through this one's client.
    #[cfg(test)]
    pub(crate) fn reads_through(mut self, other: &Client) -> Self {
        self.kv = other
            .kv_client()
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        self
    }

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

    /// A watch service handle decoding answers up to
    /// [`MAX_MESSAGE_BYTES`] (one transaction's events come in one
    /// answer).
    pub(crate) fn watch_client(&self) -> etcd_client::WatchClient {
        self.client
            .watch_client()
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// The whole range of `first` (a page read at revision `rev` of a
    /// range ending at `end`): its entries, then those of the next pages,
    /// each read at `rev` from just after the last key so far, so that
    /// together they are one snapshot.
    pub(crate) async fn rest_of(
        &self,
        op: &'static str,
        mut first: GetResponse,
        end: &[u8],
        rev: i64,
        keys_only: bool,
    ) -> Result<Vec<KeyValue>> {
        let mut more = first.more();
        let mut out = first.take_kvs();
        while more {
            let Some(last) = out.last() else { break };
            let mut from = last.key().to_vec();
            from.push(0);
            let opts = page_opts(end, keys_only).with_revision(rev);
            let mut page = self
                .call_kv(op, |mut c| {
                    let (k, o) = (from.clone(), opts.clone());
                    async move { c.get(k, Some(o)).await }
                })
                .await?;
            more = page.more();
            out.extend(page.take_kvs());
        }
        Ok(out)
    }

    /// The whole range `[start, end)` in pages read at one revision (one
    /// snapshot), and that revision; read again if it was compacted away
    /// between pages.
    pub(crate) async fn range_paged(
        &self,
        op: &'static str,
        start: &[u8],
        end: &[u8],
        keys_only: bool,
    ) -> Result<(Vec<KeyValue>, i64)> {
        let mut tries = 0;
        loop {
            let first = self
                .call_kv(op, |mut c| {
                    let (k, o) = (start.to_vec(), page_opts(end, keys_only));
                    async move { c.get(k, Some(o)).await }
                })
                .await?;
            let rev = first.header().map(|h| h.revision()).unwrap_or(0);
            match self.rest_of(op, first, end, rev, keys_only).await {
                Ok(kvs) => return Ok((kvs, rev)),
                Err(e) if is_compacted(&e) && tries < 3 => tries += 1,
                Err(e) => return Err(e),
            }
        }
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

    /// Revoke lease `id` in the background, sent again while etcd does not
    /// answer (`coord_core::util::send_until_answered`: backing off, for
    /// up to ten minutes) or until the client shuts down: a key a late copy
    /// of an attempt wrote on the lease lasts until the revoke lands, so a
    /// revoke that fails on a slow or loaded store is not given up after a
    /// few tries. If it never lands, the server expires the lease at its
    /// TTL (nobody renews it). Until etcd answers the revocation, the
    /// lease is never a spare (`Pool::revoking`): whoever
    /// offers it to the pool meanwhile (say, a release that deleted a key a
    /// dropped call's write left on it), a claim written on it would die
    /// when the revocation lands.
    pub(crate) fn revoke_later(self: &Arc<Self>, id: i64) {
        self.revoke_sent(id);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let shared = self.clone();
        rt.spawn(async move {
            let mut shutdown = shared.shutdown.clone();
            let revoked = tokio::select! {
                _ = shutdown.changed() => return,
                r = send_until_answered(|| shared.revoke(id, "revoke lease")) => r,
            };
            match revoked {
                Ok(_) => shared.revoke_answered(id),
                Err(e) => {
                    tracing::warn!(lease = id, error = %e, "revoking a lease failed; it expires at its TTL");
                }
            }
        });
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
}

/// The error for a stored value that is not in coord's format.
pub(crate) fn corrupt(operation: &'static str, what: &str) -> Error {
    Error::Store {
        backend: BACKEND,
        operation,
        message: format!(
            "the stored {what} state is not in coord's format; was the key written by something else?"
        ),
        source: None,
    }
}

/// Nanoseconds since the Unix epoch on this client's clock.
pub(crate) fn nanos_now() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}
