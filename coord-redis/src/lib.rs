//! # coord-redis
//!
//! The Redis backend of [coord](coord_core): every primitive (locks,
//! leases, fencing tokens, elections, barriers, rate limiters, FIFO
//! semaphores, work queues) on one Redis server, a Redis Cluster or the
//! master Redis Sentinel names (see "Redis Cluster" and "Redis Sentinel"
//! below), and locks, leases and fencing tokens on a quorum of
//! independent masters (Redlock, see "Redlock"), with the seed PHP `RedisLock`'s scheme corrected:
//!
//! - **Lock**: acquire is ONE Lua script that runs `SET key token NX PX ttl`
//!   and issues the fencing token from a counter beside the lock in the same
//!   step (so an uncontended acquire + release costs exactly 2 round trips);
//!   a retry by the same owner gets the same token back. When held by
//!   another, the script returns the holder's `PTTL`, so waiters know when
//!   it expires. Release is compare-and-delete plus a `PUBLISH` wake-up in
//!   one script; extend is compare-and-`PEXPIRE` (the seed's watchdog
//!   renewed with a bare `EXPIRE`, which can renew somebody else's lock).
//! - **Fencing**: each token is max(stored counter + 1, server clock in µs
//!   from `TIME`), so tokens keep rising after the server lost its data or
//!   came back with an older snapshot or a lagging replica, while the server
//!   clock does not go back and fewer than one token per µs is issued per
//!   name ([`FencingDurability::ClockSeeded`](coord_core::FencingDurability::ClockSeeded);
//!   see [`capabilities`]).
//! - **Limiter**: sliding log (ZSET, one unique member per request carrying
//!   its cost, with a running cost total, so a check is O(log n) in the
//!   requests of the window whatever the cost), sliding window counter,
//!   fixed window and GCRA (its TAT kept exactly, as integer µs plus a
//!   remainder in 1/limit µs), each one script reading the server clock
//!   with `TIME`: one round trip per check. A changed quota carries the
//!   key's state over and never grants a fresh allowance. Limits and
//!   windows (µs) must be below 2^49, so all arithmetic stays exact;
//!   larger ones are refused with `InvalidArgument`.
//! - **Semaphore**: FIFO ([`Semaphore::fifo`](coord_core::Semaphore::fifo)
//!   is true): one script per step on six keys of one hash slot (state
//!   hash, grants, queue), see "Semaphores" below.
//! - **Work queue**: one script per step (push, pop, ack, nack, extend,
//!   peek, redrive, stats, purge) on 22 keys of one hash slot, O(log n) in
//!   the queue's size; see "Work queues" below.
//! - **Election, lease, barrier**: the same pieces (keys with `PX`, owner
//!   checks in scripts, `PUBLISH` on change). A barrier arrival carries the
//!   wait's arrival id, so a retried completing arrival is recognised.
//!
//! **Restarts and data loss.** Fencing tokens survive any loss (above), but
//! a held LOCK lives only in the server's memory: a server that restarts
//! empty (no persistence, or an older snapshot) forgets it, and another
//! client can be granted the same lock while the old holder's guard is
//! still valid. Either run Redis with `appendonly yes` (`appendfsync
//! always` for no window at all), or restart an empty server only after the
//! longest lock TTL has passed (the "delayed restart" Redlock recommends);
//! fenced resources stay safe either way, because the new holder's token is
//! higher. The fault suite (`tests/faults.rs`) runs both: kill -9 with an
//! AOF restarted at once, and without persistence restarted after the TTL.
//!
//! Scripts are loaded once at connect time and called by `EVALSHA`; after a
//! `SCRIPT FLUSH` or a restart, the `NOSCRIPT` reply makes the client load
//! the script again and retry. Keys are `prefix + kind + ":{name}"`
//! ([`Layout::Coord`], hash-tagged for Redis Cluster) or the seed's own keys
//! ([`Layout::Seed`]), so a PHP service still on the seed and a Rust service
//! on coord lock each other out. Every call is bounded by a timeout
//! ([`RedisOptions::timeout`]); the command connection reconnects by
//! itself; a dedicated subscriber connection delivers wake-ups and
//! re-subscribes after a reconnect (see "Wake-ups" below). `redis://` and
//! `rediss://` URLs (TLS with rustls: the system's root certificates, or a
//! private CA with [`RedisOptions::tls_root_certificate`], and mutual TLS
//! with [`RedisOptions::tls_client_certificate`]), with a password or an
//! ACL user; the password never appears in `Debug`, `Display`, errors or
//! logs.
//!
//! ## Example
//!
//! ```no_run
//! # async fn demo() -> coord_core::Result<()> {
//! use std::time::Duration;
//! use coord_core::OwnerToken;
//!
//! // Every primitive, on one Redis:
//! let coord = coord_redis::connect("redis://127.0.0.1:6379").await?;
//! let lock = coord.raw_lock()?;
//! let me = OwnerToken::random();
//! let attempt = lock.try_acquire("orders", &me, Duration::from_secs(30)).await?;
//! println!("{attempt:?}");
//! lock.release("orders", &me).await?;
//!
//! // Sharing locks with services still running the seed's PHP RedisLock:
//! let shared = coord_redis::RedisOptions::new("redis://127.0.0.1:6379")
//!     .layout(coord_redis::Layout::Seed)
//!     .timeout(Duration::from_secs(2))
//!     .connect()
//!     .await?;
//! # let _ = shared;
//! # Ok(())
//! # }
//! ```
//!
//! ## Redis Cluster
//!
//! `redis+cluster://[user][:password@]host1:port1,host2:port2[?options]`
//! (`rediss+cluster://` for TLS) lists seed nodes; the client discovers
//! the rest (`redis`'s async cluster client) and follows `MOVED` and `ASK`
//! redirections (slot moves) and failovers by itself. List several seeds,
//! so a client can start while one is down. Every option of a plain URL
//! works; the path may only be empty or `/0` (a cluster has database 0
//! only).
//!
//! - Every key one script touches hashes to one slot ([`Layout::Coord`]
//!   puts the name in the hash tag), so every primitive works unchanged,
//!   and names spread over the masters. [`Layout::Seed`] (no common hash
//!   tag) is refused with [`Error::Config`](coord_core::Error::Config).
//! - Scripts are loaded on every master at connect; a promoted replica
//!   answers `NOSCRIPT` once per script and coord loads it again.
//! - A prefix with an empty hash tag (`x{}:`) is refused: Redis would hash
//!   each key whole, and one primitive's keys would sit in different
//!   slots.
//! - Each seed gets a quarter of the connect timeout, so a client connects
//!   (and rebuilds its connection) while a node hangs.
//! - Wake-ups: one subscription per client on any node (a `PUBLISH` on a
//!   cluster reaches every node), moved to the next seed when its node
//!   goes away; waiters poll meanwhile.
//! - A call that gets no answer in time rebuilds the cluster connection in
//!   the background, as on one server.
//! - Failover: Redis replicates asynchronously, so a master killed right
//!   after a grant may have a replica that never saw it; a second client
//!   can then be granted the same lock while the first still holds it
//!   ([`Capabilities::exclusive_across_failover`](coord_core::Capabilities::exclusive_across_failover)
//!   is false). Fencing tokens keep rising (server µs on the promoted
//!   replica, whose clock must not be behind by more than the failover
//!   took), so fence every write. See [`cluster_capabilities`].
//!
//! Tested against a real 3-master, 3-replica cluster: the whole
//! conformance suite (`tests/it/suite_cluster.rs`), a master killed
//! mid-workload and a slot moved mid-workload (`tests/it/cluster.rs`).
//!
//! ```no_run
//! # async fn demo() -> coord_core::Result<()> {
//! let coord = coord_redis::connect(
//!     "redis+cluster://10.0.0.1:7000,10.0.0.2:7000,10.0.0.3:7000?prefix=billing:",
//! )
//! .await?;
//! assert_eq!(coord.capabilities().deployment, "cluster");
//! # Ok(())
//! # }
//! ```
//!
//! ## Redlock
//!
//! `redlock://[user][:password@]h1:6379,h2:6379,h3:6379[/<db>][?options]`
//! (`rediss+redlock://` for TLS) lists at least three independent masters:
//! locks, leases and fencing tokens on a quorum of them. See [`redlock`]
//! for the algorithm and exactly what it does and does not guarantee.
//!
//! ## Redis Sentinel
//!
//! `redis+sentinel://[user][:password@]s1:26379,s2:26379/<master name>[/<db>][?options]`
//! (`rediss+sentinel://` for TLS to the master and the sentinels) lists
//! the sentinels and names the master they watch; the credentials are the
//! master's (sentinels without a password of their own).
//!
//! - coord asks the sentinels in turn for the master's address
//!   (`SENTINEL get-master-addr-by-name`) and uses it once the server
//!   there says it is a master (`ROLE`), as the Sentinel client protocol
//!   asks.
//! - It asks again, in the background, when a call times out, the master
//!   stops answering, or it answers `READONLY` (it was demoted: a
//!   failover, or `SENTINEL FAILOVER`, which keeps the old master's
//!   connections open); calls fail with a retryable
//!   [`Error::Unavailable`](coord_core::Error::Unavailable) meanwhile.
//! - The wake-up subscription is on the master, and moves with it: each
//!   reconnect asks the sentinels again; waiters poll meanwhile.
//! - Failover: as on a Cluster (above), asynchronous replication may lose
//!   a grant; see [`sentinel_capabilities`].
//!
//! Tested against a real master, replica and three sentinels: the whole
//! conformance suite (`tests/it/suite_sentinel.rs`), the master killed
//! mid-workload and a switch-over mid-workload (`tests/it/sentinel.rs`).
//!
//! ## Wake-ups
//!
//! Each client subscribes ONE channel, `<prefix>wake`, on a dedicated
//! connection before `connect` returns; releases, resignations, elections
//! and completed barrier generations publish `<kind>:<name>` on it. A lock
//! or lease release publishes only when somebody waits: an attempt refused
//! while its client has local waiters on the name marks the claim, a grant
//! to a client with two or more local waiters on the name is marked from
//! the start (one of them may be the one granted; the others still wait,
//! and one release wakes only one of them), and only a marked claim's
//! release publishes (so an uncontended cycle costs the server no
//! `PUBLISH`). So
//! `subscribe(name)` costs no round trip and cannot miss a wake-up that
//! comes after it. A lock release wakes one local waiter per client; an
//! election or barrier change wakes all of them; a semaphore wake-up names
//! the one waiting owner it is for (see "Semaphores"). The seed's PHP
//! class does not publish: waiters in [`Layout::Seed`] learn of a PHP release by
//! polling, and of an expiry by the `PTTL` the acquire script returns.
//! After the subscriber connection drops, it reconnects with backoff and
//! wakes every local waiter once ([`Wakeups::notify_every`](coord_core::wake::Wakeups::notify_every)),
//! since wake-ups may have been missed meanwhile. The subscriber task ends
//! when the backend is dropped.
//!
//! ## Late copies of attempts
//!
//! An attempt whose call timed out (or whose connection broke, or whose
//! acquire was cancelled) may still reach the server later: the client
//! replaces the connection after a timeout, so its cleanup (the release)
//! can overtake a copy delayed on the old one. Landing on a free name, the
//! copy would take a lock, lease or leadership for nobody, for its TTL.
//! So every lock, lease and campaign attempt carries a stamp of this
//! process (`coord_core::late`), and the release (revoke, resignation) of
//! an owner one of whose attempts went unanswered leaves a mark,
//! `<claim key>:left:<owner>` in the claim's hash slot, holding the
//! release's stamp for 10 s (or twice the call timeout), whether or not the
//! owner held the claim. Every attempt looks its owner's mark up first (one
//! `GET`, a miss nearly always, in the same script: no round trip more) and
//! is refused, changing nothing, when stamped before it. The owner's own
//! later attempts (a raw-trait caller may reuse an owner) are stamped after
//! it and go on as usual. A release after answered attempts leaves no
//! mark. Semaphores do the same with their own keys (see "Semaphores").
//! Not covered: a copy later than the mark's lifetime, and an owner token
//! shared between processes.
//!
//! ## Semaphores
//!
//! A name's keys are `<prefix>semaphore:{name}` (a hash: `total`, `held`
//! permits, `qsum` permits queued, `last` token, `qseq` arrival counter,
//! `woke` highest arrival woken) and, with suffixes `:grants` (ZSET owner
//! -> expiry ms), `:holders` (hash owner -> `<permits>:<token>`, and
//! `:<metadata>` after it for a grant with holder metadata), `:queue`
//! (ZSET owner -> arrival number), `:queue-expiry` (ZSET owner -> expiry
//! ms) and `:queue-permits` (hash owner -> permits); every layout uses
//! them. Each step (attempt, release, extend, force release) is one
//! script on the server clock: it drops the grants and queue places that
//! expired, then
//! - grants iff the request and every request queued ahead of it fit into
//!   the free permits together (a single attempt counts the whole queue as
//!   ahead), issuing max(last + 1, server µs) as locks do; a holder's
//!   retry gets its grant again, same token, TTL refreshed;
//! - otherwise a waiting attempt joins the queue or renews its place
//!   ([`QUEUE_ENTRY_TTL`], so only a killed waiter's place lapses), and the
//!   reply's `expires_in` is the time to the next holder or place ahead
//!   ending, at most [`QUEUE_REFRESH`];
//! - publishes `semaphore:<owner>:<name>` for each queued waiter that has
//!   become grantable (the longest prefix of the queue that fits), once
//!   per place: a place that fits keeps fitting until it is granted, so
//!   nobody is woken twice, and nothing is published while nobody waits.
//!   The subscriber wakes exactly that owner's waiting acquire;
//! - sets every key's TTL to the end of the latest grant or queue place,
//!   and deletes an idle name at once (keeping only `last` while it is
//!   ahead of the server clock, for the rest of that lead).
//!
//! `permits_total` binds while the name has live grants or queue places.
//! Read-write locks built on these semaphores get a starvation-free
//! queue: a waiting writer (all permits) blocks every later reader.
//!
//! ## Work queues
//!
//! A queue's keys are `<prefix>queue:{name}` (a hash: last id, last
//! fencing token, each lane's virtual clock and waiting mark) and, with
//! suffixes, `:bodies` (hash id -> payload, binary-safe), `:dedup` and
//! `:dedup-expiry` (dedup id -> message id, and -> expiry), and nine keys
//! per lane (`:main:*`, `:dead:*`): message metadata (hash id ->
//! attempts, enqueue time, deadline, owner, group), every id (ZSET), all
//! messages and the ready ones by group (lex ZSETs of `group \0 id`), the
//! delayed and in-flight timelines (ZSETs by time), the groups' turns and
//! candidates (hash), and the candidates by turn, plain and for ordered
//! groups (ZSETs whose first member is the next delivery). Every layout
//! uses them. Each step is one script on the server clock and follows
//! `coord_core::queue_backend`'s rule exactly, with one bound: a step
//! makes at most 256 due delayed messages and 256 lapsed deliveries ready,
//! so after a larger mass lapse the next few steps finish the job (and may
//! meanwhile deliver out of the rule's order among those). Ids and
//! fencing tokens are max(last + 1, server µs), as for locks, so both keep
//! rising after an idle queue's keys were deleted or the data was lost.
//! A push or a nack (without delay, or with one that ends before anything
//! else the lane waits for), a redrive, an ack that unblocks an ordered
//! group and a dead-lettering publish `queue:<lane>:<name>`, but
//! only while somebody waits on that lane: an attempt of a client with a
//! waiter on it marks the lane for a minute (each such attempt renews
//! it), so producers on a queue nobody waits on publish nothing. Payloads
//! are at most 256 KiB (the default); [`Queue::durable`](coord_core::Queue::durable)
//! is false (the server's persistence decides). Run Redis with
//! `maxmemory-policy noeviction` for queues: an evicted index key leaves
//! messages undeliverable until purged (the scripts never fail on it).
//!
//! ## Holder metadata and inspect
//!
//! A grant's holder metadata (`Locks::acquire_with_metadata` and friends:
//! at most 1 KiB of JSON, checked by the core) is stored IN the grant, so
//! it ends exactly when the grant does (release, expiry, force release)
//! and no key is written for it:
//! - a lock or lease ([`Layout::Coord`]): after the token in the claim's
//!   value, `<owner>:<token>~<metadata>~` (the waiting mark `*` still comes
//!   last); extend is the same `PEXPIRE` of the one key;
//! - a [`Layout::Seed`] lock: the claim keeps the bare owner token the PHP
//!   class compares; the metadata goes in coord's grant key beside it,
//!   `<token>~<owner>~<metadata>~` (the owner, so a grant key left behind
//!   by a claim deleted under it is never shown for the next holder);
//! - a semaphore grant: after its token in the holders hash,
//!   `<permits>:<token>:<metadata>`.
//!
//! Only a new grant stores metadata; a retry by the holder keeps its grant
//! as it is. An acquire without metadata runs the same scripts' commands
//! as before metadata existed (`tests/it/inspect.rs` counts every command
//! the server runs). `inspect` is one read-only script: the holder's owner
//! token (the core shows only its fingerprint), fencing token, `PTTL` (or
//! the grant's expiry on the server clock) and metadata; for a semaphore
//! every live grant with its permits, and `waiters`, the queue places that
//! have not lapsed. A [`Layout::Seed`] lock held by the PHP class shows
//! the PHP token as owner and fencing token 0 (the PHP class records
//! none).
//!
//! ## Costs
//!
//! An uncontended acquire + release (lock or semaphore permit) is exactly
//! 2 requests (`EVALSHA` twice), with or without holder metadata; a limiter check, a fencing token, a campaign, a barrier arrival,
//! a queue push, pop, ack, nack or extend, an inspect are 1 each. The tests count them
//! through a counting proxy.
//!
//! ## What stays in Redis
//!
//! Nothing, for a name idle past its TTL, window or idle grace
//! (`tests/it/state.rs` touches 100,000 names and watches the key count come
//! back to where it was):
//! - a lock or lease ([`Layout::Coord`]) is ONE key, `<owner>:<token>` while
//!   held; a release leaves `=<token>` for the rest of the TTL (so a grant
//!   right after it rises above it even within one µs), then nothing. The
//!   fencing token lives in the claim, so a grant costs one read and one
//!   write, like the raw `SET NX` (and the lookup of the owner's late-copy
//!   mark, a miss);
//! - the release of a lock, lease or leadership whose owner had an
//!   attempt unanswered leaves `<claim key>:left:<owner>` for 10 s, or
//!   twice the call timeout (see "Late copies of attempts");
//! - a semaphore's keys live until its latest grant or queue place ends;
//! - a work queue's keys live while it holds messages; once it holds none
//!   (acked or purged), only its dedup ids stay, until their windows end,
//!   and on a TTL its last id and token while ahead of the server clock
//!   and its lanes' waiting marks (at most a minute);
//! - an election is one hash on the leader's TTL (after a resignation, just
//!   the last term until then);
//! - a limiter key expires with its window;
//! - a fencing source's counter and a barrier's state expire
//!   [`RedisOptions::idle_grace`] (default 60 s) after their last use; an
//!   open barrier generation stays while anybody waits on it (each check
//!   refreshes it).
//!
//! Fencing stays monotonic across all of it: every token, term and barrier
//! generation is max(stored + 1, server time in µs), so once the state is
//! gone the server clock keeps them rising (see [`capabilities`]).
//! [`Layout::Seed`] keeps the seed's keys as the PHP class expects them:
//! its `fencing_token_<name>` counters are kept for good.
#![deny(missing_docs)]

mod backend;
mod keys;
mod listener;
mod options;
pub mod redlock;
mod scripts;

pub use backend::{RedisBackend, capabilities, cluster_capabilities, sentinel_capabilities};
pub use keys::Layout;
pub use listener::HEALTH_CHECK;
pub use options::RedisOptions;

/// How long a waiter's place in a semaphore's queue lasts without a new
/// attempt (as in the memory backend). A waiting acquire attempts again
/// well within it (its `Held { expires_in }` hint is at most
/// [`QUEUE_REFRESH`]), so only a killed waiter's place lapses; it holds up
/// the waiters behind it for at most this long.
///
/// ```
/// assert!(coord_redis::QUEUE_REFRESH < coord_redis::QUEUE_ENTRY_TTL);
/// ```
pub const QUEUE_ENTRY_TTL: std::time::Duration = std::time::Duration::from_secs(30);

/// The longest `expires_in` a refused semaphore attempt reports, so a
/// queued waiter renews its place before [`QUEUE_ENTRY_TTL`] runs out.
pub const QUEUE_REFRESH: std::time::Duration = std::time::Duration::from_secs(10);

/// Connect to Redis at `url` (`redis://[user][:password@]host[:port][/db]`
/// or `rediss://...` for TLS) with the default options (prefix `coord:`,
/// [`Layout::Coord`], 3 s call timeout) and return a
/// [`Coord`](coord_core::Coord) handle with every primitive.
///
/// ```no_run
/// # async fn demo() -> coord_core::Result<()> {
/// let coord = coord_redis::connect("redis://127.0.0.1:6379").await?;
/// assert_eq!(coord.capabilities().backend, "redis");
/// # Ok(())
/// # }
/// ```
pub async fn connect(url: &str) -> coord_core::Result<coord_core::Coord> {
    RedisOptions::new(url).connect().await
}
