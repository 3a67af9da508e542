//! PostgreSQL-specific behaviour: first use by many clients at once, SCRAM
//! authentication, the fenced-write helper, PgBouncer with a direct LISTEN
//! URL, the database clock, the listener's lifetime, and the queue steps'
//! plans.

use std::sync::atomic::{AtomicU64, Ordering};

mod authentication_and_urls;
mod database_clock;
mod fenced_write;
mod first_use_and_schema;
mod pgbouncer_and_listening;
mod queue_plans;

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}
