//! Shared by the late-attempt tests (`semaphore_late.rs`,
//! `late_claims/`) and the row-reuse tests (`reuse.rs`, `row_reuse_races/`): a
//! unique schema name, a direct client, a slow one behind a `FaultProxy`
//! that delays every chunk by [`LATENCY`] while the fault is on (a chunk
//! already read keeps its delay after the latency is turned off), with a
//! call timeout of [`CALL_TIMEOUT`] and one pooled connection, and a raw
//! connection for statements the tests run themselves.

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use conformance::testkit::postgres::cluster;
use conformance::testkit::proxy::FaultProxy;
use coord_core::{Attempt, FencingToken};
use coord_postgres::PostgresBackend;
use coord_postgres::tokio_postgres::{self, Client, NoTls};

/// How long the proxy holds every chunk while the fault is on.
pub const LATENCY: Duration = Duration::from_millis(3000);
/// The slow client's call timeout.
pub const CALL_TIMEOUT: Duration = Duration::from_millis(200);
/// When the latency is turned off again, after the slow acquire started:
/// after its first attempt timed out, before its acquire ends (so its
/// release reaches the server at once).
pub const HEAL_AFTER: Duration = Duration::from_millis(300);
pub const LONG: Duration = Duration::from_secs(30);

pub fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A direct client on `schema`, without the background sweep.
pub async fn direct(schema: &str) -> Arc<PostgresBackend> {
    coord_postgres::builder(&cluster().url())
        .schema(schema)
        .sweep_every(None)
        .connect_backend()
        .await
        .expect("connect to the test cluster")
}

/// A client on `schema` through `proxy`: call timeout [`CALL_TIMEOUT`],
/// one pooled connection.
pub async fn slow(schema: &str, proxy: &FaultProxy) -> Arc<PostgresBackend> {
    let pg = cluster();
    let url = pg
        .url()
        .replace(&format!(":{}/", pg.port()), &format!(":{}/", proxy.port()));
    coord_postgres::builder(&url)
        .schema(schema)
        .call_timeout(CALL_TIMEOUT)
        .pool_size(1)
        .sweep_every(None)
        .connect_backend()
        .await
        .expect("connect through the proxy")
}

/// Sleep until `at` + [`LATENCY`] + 1.5 s: every late chunk sent from
/// `at` on has reached the server (and been run) by then.
pub async fn until_late_attempts_landed(at: Instant) {
    tokio::time::sleep_until((at + LATENCY + Duration::from_millis(1500)).into()).await;
}

/// The token of a grant; panics on anything else.
pub fn granted(a: Attempt) -> FencingToken {
    match a {
        Attempt::Granted(t) => t,
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// One statement through `psql` on the test cluster, its output trimmed.
pub fn psql(q: &str) -> String {
    cluster().psql("postgres", q).trim().to_string()
}

/// A connection of its own to the test cluster.
pub async fn raw() -> Client {
    let (client, conn) = tokio_postgres::connect(&cluster().url(), NoTls)
        .await
        .expect("raw connect");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// Waits until at least `n` statements mentioning `schema` wait for a lock.
pub async fn wait_blocked(schema: &str, n: usize) {
    let watcher = raw().await;
    let start = Instant::now();
    loop {
        let rows = watcher
            .query(
                "SELECT count(*) FROM pg_stat_activity \
                  WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1::text || '%' \
                    AND pid <> pg_backend_pid()",
                &[&schema],
            )
            .await
            .unwrap();
        let k: i64 = rows[0].get(0);
        if k as usize >= n {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "only {k} of {n} statements ever waited for a lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
