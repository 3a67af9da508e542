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
//! ## How it maps onto etcd
//!
//! - **A lease per claim.** Every lock, leadership and named-lease key
//!   is attached to an etcd lease of its own whose TTL is the claim's, so
//!   the server enforces every TTL: a key nobody renews expires by itself,
//!   whatever became of the client, and a write applied late (after its
//!   cleanup) fails or dies with its lease. A claim that ends cleanly (its
//!   key deleted by an owner-checked transaction once every write on its
//!   lease was answered) leaves its lease without keys: that lease serves
//!   the next claim of the same TTL, refreshed by a keepalive (on a stream
//!   kept open) sent with the claim's write, unless its last answered
//!   keepalive was sent within a slack (a fortieth of the TTL, half the
//!   drift margin, at most 50 ms) of the claim's start: then the claim
//!   ends, in this client's bookkeeping, where that keepalive says
//!   (giving up at most the slack). So an uncontended acquire + release
//!   is one transaction and one delete (the claim's key is its own, so
//!   the release needs no compare: the deleted key's create revision says
//!   whether the claim was still live; named leases, one key per name,
//!   release with a compare-and-delete transaction), plus one keepalive
//!   message at most once per slack; a first claim of a TTL grants a lease instead. Spare leases are never kept alive
//!   while idle, and are revoked after 5 s unused.
//!   `extend` refreshes the lease with a keepalive sent after the call
//!   began (another TTL moves the key to a new lease, keeping its create
//!   revision), so the server keeps the key at least as long as the
//!   validity coord-core computes.
//! - **Locks** are a FIFO queue, one key per waiter:
//!   `<prefix>lock/<name>/<lease hex>`, ordered by create revision; the
//!   first key holds the lock and its create revision is the fencing token.
//!   A key is named by the lease its claim's first attempt wrote on, as
//!   etcd's own lock RPC names its keys, and its value is the owner's hex
//!   (then a space and the metadata, if any). A lease carries one claim at
//!   a time and becomes a spare only once its key was deleted, so two live
//!   claims never share a key, while the next claim on that spare writes
//!   the same key again: a busy name reuses a few keys instead of adding
//!   one per acquire to etcd's key index, which every attempt's range read
//!   on the name walks until a compaction (`tests/it/key_history.rs`). A
//!   reused key deleted and created again gets a new create revision, so
//!   fencing tokens still rise. A release or extend goes by this client's
//!   record of the owner's claim (its key and create revision); a release
//!   by an owner this client has no record of reads the queue for the key
//!   whose value names it and deletes that key at its create revision.
//!   A client runs one call at a time per claim (its kind, name and
//!   owner): an attempt, extend, release or lease grant waits for the
//!   owner's other call on the same name through the same client, if any,
//!   so none undoes another's outcome (`tests/it/same_owner_one_client.rs`);
//!   calls on other names or of other owners never wait. A holder's
//!   attempt with another TTL moves its key, as `extend` does, and keeps
//!   its token.
//!   An owner's first attempt (and so every one-shot `try_acquire`) writes
//!   only into an empty queue, in one transaction: a refused attempt leaves
//!   nothing behind. Its next attempt (a waiter's: coord-core's wait loop
//!   attempts, subscribes, attempts again) queues a key, which this client
//!   keeps alive while the waiter waits; the waiter watches only its
//!   predecessor's key and is the one woken when that key goes. A waiter
//!   that knows its predecessor was the holder (the read that queued it
//!   showed that key first, or it saw that key's head marker: a claim
//!   that holds after queueing puts its own key once more, in the
//!   background; a marker wakes nobody) holds as soon as that key is
//!   deleted, without reading the queue again (keys join only at the
//!   back), with no request if its lease was refreshed within the slack,
//!   else after one keepalive. A grant is
//!   reported only after a keepalive or grant of the key's own lease, sent
//!   after the attempt began or within the slack before it, succeeded. A waiter whose key vanished (its lease
//!   expired) queues again at its next attempt and keeps waiting;
//!   `release` revokes the owner's lease whether it holds or waits.
//! - **Semaphores** are FIFO ([`Semaphore::fifo`](coord_core::Semaphore::fifo)
//!   is true): a grant is `<prefix>sem/<name>/h/<lease hex>` (value: the
//!   owner's hex, permits, total, slots) plus one key
//!   `<prefix>sem/<name>/s/<i>` per permit slot it takes, all on one lease
//!   of the grant's TTL, written in one transaction that compares each
//!   slot to be free (so never more than `permits_total` are held); the
//!   grant key's create revision is the fencing token. Waiters queue as
//!   `<prefix>sem/<name>/w/<lease hex>` (value: the owner's hex, permits,
//!   total), ordered by create revision, on a lease of 30 s that their
//!   attempts renew (at least every 10 s), so a killed waiter's place
//!   lapses. Grant and place keys are named by a lease as lock keys are
//!   (a lease carries one such key at a time and is a spare again only
//!   once it was deleted; a retry after a lost reply writes the same key,
//!   compared to be absent), so a busy name reuses a few keys instead of
//!   adding one per acquire to etcd's key index
//!   (`tests/it/sem_key_history.rs`). A release or extend acts on a grant
//!   (or place) at the create revision it was written with, never on a
//!   key for existing (a key may be written again for the next owner); one
//!   of an owner this client has no record of finds its key by the value.
//!   An owner retried through another client (one token over two clients
//!   of the raw trait) has its grant or place adopted there, and only the
//!   client whose lease it is ever reuses or revokes that lease. Clients
//!   from before this layout (keys named by owner, values without it)
//!   read its values as corrupt and are read so
//!   by it: every client of a semaphore name must be upgraded together. A
//!   request is granted only if it and every request queued ahead of it
//!   fit into the free permits together; it takes free slots chosen at
//!   random (concurrent attempts rarely pick the same), and one that loses
//!   its slots to another grant tries again with the state the failed
//!   transaction read, so it is refused only when a read shows too few
//!   permits free. An attempt reads the name's grants and waiters and its
//!   slot keys (keys only): its cost grows with what is held and queued,
//!   not with `permits_total`. One watch per name and client mirrors the
//!   name's keys and wakes exactly the local waiters that can be granted
//!   when a grant or place ends. `permits_total` binds while any key of
//!   the name lives: a grant or place is written only while a key its
//!   read saw (of its total) lives, or while the name has none.
//! - **Work queues** live under `<prefix>wq/<name>/`: a record and a
//!   payload key per message, per-group lists (all messages, ready ones),
//!   two keys per group (its turn and lowest ready id; its head), two
//!   candidate indexes keyed by (turn, id) whose first key is the next
//!   delivery (one for ordered groups), and a timeline of delayed messages
//!   and delivery deadlines. Every operation is a read or two and one
//!   transaction comparing what it read; a pop's transaction offers the
//!   next few deliveries as nested levels, so racing consumers mostly win
//!   one each. Message ids and delivery fencing tokens are revisions (the
//!   id: of a put to the fencing key; the token: of the delivering
//!   transaction), so both rise across the whole store and survive
//!   restarts. Delays, visibility deadlines and dedup windows run on the
//!   clients' clocks; dedup ids are on a lease outliving their window. One
//!   watch per queue, lane and client wakes waiters when a message becomes
//!   deliverable or a delayed one is added. See `work_queue.rs`.
//! - **Holder metadata and inspection.** Metadata (JSON, at most 1 KiB)
//!   is stored in the grant's own key, so it ends exactly with the grant
//!   and costs no call: a lock key's or a named lease's value after the
//!   owner's hex and a space; a semaphore
//!   grant's value after its owner's hex, permits, total and slots. Only a new key stores it
//!   (a retry of an owner whose key exists keeps that key as it is).
//!   `inspect` is one range read (a lock: its queue's first key, and the
//!   count of the keys behind it as `waiters`; a semaphore: its grants,
//!   and its waiters counted) plus a `LeaseTimeToLive` per holder (at most
//!   32 for a semaphore) for the remaining time etcd reports; the fencing
//!   token shown is the key's create revision. An election's `inspect`
//!   reads its leader key the same way (no waiters: candidates queue no
//!   keys).
//! - **Elections**: `<prefix>election/<name>/<lease hex>` (named as lock
//!   keys are; value: the owner's hex, a space, the candidate), created
//!   only when no leader key exists; the term is its create revision;
//!   watchers of the prefix wake every local candidate and observer.
//! - **Leases** (named): `<prefix>lease/<name>` attached to an etcd lease of
//!   their own (`remaining` is what the server says; `revoke` ends it at
//!   once).
//! - **Fencing**: `FencingSource::next` is the revision of a put to one
//!   key (`<prefix>fence/`) shared by every resource: one counter for the
//!   whole cluster, durable across restarts, and no state per resource.
//! - **Barriers**: one key per barrier (party count, generation,
//!   participants), updated by compare-and-swap on its mod revision;
//!   waiters are woken by a watch when the generation changes. The key is
//!   on a lease of its own of 30 s (the barrier grace) that every client
//!   with a local waiter keeps alive every 10 s; a barrier nobody waits on
//!   (its generation completed, its participants timed out or died) goes
//!   30 s after its last write or keepalive. A barrier made again starts
//!   at the store's revision, above every generation it had before.
//! - **Rate limiters**: one key per key and algorithm, updated by
//!   compare-and-swap on its mod revision, and attached to a lease that
//!   outlives the state's retention (never renewed: a new one is granted
//!   when it runs low, or at once if the server lost it). etcd has no clock to read, so windows are
//!   measured on each **client's clock** (`Capabilities::server_clock` is
//!   false). Clock skew between clients shifts their windows: a client
//!   whose clock runs ahead by `d` sees old requests fall out of the window
//!   `d` early (up to `d`'s worth of extra admissions for the sliding and
//!   fixed windows, `d / (window / limit)` extra cells for GCRA); one that
//!   runs behind is stricter. Keep clocks synchronised (NTP) to well under
//!   the window.
//!
//! ## State that costs nothing once idle
//!
//! Every key coord writes ends by itself once its name is idle, while the
//! client lives on or not: claims (locks, leaderships, named leases, queued
//! waiters, semaphore grants) at their TTL (rounded up to whole seconds);
//! a semaphore waiter's place 30 s after its last attempt; limiter state
//! within 2 x its retention (the window, two for the sliding window) + the
//! call timeout + 2 s after its last admitted check; barriers 30 s after
//! nobody waits on them; fencing keeps one key in all (message ids come
//! from it too); a work queue keeps nothing once its messages are acked
//! (or purged) and its dedup ids' leases ended (their window plus 2-3 s).
//! Leases follow: one per live claim or barrier, a few per limiter
//! retention in use (each lives at most 2 x retention + call timeout +
//! 2 s), one per dedup window in use (granted anew each second of pushes),
//! and the spare leases of ended claims, revoked after 5 s unused.
//!
//! What etcd itself keeps is its **history**: every write (each admitted
//! limiter check, each grant and release, each fencing token) is a new
//! revision, and etcd keeps old revisions until they are compacted. Run
//! etcd with automatic compaction, for example
//! `--auto-compaction-mode=periodic --auto-compaction-retention=1h` (keep
//! an hour of history) or `--auto-compaction-mode=revision
//! --auto-compaction-retention=100000` (keep the last 100,000 revisions),
//! and defragment now and then (`etcdctl defrag`) to return the freed
//! space to the file system; without compaction the database grows until
//! it reaches its quota (`--quota-backend-bytes`, 2 GiB by default) and
//! etcd refuses writes (`mvcc: database space exceeded`). coord needs no
//! old history: its watches start at most a few moments back, and a
//! watcher whose start was compacted away checks the present state again.
//!
//! Every call is bounded by the call timeout (default 5 s) and fails with
//! [`Error::Unavailable`] when it fires.
//! Passwords never appear in `Debug`, `Display`, errors or logs.
#![deny(missing_docs)]

mod backend;
mod barrier;
mod claims;
mod entries;
mod handoff;
mod holding;
mod inspect;
mod keys;
mod limiter;
mod named_lease;
mod options;
mod pool;
mod queue;
mod sem_acquire;
mod sem_hold;
mod sem_place;
mod sem_view;
mod sem_watch;
mod semaphore;
mod watch;
mod work_queue;
mod wq_due;
mod wq_group;
mod wq_keys;
mod wq_ops;
mod wq_plan;
mod wq_pop;

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
use claims::ClaimSpec;
use keys::prefix_end;
use watch::WatchKind;

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
