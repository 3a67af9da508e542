//! # coord-etcd
//!
//! The etcd v3 backend of coord: every primitive (locks, leases, fencing
//! tokens, elections, barriers, rate limiters) on etcd's leases,
//! transactions, revisions and watches.
//!
//! ```no_run
//! # async fn demo() -> coord_core::Result<()> {
//! // All members of the cluster; `etcds://` for TLS, `user:password@` to log in.
//! let coord = coord_etcd::connect("etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379").await?;
//! assert_eq!(coord.capabilities().backend, "etcd");
//! assert!(coord.capabilities().fair); // FIFO lock queue
//! let lock = coord.raw_lock()?; // or the guards of coord-core's `Locks`
//! # let _ = lock;
//! # Ok(()) }
//! ```
//!
//! ## How it maps onto etcd
//!
//! - **Session leases.** Each client keeps one etcd lease per TTL (granted
//!   once, kept alive by one task over one keepalive stream) and attaches
//!   to it every lock and leadership key it writes, as etcd's own
//!   `concurrency.Session` does: an uncontended acquire + release on a warm
//!   session is two transactions and one keepalive, and no lease grant.
//!   The TTL of a claim is enforced by the client that holds it: when it
//!   runs out without an `extend`, the client deletes the key (exactly at
//!   the TTL); if the client dies, the server expires the session lease
//!   after at most the TTL. Every grant and extend refreshes the session
//!   lease with a keepalive sent after the call began, so the server keeps
//!   the key at least as long as the validity coord-core computes. If
//!   keepalives fail until the lease's TTL is over, the session is
//!   presumed lost: `extend` answers `false` and the guard's lost signal
//!   fires.
//! - **Locks** are a FIFO queue, one key per waiter:
//!   `<prefix>lock/<name>/<owner hex>`, ordered by create revision; the
//!   first key holds the lock and its create revision is the fencing token.
//!   A waiter (a task that subscribed before attempting, as coord-core's
//!   wait loop does) keeps its key queued and watches only its
//!   predecessor's deletion, so one release wakes exactly one waiter. A
//!   one-shot `try_acquire` (nobody in this client subscribed to the name)
//!   writes nothing unless the queue is empty, in one transaction. A queued
//!   waiter whose session lease expired, or whose key vanished, gets an
//!   error on its next attempt, never a grant; `release` deletes the
//!   owner's key whether it holds or waits.
//! - **Elections**: `<prefix>election/<name>/<owner hex>`, created only when
//!   no leader key exists; the term is its create revision; watchers of the
//!   prefix wake every local candidate and observer.
//! - **Leases** (named): `<prefix>lease/<name>` attached to an etcd lease of
//!   their own (`remaining` is what the server says; `revoke` ends it at
//!   once).
//! - **Fencing**: `FencingSource::next` is the revision of a put: one
//!   counter for the whole cluster, durable across restarts.
//! - **Barriers**: one key per barrier (party count, generation,
//!   participants), updated by compare-and-swap on its mod revision;
//!   waiters are woken by a watch when the generation changes.
//! - **Rate limiters**: one key per key and algorithm, updated by
//!   compare-and-swap on its mod revision, and attached to a session lease
//!   that outlives the window. etcd has no clock to read, so windows are
//!   measured on each **client's clock** (`Capabilities::server_clock` is
//!   false). Clock skew between clients shifts their windows: a client
//!   whose clock runs ahead by `d` sees old requests fall out of the window
//!   `d` early (up to `d`'s worth of extra admissions for the sliding and
//!   fixed windows, `d / (window / limit)` extra cells for GCRA); one that
//!   runs behind is stricter. Keep clocks synchronised (NTP) to well under
//!   the window.
//!
//! Every call is bounded by the call timeout (default 5 s) and fails with
//! [`Error::Unavailable`] when it fires.
//! Passwords never appear in `Debug`, `Display`, errors or logs.
#![deny(missing_docs)]

mod backend;
mod barrier;
mod keys;
mod options;
mod session;

use std::time::Duration;

use coord_core::util::Kind;
use coord_core::wake::Waiter;
use coord_core::{
    Arrival, Attempt, Capabilities, Coord, Decision, Error, FencingToken, LeaderInfo, OwnerToken,
    Quota, Result, async_trait,
};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use tokio::time::Instant;

pub use backend::EtcdBackend;
pub use options::{DEFAULT_CALL_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, EtcdOptions};

use backend::{
    ClaimSpec, Deletion, Entry, EntryState, WatchKind, delete_prev, header_rev, kvs, lock, secs,
    wake_key,
};
use keys::prefix_end;

/// Connect to the etcd cluster named by `url` and return a [`Coord`] with
/// every primitive. See [`EtcdOptions::parse`] for the URL format:
/// `etcd://[user:password@]host1:2379,host2:2379,host3:2379[?prefix=..&timeout_ms=..]`,
/// `etcds://` for TLS.
pub async fn connect(url: &str) -> Result<Coord> {
    connect_with(EtcdOptions::parse(url)?).await
}

/// Connect with explicit options.
pub async fn connect_with(options: EtcdOptions) -> Result<Coord> {
    Ok(EtcdBackend::connect(options).await?.coord())
}

#[async_trait]
impl coord_core::Lock for EtcdBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.shared.caps
    }

    async fn try_acquire(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<Attempt> {
        let spec = ClaimSpec {
            kind: Kind::Lock,
            value: b"",
            fair: true,
            op: "lock try_acquire",
        };
        self.shared.try_claim(spec, name, owner, ttl).await
    }

    async fn release(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        self.shared
            .release_claim(Kind::Lock, name, owner, "lock release")
            .await
    }

    async fn extend(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        self.shared
            .extend_claim(Kind::Lock, name, owner, ttl, "lock extend")
            .await
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        self.shared
            .force_release_claim(Kind::Lock, name, "lock force_release")
            .await
    }

    async fn subscribe(&self, name: &str) -> Result<Waiter> {
        // Wake-ups come from the watch on each waiter's predecessor, set up
        // by the attempt that queues it.
        Ok(self.shared.wakeups.subscribe(&wake_key(Kind::Lock, name)))
    }
}

#[async_trait]
impl coord_core::Election for EtcdBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.shared.caps
    }

    async fn try_campaign(
        &self,
        name: &str,
        candidate: &str,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Attempt> {
        let spec = ClaimSpec {
            kind: Kind::Election,
            value: candidate.as_bytes(),
            fair: false,
            op: "election campaign",
        };
        self.shared.try_claim(spec, name, owner, ttl).await
    }

    async fn renew(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        self.shared
            .extend_claim(Kind::Election, name, owner, ttl, "election renew")
            .await
    }

    async fn resign(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        self.shared
            .release_claim(Kind::Election, name, owner, "election resign")
            .await
    }

    async fn leader(&self, name: &str) -> Result<Option<LeaderInfo>> {
        Ok(self
            .shared
            .head(Kind::Election, name, "election leader")
            .await?
            .map(|kv| LeaderInfo {
                candidate: String::from_utf8_lossy(kv.value()).into_owned(),
                term: FencingToken(kv.create_revision() as u64),
            }))
    }

    async fn subscribe(&self, name: &str) -> Result<Waiter> {
        let queue = self.shared.keys.queue(Kind::Election, name);
        let end = prefix_end(&queue);
        self.shared
            .subscribe_watch(
                wake_key(Kind::Election, name),
                queue,
                Some(end),
                WatchKind::AnyChange,
            )
            .await
    }
}

#[async_trait]
impl coord_core::FencingSource for EtcdBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.shared.caps
    }

    async fn next(&self, resource: &str) -> Result<FencingToken> {
        let key = self.shared.keys.single(Kind::Fence, resource);
        let resp = self
            .shared
            .call("fencing next", |mut c| {
                let k = key.clone();
                async move { c.put(k, Vec::new(), None).await }
            })
            .await?;
        let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
        if rev <= 0 {
            return Err(Error::Store {
                backend: keys::BACKEND,
                operation: "fencing next",
                message: "the put's reply carried no revision".into(),
            });
        }
        Ok(FencingToken(rev as u64))
    }
}

#[async_trait]
impl coord_core::Barrier for EtcdBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.shared.caps
    }

    async fn arrive(
        &self,
        name: &str,
        parties: u32,
        participant: &str,
        arrival: &OwnerToken,
    ) -> Result<Arrival> {
        self.shared
            .barrier_arrive(name, parties, participant, arrival)
            .await
    }

    async fn is_complete(&self, name: &str, generation: u64) -> Result<bool> {
        self.shared.barrier_is_complete(name, generation).await
    }

    async fn withdraw(&self, name: &str, generation: u64, participant: &str) -> Result<bool> {
        self.shared
            .barrier_withdraw(name, generation, participant)
            .await
    }

    async fn subscribe(&self, name: &str) -> Result<Waiter> {
        let key = self.shared.keys.single(Kind::Barrier, name);
        self.shared
            .subscribe_watch(
                wake_key(Kind::Barrier, name),
                key,
                None,
                WatchKind::BarrierGeneration,
            )
            .await
    }
}

#[async_trait]
impl coord_core::Limiter for EtcdBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.shared.caps
    }

    async fn check(&self, key: &str, quota: &Quota, cost: u64) -> Result<Decision> {
        self.shared.limiter_check(key, quota, cost).await
    }
}

impl EtcdBackend {
    /// Refresh lease `id` once: `Ok(false)` if the server no longer has it.
    async fn keepalive_once(&self, id: i64, op: &'static str) -> Result<bool> {
        let shared = &self.shared;
        match coord_core::util::bounded(keys::BACKEND, op, shared.timeout, async {
            Ok(shared.client.lease_client().keep_alive(id).await)
        })
        .await?
        {
            Ok(_) => Ok(true),
            Err(e) if keys::is_lease_not_found(&e) => Ok(false),
            Err(e) => Err(keys::map_err(op, e)),
        }
    }

    async fn grant_lease(&self, ttl: Duration, op: &'static str) -> Result<i64> {
        let resp = self
            .shared
            .call(op, |mut c| async move {
                c.lease_grant(secs(ttl) as i64, None).await
            })
            .await?;
        Ok(resp.id())
    }

    fn revoke_later(&self, id: i64) {
        self.shared.schedule(Deletion::Lease(id));
    }
}

#[async_trait]
impl coord_core::Lease for EtcdBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.shared.caps
    }

    async fn grant(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<Attempt> {
        let op = "lease grant";
        let start = Instant::now();
        let shared = &self.shared;
        let ek = (Kind::Lease, Box::<str>::from(name), *owner.as_bytes());
        let live = lock(&shared.entries).get(&ek).and_then(|e| match e.state {
            EntryState::Held { deadline } if deadline > start => Some(e.rev),
            _ => None,
        });
        if let Some(rev) = live {
            if coord_core::Lease::renew(self, name, owner, ttl).await? {
                return Ok(Attempt::Granted(FencingToken(rev as u64)));
            }
        }
        lock(&shared.entries).remove(&ek);
        let key = shared.keys.single(Kind::Lease, name);
        let hex = owner.to_hex();
        let existing = shared.get(op, key.clone(), None).await?.into_iter().next();
        let kv = match existing {
            Some(kv) => kv,
            None => {
                let id = self.grant_lease(ttl, op).await?;
                let txn = Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(
                        key.clone(),
                        hex.clone(),
                        Some(PutOptions::new().with_lease(id)),
                    )])
                    .or_else([TxnOp::get(key.clone(), None)]);
                let resp = match shared.txn(op, txn).await {
                    Ok(r) => r,
                    Err(e) => {
                        self.revoke_later(id);
                        return Err(e);
                    }
                };
                if resp.succeeded() {
                    let rev = header_rev(&resp);
                    lock(&shared.entries).insert(
                        ek,
                        Entry {
                            key,
                            rev,
                            lease: id,
                            lease_ttl: secs(ttl),
                            session: None,
                            state: EntryState::Held {
                                deadline: start + ttl,
                            },
                        },
                    );
                    return Ok(Attempt::Granted(FencingToken(rev as u64)));
                }
                self.revoke_later(id);
                match kvs(&resp, 0).into_iter().next() {
                    Some(kv) => kv,
                    None => return Ok(Attempt::Held { expires_in: None }),
                }
            }
        };
        if kv.value() == hex.as_bytes() {
            // Ours already (a retry after a lost reply): adopt and refresh.
            if self.keepalive_once(kv.lease(), op).await? {
                lock(&shared.entries).insert(
                    ek,
                    Entry {
                        key,
                        rev: kv.create_revision(),
                        lease: kv.lease(),
                        lease_ttl: secs(ttl),
                        session: None,
                        state: EntryState::Held {
                            deadline: start + ttl,
                        },
                    },
                );
                return Ok(Attempt::Granted(FencingToken(kv.create_revision() as u64)));
            }
            return Ok(Attempt::Held { expires_in: None });
        }
        let ttl_left = shared
            .call(op, |mut c| {
                let id = kv.lease();
                async move { c.lease_time_to_live(id, None).await }
            })
            .await
            .ok()
            .and_then(|r| u64::try_from(r.ttl()).ok())
            .map(Duration::from_secs);
        Ok(Attempt::Held {
            expires_in: ttl_left,
        })
    }

    async fn renew(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        let op = "lease renew";
        let start = Instant::now();
        let shared = &self.shared;
        let ek = (Kind::Lease, Box::<str>::from(name), *owner.as_bytes());
        let (key, rev, lease, lease_ttl) = {
            let mut entries = lock(&shared.entries);
            match entries.get(&ek) {
                Some(e) => match e.state {
                    EntryState::Held { deadline } if deadline > start => {
                        (e.key.clone(), e.rev, e.lease, e.lease_ttl)
                    }
                    _ => {
                        let lease = e.lease;
                        entries.remove(&ek);
                        drop(entries);
                        self.revoke_later(lease);
                        return Ok(false);
                    }
                },
                None => return Ok(false),
            }
        };
        let check = Txn::new().when([Compare::create_revision(key.clone(), CompareOp::Equal, rev)]);
        let new_lease = if secs(ttl) == lease_ttl {
            let (resp, alive) = tokio::join!(shared.txn(op, check), self.keepalive_once(lease, op));
            if !resp?.succeeded() || !alive? {
                lock(&shared.entries).remove(&ek);
                return Ok(false);
            }
            lease
        } else {
            // Another TTL: move the key to a new lease, keeping its create
            // revision (the fencing token), after checking the old lease
            // still lives (so an expired lease is never resurrected).
            let (alive, new) =
                tokio::join!(self.keepalive_once(lease, op), self.grant_lease(ttl, op));
            let new = new?;
            if !alive.inspect_err(|_| self.revoke_later(new))? {
                self.revoke_later(new);
                lock(&shared.entries).remove(&ek);
                return Ok(false);
            }
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, rev)])
                .and_then([TxnOp::put(
                    key.clone(),
                    Vec::new(),
                    Some(PutOptions::new().with_lease(new).with_ignore_value()),
                )]);
            let resp = shared
                .txn(op, txn)
                .await
                .inspect_err(|_| self.revoke_later(new))?;
            if !resp.succeeded() {
                self.revoke_later(new);
                lock(&shared.entries).remove(&ek);
                return Ok(false);
            }
            self.revoke_later(lease);
            new
        };
        let mut entries = lock(&shared.entries);
        if let Some(e) = entries.get_mut(&ek) {
            e.lease = new_lease;
            e.lease_ttl = secs(ttl);
            e.state = EntryState::Held {
                deadline: start + ttl,
            };
        }
        Ok(true)
    }

    async fn revoke(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        let op = "lease revoke";
        let now = Instant::now();
        let shared = &self.shared;
        let ek = (Kind::Lease, Box::<str>::from(name), *owner.as_bytes());
        let entry = lock(&shared.entries).remove(&ek);
        let expired = matches!(
            entry,
            Some(Entry { state: EntryState::Held { deadline }, .. }) if deadline <= now
        );
        let key = shared.keys.single(Kind::Lease, name);
        let txn = Txn::new()
            .when([Compare::value(
                key.clone(),
                CompareOp::Equal,
                owner.to_hex(),
            )])
            .and_then([TxnOp::delete(key.clone(), Some(delete_prev()))]);
        let resp = match shared.txn(op, txn).await {
            Ok(r) => r,
            Err(e) => {
                if let Some(en) = entry {
                    self.revoke_later(en.lease);
                }
                return Err(e);
            }
        };
        if resp.succeeded() {
            if let Some(kv) = kvs(&resp, 0).into_iter().next() {
                if kv.lease() != 0 {
                    self.revoke_later(kv.lease());
                }
            }
        }
        Ok(resp.succeeded() && !expired)
    }

    async fn remaining(&self, name: &str) -> Result<Option<Duration>> {
        let op = "lease remaining";
        let shared = &self.shared;
        let key = shared.keys.single(Kind::Lease, name);
        let Some(kv) = shared.get(op, key, None).await?.into_iter().next() else {
            return Ok(None);
        };
        // Held by this client: its own deadline is exact.
        if let Some(owner) = std::str::from_utf8(kv.value())
            .ok()
            .and_then(OwnerToken::from_hex)
        {
            let ek = (Kind::Lease, Box::<str>::from(name), *owner.as_bytes());
            if let Some(e) = lock(&shared.entries).get(&ek) {
                if e.rev == kv.create_revision() {
                    if let EntryState::Held { deadline } = e.state {
                        let left = deadline.saturating_duration_since(Instant::now());
                        return Ok((!left.is_zero()).then_some(left));
                    }
                }
            }
        }
        // etcd answers in whole seconds: the lease "will expire in under
        // TTL+1 seconds". Report that bound (never above the granted TTL),
        // so no holder's local validity exceeds what the store says.
        let resp = shared
            .call(op, |mut c| {
                let id = kv.lease();
                async move { c.lease_time_to_live(id, None).await }
            })
            .await?;
        if resp.ttl() < 0 {
            return Ok(None);
        }
        let bound = (resp.ttl() + 1).min(resp.granted_ttl().max(1));
        Ok(Some(Duration::from_secs(bound as u64)))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn backend_is_send_sync() {
        fn check<T: Send + Sync + 'static>() {}
        check::<super::EtcdBackend>();
        check::<super::EtcdOptions>();
    }
}
