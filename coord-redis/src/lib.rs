//! # coord-redis
//!
//! The Redis backend of [coord](coord_core): every primitive on one Redis
//! server, a Redis Cluster or the master Redis Sentinel names, and locks,
//! leases and fencing tokens on a quorum of independent masters
//! ([`redlock`]). Each step is one Lua script (`EVALSHA`) on keys of one
//! hash slot; fencing tokens are max(stored + 1, server µs), so they keep
//! rising across data loss ([`capabilities`]); waiters are woken by
//! `PUBLISH`. URLs: `redis://`, `rediss://`, `redis+cluster://`,
//! `redis+sentinel://`, `redlock://` (options in the query, see
//! [`RedisOptions`]).
//!
//! How it works — keys and layouts, Cluster, Sentinel, Redlock, wake-ups,
//! late copies of attempts, semaphores, work queues, metadata, costs and
//! what stays in Redis — is in `docs/redis.md` in the repository.
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
//! let attempt = lock.try_acquire("orders", me.step(), Duration::from_secs(30)).await?;
//! println!("{attempt:?}");
//! lock.release("orders", me.step()).await?;
//!
//! // Sharing locks with PHP services using the RedisLock class key layout:
//! let shared = coord_redis::RedisOptions::new("redis://127.0.0.1:6379")
//!     .layout(coord_redis::Layout::Php)
//!     .timeout(Duration::from_secs(2))
//!     .connect()
//!     .await?;
//! # let _ = shared;
//! # Ok(())
//! # }
//! ```
//!
//! A Redis Cluster:
//!
//! ```no_run
//! # async fn demo() -> coord_core::Result<()> {
//! let coord = coord_redis::connect(
//!     "redis+cluster://10.0.0.1:7000,10.0.0.2:7000,10.0.0.3:7000?prefix=billing:",
//! )
//! .await?;
//! assert_eq!(coord.capabilities().deployment, coord_core::Deployment::Cluster);
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod backend;
mod keys;
mod options;
pub mod redlock;
mod scripts;

pub use backend::listener::HEALTH_CHECK;
pub use backend::{RedisBackend, capabilities, cluster_capabilities, sentinel_capabilities};
pub use keys::Layout;
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

// Here rather than in `options`: options are read by every backend, and
// this picks one.
impl RedisOptions {
    /// Connect and return a [`Coord`](coord_core::Coord) handle with every
    /// primitive.
    pub async fn connect(self) -> coord_core::Result<coord_core::Coord> {
        if self.redlock.is_some() {
            return redlock::RedlockBackend::connect(self)
                .await
                .map(redlock::RedlockBackend::into_coord);
        }
        let backend = RedisBackend::connect(self).await?;
        Ok(backend.into_coord())
    }
}
