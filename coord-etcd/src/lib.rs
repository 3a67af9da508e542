//! # coord-etcd
//!
//! The etcd v3 backend of coord: every primitive (locks, leases, fencing
//! tokens, elections, barriers, rate limiters, FIFO semaphores, work queues) on
//! etcd's leases, transactions, revisions and watches.
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
//! How it maps onto etcd (a lease per claim, queues of waiters by create
//! revision, fencing by revision, watches) and what an idle name costs:
//! `docs/etcd.md` in the repository. etcd needs auto-compaction for its
//! revisions (for example
//! `--auto-compaction-mode=periodic --auto-compaction-retention=1h`).
#![deny(missing_docs)]

mod backend;
mod barrier;
mod claim;
mod client;
mod inspect;
mod limiter;
mod options;
mod semaphore;
mod work_queue;

use std::time::Duration;

use coord_core::inspect::ClaimRecord;
use coord_core::util::Kind;
use coord_core::wake::Waiter;
use coord_core::{
    Arrival, Attempt, Capabilities, Coord, Decision, Error, FencingToken, LeaderInfo, OwnerToken,
    Quota, Result, async_trait,
};

pub use backend::EtcdBackend;
pub use options::{DEFAULT_CALL_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, EtcdOptions};

use backend::wake_key;
use claim::attempt::ClaimSpec;
use client::keys::{self, prefix_end};
use client::watch::WatchKind;

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

    /// As `try_acquire`; the claim's key is written with `metadata` in its
    /// value (after the owner's hex and a space), so it ends with the key.
    /// An owner whose key exists already keeps it as it is.
    async fn try_acquire_with_metadata(
        &self,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
        metadata: &[u8],
    ) -> Result<Attempt> {
        let spec = ClaimSpec {
            kind: Kind::Lock,
            value: metadata,
            fair: true,
            op: "lock try_acquire",
        };
        self.shared.try_claim(spec, name, owner, ttl).await
    }

    async fn inspect(&self, name: &str) -> Result<ClaimRecord> {
        self.shared.lock_inspect(name).await
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
        Ok(self.shared.subscribe_lock(Kind::Lock, name))
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
                candidate: String::from_utf8_lossy(
                    keys::split_lease_value(kv.value()).1.unwrap_or_default(),
                )
                .into_owned(),
                term: FencingToken(kv.create_revision() as u64),
            }))
    }

    async fn inspect(&self, name: &str) -> Result<Option<coord_core::inspect::LeaderRecord>> {
        self.shared.election_inspect(name).await
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
        // One key for every resource (the revision is one counter for the
        // whole cluster), so fencing leaves no state per resource.
        let _ = resource;
        let key = self.shared.keys.single(Kind::Fence, "");
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

    async fn withdraw(
        &self,
        name: &str,
        generation: u64,
        participant: &str,
        arrival: &OwnerToken,
    ) -> Result<bool> {
        self.shared
            .barrier_withdraw(name, generation, participant, arrival)
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

#[cfg(test)]
mod tests {
    #[test]
    fn backend_is_send_sync() {
        fn check<T: Send + Sync + 'static>() {}
        check::<super::EtcdBackend>();
        check::<super::EtcdOptions>();
    }
}
