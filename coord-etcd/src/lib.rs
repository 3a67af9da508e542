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

use coord_core::{Coord, Result};

pub use backend::EtcdBackend;
pub use options::{DEFAULT_CALL_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, EtcdOptions};

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

#[cfg(test)]
mod tests {
    #[test]
    fn backend_is_send_sync() {
        fn check<T: Send + Sync + 'static>() {}
        check::<super::EtcdBackend>();
        check::<super::EtcdOptions>();
    }
}
