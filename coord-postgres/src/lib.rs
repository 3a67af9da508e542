//! # coord-postgres
//!
//! The PostgreSQL backend of coord: locks, leases, fencing tokens, leader
//! election, barriers and rate limiters on ordinary tables, with expiry
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
//! ## URLs
//!
//! `postgres://` or `postgresql://`, as libpq takes them: user, password,
//! host (or `?host=/run/postgresql` for a unix socket), port, database and
//! tokio-postgres options (`connect_timeout`, `application_name`, ...).
//! Handled by coord: `sslmode` (`disable`, `prefer` — the default —,
//! `require`, `verify-ca`, `verify-full`, with libpq's meaning),
//! `sslrootcert` (a PEM file of CA certificates), `coord_schema` and
//! `coord_listen=false`. The password is kept in a
//! [`Secret`](coord_core::util::Secret) and never appears in `Debug`,
//! `Display`, errors or logs.
//!
//! ## Layout
//!
//! Everything lives in one schema (default `coord`; it plays the role of
//! other backends' key prefix), created on first use with `IF NOT EXISTS`
//! in one transaction that holds `pg_advisory_xact_lock`, so clients
//! starting together on an empty database never fail:
//!
//! | object | what |
//! |---|---|
//! | `claims (kind, name, owner, candidate, fencing, expires_at)` | locks, leases and leaderships (`kind` = `lock`, `lease`, `election`: the kind segment); rows are kept on release |
//! | sequence `fencing` | every fencing token and election term; WAL-logged, so tokens never repeat across restarts or crashes |
//! | `barriers (name, parties, generation, members, passed)` and function `barrier_arrive` | barriers |
//! | `limiter_state (algorithm, key, ...)`, `limiter_log (key, at, cost)` and function `limiter_check` | rate limiters (sliding log: one row per admitted request) |
//! | `meta (version)` | layout version |
//!
//! A lock attempt is ONE statement: a plain read of the row, then, only
//! when that row looked free, expired or already ours, an `INSERT ... ON
//! CONFLICT DO UPDATE ... WHERE` the row still is, which draws the fencing
//! token in the same statement. When the row is held by another, the
//! attempt returns the holder's remaining time on the database clock and
//! takes no row lock, no transaction id and writes nothing, so polling
//! waiters never queue behind (or in front of) the holder's extend.
//! Release is one compare-and-release `UPDATE` that sends `pg_notify` in the
//! same statement. An uncontended acquire + release is two statements.
//!
//! Every statement runs in its own transaction, pipelined with it in the
//! same round trip: `BEGIN; SET LOCAL statement_timeout = <call timeout>`
//! and `synchronous_commit` raised to `on` when the server's or the role's
//! default is `off` or `local`, then the statement, then `COMMIT`. So
//! grants (locks, leases, terms, barrier arrivals, fencing tokens) are
//! durable whatever the defaults, and the server gives up when the client
//! does. When the client's call timeout passes first, the connection is
//! discarded and a cancel request stops its statement on the server.
//!
//! | trait | statements (one round trip each) |
//! |---|---|
//! | [`Lock`](coord_core::Lock) | `try_acquire`: the upsert above; `release` / `force_release`: one `UPDATE ... RETURNING` joined with `pg_notify`; `extend`: one compare-and-expire `UPDATE` |
//! | [`Lease`](coord_core::Lease) | the same statements on `kind = 'lease'` (no NOTIFY); `remaining`: one `SELECT` |
//! | [`Election`](coord_core::Election) | the same upsert on `kind = 'election'` with the candidate, sending NOTIFY when a new term starts; `resign` notifies; `leader`: one `SELECT` |
//! | [`FencingSource`](coord_core::FencingSource) | `SELECT nextval(...)` |
//! | [`Barrier`](coord_core::Barrier) | `arrive`: one call of `barrier_arrive` (row locked `FOR UPDATE`, NOTIFY on completion); `is_complete`, `withdraw`: one statement each |
//! | [`Limiter`](coord_core::Limiter) | one call of `limiter_check` |
//!
//! Rate limiting: every algorithm decides on the database clock, read
//! AFTER the key's row lock is taken, so a check that waited for the lock
//! across a window boundary decides on the time it got it (windows never
//! move backwards). A check first decides on an unlocked read; a denial
//! found there is final (admissions only ever add to the state) and writes
//! nothing. An admission is decided again and recorded under the row lock.
//! The state keeps the quota it was written under, so a quota change
//! carries it over and never grants a fresh allowance (see
//! `src/sql/limiter.sql` for each algorithm's rule; GCRA is exact numeric
//! arithmetic). Limiter commits are asynchronous
//! (`synchronous_commit = off`, local to that transaction), so a hot key is
//! not held to one check per WAL flush; a server crash may forget the last
//! fraction of a second of admissions.
//!
//! No session state is used (no advisory session locks, no named prepared
//! statements: every statement goes out as one unnamed, typed
//! Parse/Bind/Execute), so statements work through PgBouncer in
//! transaction pooling mode.
//!
//! Behind PgBouncer, how soon clients recover after PostgreSQL restarts
//! is PgBouncer's call: once a login to the server fails (as it does while
//! the server is coming back), PgBouncer refuses every client of that pool
//! for `server_login_retry` (15 s by default) before it tries again, and
//! every coord call fails meanwhile. Set `server_login_retry = 1` in
//! `pgbouncer.ini` for recovery within about a second of the server's
//! return (the fault suite runs PgBouncer so; with the default, a crash
//! restart stalled the suite's clients for 3.5-5 s after the server was
//! back).
//!
//! ## Wake-ups
//!
//! Each client opens one extra connection that `LISTEN`s on
//! `<schema>_wake`; payloads are `<kind>:<name>` and are dispatched to the
//! local waiters through [`Wakeups`](coord_core::wake::Wakeups) (one waiter
//! per lock release, every waiter for elections and barriers). At start the
//! connection sends itself a probe notification; if it does not come back
//! (PgBouncer in transaction mode) or LISTEN fails for good (a refused
//! password, say), [`Capabilities::notifications`](coord_core::Capabilities)
//! is false and waiters poll. When it cannot connect at start (a
//! retryable error), it keeps trying in the background like after a lost
//! connection, and waiters poll until it is in. Give [`PostgresBuilder::listen_url`] a direct URL to keep
//! wake-ups behind PgBouncer, or turn listening off
//! ([`PostgresBuilder::listen`], `coord_listen=false`) to skip the probe,
//! which waits up to 2 s for a notification that never comes. The connection is checked
//! (an empty query, bounded by the connect timeout) every 15 s and at once
//! whenever a statement call times out or gets no connection, so a
//! half-open connection (silently dead path) is replaced within about a
//! call timeout; it reconnects with backoff and
//! then wakes every local waiter once. It ends when the client is dropped.
//!
//! ## Fenced writes
//!
//! [`FencedTable`] updates rows of your own tables only when the caller's
//! fencing token is >= the row's stored token (see
//! `examples/fenced_write.rs`).
//!
//! ## Why tokio-postgres (with deadpool-postgres) and not sqlx
//!
//! - `LISTEN`: tokio-postgres hands out the raw connection, whose
//!   `poll_message` yields notifications; we own that connection's
//!   lifecycle (probe, reconnect, `notify_every`) directly.
//! - PgBouncer: `query_typed` sends one unnamed Parse/Bind/Execute with the
//!   parameter types given, so every statement is one round trip and needs
//!   no named prepared statement (sqlx prepares and caches named
//!   statements per connection, which breaks under transaction pooling
//!   unless disabled).
//! - Size: no macros, no compile-time database, no other drivers; the pool
//!   is the small deadpool-postgres, recycling closed connections
//!   cheaply (`is_closed`) so a server restart heals by itself.
//! - TLS is rustls (ring), with libpq's `sslmode` semantics implemented
//!   here.
#![deny(missing_docs)]

mod backend;
mod config;
mod fenced;
mod listen;
mod sql;

use std::sync::Arc;

pub use backend::PostgresBackend;
pub use config::{DEFAULT_SCHEMA, MAX_SCHEMA_LEN, PostgresBuilder, TlsMode};
pub use deadpool_postgres;
pub use fenced::{Column, FencedTable, FencedWrite};
pub use tokio_postgres;

/// Connect with default options (schema `coord`, 5 s call timeout, pool of
/// 8, LISTEN on). The schema is created on first use.
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
