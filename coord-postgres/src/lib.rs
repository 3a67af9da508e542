//! # coord-postgres
//!
//! The PostgreSQL backend of coord: locks, leases, fencing tokens, leader
//! election, barriers, rate limiters, FIFO semaphores and work queues on
//! ordinary tables, with expiry
//! measured on the DATABASE clock (`clock_timestamp()`), fencing tokens
//! issued in the same statement as the grant, and waiters woken by
//! `LISTEN`/`NOTIFY`.
//!
//! ```no_run
//! # async fn demo() -> coord_core::Result<()> {
//! use std::time::Duration;
//!
//! let coord = coord_postgres::connect("postgres://app:secret@db.internal/app?sslmode=verify-full&sslrootcert=/etc/ssl/pg-ca.pem").await?;
//! let locks = coord.locks()?;
//! let guard = locks
//!     .acquire("order_process_42", Duration::from_secs(30), Duration::from_secs(5))
//!     .await?;
//! println!("fencing token {}", guard.fencing_token());
//! guard.release().await?;
//!
//! // Options beyond the URL:
//! let coord = coord_postgres::builder("postgres://app@pgbouncer.internal:6432/app")
//!     .schema("coord_billing")
//!     .call_timeout(Duration::from_secs(2))
//!     .pool_size(8)
//!     // LISTEN cannot work through PgBouncer in transaction mode:
//!     .listen_url("postgres://app@db.internal:5432/app")
//!     .connect()
//!     .await?;
//! # drop(coord); Ok(()) }
//! ```
//!
//! How it works — URLs and options, failover, the tables and functions it
//! keeps, isolation, semaphores, work queues, bounded state, wake-ups,
//! fenced writes, sqlx, and the design choices — is in `docs/postgres.md`
//! in the repository.
#![deny(missing_docs)]

mod backend;
mod builder;
mod config;
mod fenced;
mod sql;
#[cfg(feature = "sqlx")]
mod sqlx_support;

use std::sync::Arc;

pub use backend::{
    CLAIM_LEFT_TTL, PostgresBackend, SEMAPHORE_LEFT_TTL, SEMAPHORE_QUEUE_REFRESH,
    SEMAPHORE_QUEUE_TTL,
};
pub use builder::{
    DEFAULT_BARRIER_ABANDON, DEFAULT_IDLE_GRACE, DEFAULT_POOL_SIZE, DEFAULT_SWEEP_EVERY,
    PostgresBuilder,
};
pub use config::{DEFAULT_SCHEMA, MAX_SCHEMA_LEN, TlsMode};
pub use deadpool_postgres;
pub use fenced::{Column, FencedTable, FencedWrite};
pub use tokio_postgres;

/// The sqlx this crate was built with (feature `sqlx`): use its types
/// (`PgPool`, `Transaction`) to be sure they are the ones
/// [`from_sqlx_pool`] and [`FencedTable::sqlx_update`] take.
#[cfg(feature = "sqlx")]
pub use sqlx;
#[cfg(feature = "sqlx")]
pub use sqlx_support::{SqlxFencedWrite, from_sqlx_options, from_sqlx_pool};

/// Connect with default options (schema `coord`, 5 s call timeout, pool of
/// up to 32, LISTEN on, sweep on). The schema is created on first use.
///
/// Errors: [`Error::Config`](coord_core::Error::Config) for a bad URL,
/// [`Error::Unavailable`](coord_core::Error::Unavailable) when the server
/// cannot be reached, [`Error::Store`](coord_core::Error::Store) when it
/// refuses (authentication, permissions). None of them contains the
/// password.
pub async fn connect(url: &str) -> coord_core::Result<coord_core::Coord> {
    builder(url).connect().await
}

/// Start configuring a connection to `url`.
pub fn builder(url: &str) -> PostgresBuilder {
    PostgresBuilder::new(url)
}

impl PostgresBuilder {
    /// Connect and return a [`Coord`](coord_core::Coord) giving every
    /// primitive.
    pub async fn connect(self) -> coord_core::Result<coord_core::Coord> {
        Ok(self.connect_backend().await?.coord())
    }

    /// Connect and return the backend object itself (for its pool, schema
    /// and channel, or to build a [`Coord`](coord_core::Coord) by hand).
    pub async fn connect_backend(self) -> coord_core::Result<Arc<PostgresBackend>> {
        PostgresBackend::open(self).await
    }
}
