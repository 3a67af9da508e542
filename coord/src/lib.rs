//! # coord
//!
//! Distributed coordination for Rust: locks, leases, fencing tokens, leader
//! election, barriers, rate limiters, semaphores, read-write locks and work
//! queues, with one API on every store. Pick a
//! backend with a cargo feature and a URL; swapping stores is a URL change.
//!
//! | URL | cargo feature | store |
//! |---|---|---|
//! | `memory://` or `memory://NAME` | `memory` (default) | in-process, embedded |
//! | `redis://`, `rediss://` | `redis` | Redis |
//! | `redis+cluster://h1:port,h2:port`, `rediss+cluster://` | `redis` | Redis Cluster |
//! | `redis+sentinel://s1:26379,s2:26379/<master>`, `rediss+sentinel://` | `redis` | Redis behind Sentinel |
//! | `redlock://h1:6379,h2:6379,h3:6379`, `rediss+redlock://` | `redis` | Redlock over independent masters (locks, leases, fencing) |
//! | `etcd://host:2379,host2:2379`, `etcds://` | `etcd` | etcd v3 |
//! | `postgres://`, `postgresql://` | `postgres` | PostgreSQL |
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> coord::Result<()> {
//! use std::time::Duration;
//!
//! let coord = coord::connect("memory://").await?;
//! let locks = coord.locks()?;
//! let guard = locks
//!     .acquire("order:42", Duration::from_secs(30), Duration::from_secs(5))
//!     .await?;
//! // Pass the fencing token to everything you write while holding the lock.
//! println!("token {}", guard.fencing_token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! Every primitive is documented on its handle: [`Locks`], [`Leases`],
//! [`Fencing`], [`Elections`], [`Barriers`], [`RateLimiter`],
//! [`Semaphores`], [`RwLocks`], [`Queues`]. Errors are one
//! enum, [`Error`], that tells bad input, timeouts, lost ownership and store
//! trouble apart.
//!
//! Without an async runtime (a plain `fn main()`), [`blocking`] offers the
//! same primitives as blocking functions, with guards released on drop
//! (cargo feature `blocking`, on by default).
#![deny(missing_docs)]

pub use coord_core::*;

#[cfg(feature = "blocking")]
pub mod blocking;

#[cfg(feature = "etcd")]
#[doc(inline)]
pub use coord_etcd as etcd;
#[cfg(feature = "memory")]
#[doc(inline)]
pub use coord_memory as memory;
#[cfg(feature = "postgres")]
#[doc(inline)]
pub use coord_postgres as postgres;
#[cfg(feature = "redis")]
#[doc(inline)]
pub use coord_redis as redis;

/// Connect to the store named by `url` and get one handle for every
/// primitive. See the table in the crate docs for the schemes.
///
/// Errors: [`Error::Config`] for a URL without a scheme, an unknown scheme,
/// or a scheme whose cargo feature is off (the message names the feature to
/// enable); the backend's own errors when it cannot connect. Passwords in
/// the URL never appear in errors.
pub async fn connect(url: &str) -> Result<Coord> {
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(Error::Config(format!(
            "`{}` has no scheme; use memory://, redis://, rediss://, redis+cluster://, redis+sentinel://, redlock://, etcd://, etcds:// or postgres://",
            util::redact_url_passwords(url)
        )));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "memory" => {
            #[cfg(feature = "memory")]
            return coord_memory::connect(url);
            #[cfg(not(feature = "memory"))]
            return Err(coord_core::util::backend_left_out("memory", url));
        }
        "redis" | "rediss" | "redis+cluster" | "rediss+cluster" | "redis+sentinel"
        | "rediss+sentinel" | "redlock" | "redis+redlock" | "rediss+redlock" => {
            #[cfg(feature = "redis")]
            return coord_redis::connect(url).await;
            #[cfg(not(feature = "redis"))]
            return Err(coord_core::util::backend_left_out("redis", url));
        }
        "etcd" | "etcds" => {
            #[cfg(feature = "etcd")]
            return coord_etcd::connect(url).await;
            #[cfg(not(feature = "etcd"))]
            return Err(coord_core::util::backend_left_out("etcd", url));
        }
        "postgres" | "postgresql" => {
            #[cfg(feature = "postgres")]
            return coord_postgres::connect(url).await;
            #[cfg(not(feature = "postgres"))]
            return Err(coord_core::util::backend_left_out("postgres", url));
        }
        other => Err(Error::Config(format!(
            "unknown scheme `{other}://` in `{}`; use memory://, redis://, rediss://, redis+cluster://, redis+sentinel://, redlock://, etcd://, etcds:// or postgres://",
            util::redact_url_passwords(url)
        ))),
    }
}
