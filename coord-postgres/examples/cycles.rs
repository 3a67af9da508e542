//! Throughput of uncontended lock cycles (try_acquire + release, a name of
//! its own per task) through coord, beside the raw durable lease-table
//! cycle they are built on and session advisory locks, at 1 and 32
//! concurrent tasks, against a throwaway PostgreSQL 15 cluster that the
//! conformance test kit starts on a loopback port.
//!
//! ```sh
//! cargo run --release -p coord-postgres --example cycles            # 3 s per run
//! cargo run --release -p coord-postgres --example cycles -- 5 1 32  # 5 s, 1 and 32 tasks
//! ```
//!
//! - raw: every task has a connection of its own and runs the cheapest
//!   correct durable cycle: an upsert that takes a free or expired row,
//!   then an owner-checked update that frees it (two prepared statements,
//!   each its own durably committed transaction);
//! - advisory: every task has a connection of its own, and takes and frees
//!   a session advisory lock (no TTL, no fencing, nothing durable);
//! - coord: ONE client (default options) shared by every task.
//!
//! A measuring tool for iterating on the backend, not a test: it asserts
//! nothing about speed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use coord_core::Coord;
use tokio_postgres::{Client, NoTls};

const TTL: Duration = Duration::from_secs(30);

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let secs: f64 = args
        .next()
        .map(|s| s.parse().expect("seconds"))
        .unwrap_or(3.0);
    let mut tasks: Vec<usize> = args.map(|s| s.parse().expect("task count")).collect();
    if tasks.is_empty() {
        tasks = vec![1, 32];
    }
    let run = Duration::from_secs_f64(secs);
    let url = conformance::testkit::postgres::url();
    let coord = coord_postgres::connect(&url).await.expect("coord connect");
    setup_raw(&url).await;
    println!(
        "{:>6} {:>14} {:>14} {:>14} {:>10} {:>10}",
        "tasks", "raw cyc/s", "advisory cyc/s", "coord cyc/s", "coord/raw", "coord/adv"
    );
    for &n in &tasks {
        let raw = measure(n, run, |i| raw_worker(url.clone(), i)).await;
        let adv = measure(n, run, |i| advisory_worker(url.clone(), i)).await;
        let c = measure(n, run, |i| coord_worker(coord.clone(), i)).await;
        println!(
            "{n:>6} {raw:>14.0} {adv:>14.0} {c:>14.0} {:>9.2}x {:>9.2}x",
            c / raw,
            c / adv
        );
    }
}

async fn connect(url: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect");
    tokio::spawn(conn);
    client
}

async fn setup_raw(url: &str) {
    connect(url)
        .await
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS raw_cycle (name text PRIMARY KEY, owner bytea, \
             fencing bigint, expires_at timestamptz); \
             CREATE SEQUENCE IF NOT EXISTS raw_fencing",
        )
        .await
        .expect("raw table");
}

/// What one task does until `stop`: count its cycles in `count`.
type Worker = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Cycles per second of `n` tasks made by `make`, over `run` after a warm-up
/// of a fifth of it.
async fn measure<F>(n: usize, run: Duration, make: F) -> f64
where
    F: Fn(usize) -> Box<dyn FnOnce(Arc<AtomicBool>, Arc<AtomicU64>) -> Worker>,
{
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..n)
        .map(|i| tokio::spawn(make(i)(stop.clone(), count.clone())))
        .collect();
    tokio::time::sleep(run / 5).await;
    let c0 = count.load(Ordering::Relaxed);
    let t0 = Instant::now();
    tokio::time::sleep(run).await;
    let c1 = count.load(Ordering::Relaxed);
    let elapsed = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.expect("worker");
    }
    (c1 - c0) as f64 / elapsed.as_secs_f64()
}

fn raw_worker(url: String, i: usize) -> Box<dyn FnOnce(Arc<AtomicBool>, Arc<AtomicU64>) -> Worker> {
    Box::new(move |stop, count| {
        Box::pin(async move {
            let client = connect(&url).await;
            let take = client
                .prepare(
                    "INSERT INTO raw_cycle AS c (name, owner, fencing, expires_at) \
                     VALUES ($1, $2, nextval('raw_fencing'), clock_timestamp() + interval '30 seconds') \
                     ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, \
                       fencing = nextval('raw_fencing'), expires_at = EXCLUDED.expires_at \
                     WHERE c.owner IS NULL OR c.expires_at <= clock_timestamp() RETURNING c.fencing",
                )
                .await
                .expect("prepare");
            let free = client
                .prepare("UPDATE raw_cycle SET owner = NULL WHERE name = $1 AND owner = $2")
                .await
                .expect("prepare");
            let name = format!("raw-{i}");
            let mut k: u64 = 0;
            while !stop.load(Ordering::Relaxed) {
                k += 1;
                let owner = k.to_le_bytes().to_vec();
                assert_eq!(
                    client.query(&take, &[&name, &owner]).await.unwrap().len(),
                    1
                );
                assert_eq!(client.execute(&free, &[&name, &owner]).await.unwrap(), 1);
                count.fetch_add(1, Ordering::Relaxed);
            }
        })
    })
}

fn advisory_worker(
    url: String,
    i: usize,
) -> Box<dyn FnOnce(Arc<AtomicBool>, Arc<AtomicU64>) -> Worker> {
    Box::new(move |stop, count| {
        Box::pin(async move {
            let client = connect(&url).await;
            let take = client
                .prepare("SELECT pg_try_advisory_lock($1)")
                .await
                .expect("prepare");
            let free = client
                .prepare("SELECT pg_advisory_unlock($1)")
                .await
                .expect("prepare");
            let key = 1_000_000 + i as i64;
            while !stop.load(Ordering::Relaxed) {
                let got: bool = client.query_one(&take, &[&key]).await.unwrap().get(0);
                assert!(got);
                let freed: bool = client.query_one(&free, &[&key]).await.unwrap().get(0);
                assert!(freed);
                count.fetch_add(1, Ordering::Relaxed);
            }
        })
    })
}

fn coord_worker(
    coord: Coord,
    i: usize,
) -> Box<dyn FnOnce(Arc<AtomicBool>, Arc<AtomicU64>) -> Worker> {
    Box::new(move |stop, count| {
        Box::pin(async move {
            let locks = coord.locks().expect("locks");
            let name = format!("cycle-{i}");
            while !stop.load(Ordering::Relaxed) {
                let g = locks
                    .try_acquire(&name, TTL)
                    .await
                    .unwrap()
                    .expect("uncontended");
                g.release().await.unwrap();
                count.fetch_add(1, Ordering::Relaxed);
            }
        })
    })
}
