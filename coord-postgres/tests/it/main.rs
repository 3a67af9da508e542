//! coord-postgres's integration tests, one binary: each module checks one
//! behaviour against a real PostgreSQL 15 (directly, through PgBouncer,
//! under failover) started by the test kit.
//!
//! Beside it: `faults` (freezes and crashes the kit's cluster; its time
//! bounds assume nothing else runs) and `alone` (tests that need the
//! cluster to themselves, one at a time).

mod support;

mod barrier;
mod barrier_late;
mod barrier_lost_state;
mod health;
mod inspect;
mod late_claims;
mod late_pop;
mod limiter;
mod lock_timeout;
mod metrics_recorded;
mod pool;
mod postgres_specific;
mod queue_same_delivery_races;
mod release_in_an_outage;
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
