//! coord-postgres's integration tests, one binary: each module checks one
//! behaviour against a real PostgreSQL 15 (directly, through PgBouncer,
//! under failover) started by the test kit.
//!
//! Binaries of their own, because they need the kit's shared cluster to
//! themselves: `faults` (freezes and crashes it; its time bounds assume
//! nothing else runs), `durability`, `semaphore_durability`, `restart` and
//! `queue` (crash or restart it, or change its settings), `isolation`
//! (changes the superuser's default isolation level), `claims`, `refused`
//! and `semaphore` (count the transaction ids the whole cluster assigns)
//! and `listen` (counts the cluster's listening sessions). `soak` too: it
//! keeps 64 connections busy for tens of seconds, which would starve the
//! time-bounded tests beside it.

mod support;

mod barrier;
mod barrier_late;
mod barrier_lost_state;
mod inspect;
mod late_claims;
mod late_pop;
mod limiter;
mod lock_timeout;
mod metrics_recorded;
mod pool;
mod postgres_specific;
mod queue_same_delivery_races;
mod reuse;
mod row_reuse_races;
mod same_owner_one_client;
mod semaphore_late;
#[cfg(feature = "sqlx")]
mod sqlx_transactions;
mod suite_direct;
mod suite_failover;
mod suite_pgbouncer;
mod tls;
mod wakeups;
