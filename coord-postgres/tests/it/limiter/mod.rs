//! Rate limiters on the real server: admissions across window boundaries
//! under heavy concurrency, and quota changes carrying the state over.
//!
//! This file holds the helpers the files below share: backends, the wall
//! clock, quotas, and windows kept away from a 600 s boundary.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use conformance::testkit::postgres::cluster;
use coord_core::{Algorithm, Quota};
use coord_postgres::PostgresBackend;

mod quota_changes;
mod state_rows;
mod window_boundaries;

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

async fn backend(pool: usize) -> Arc<PostgresBackend> {
    coord_postgres::builder(&cluster().url())
        .pool_size(pool)
        .call_timeout(Duration::from_secs(10))
        .listen(false)
        .connect_backend()
        .await
        .expect("connect to the test cluster")
}

/// Microseconds since the Unix epoch on this host's wall clock, which is
/// the clock `clock_timestamp()` reads (the server runs on this host).
fn wall_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros() as i64
}

/// Fixed windows of 600 s are aligned to the epoch: keep the quota-change
/// tests off a boundary (a new window may rightly admit afresh).
async fn away_from_a_600s_boundary() {
    let into = wall_us().rem_euclid(600_000_000);
    if into > 600_000_000 - 20_000_000 {
        tokio::time::sleep(Duration::from_micros((600_000_000 - into) as u64 + 100_000)).await;
    }
}

fn quota(algorithm: Algorithm, limit: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(600), algorithm)
}

const ALL: [Algorithm; 4] = [
    Algorithm::SlidingLog,
    Algorithm::SlidingWindow,
    Algorithm::FixedWindow,
    Algorithm::Gcra,
];
