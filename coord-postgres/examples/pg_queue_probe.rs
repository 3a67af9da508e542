//! Where the time of a work queue cycle (push + pop + ack, each task on
//! one queue) goes on the server: cycles per second, commits and WAL
//! bytes per cycle, the backends' wait events sampled every 5 ms, and,
//! when the server has them, the statements' and functions' own time
//! (`pg_stat_statements` with `track = all`, `track_functions = all`).
//!
//! ```sh
//! PROBE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!   cargo run --release -p coord-postgres --example pg_queue_probe -- 5 1 16
//! ```
//!
//! Arguments: seconds per run (default 5), then task counts (default 1
//! and 16). Without `PROBE_URL` it runs on a cluster the test kit starts.
//! A measuring tool: it asserts nothing about speed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls};

const VISIBILITY: Duration = Duration::from_secs(30);

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let secs: u64 = args
        .next()
        .map(|s| s.parse().expect("seconds"))
        .unwrap_or(5);
    let mut tasks: Vec<usize> = args.map(|s| s.parse().expect("task count")).collect();
    if tasks.is_empty() {
        tasks = vec![1, 16];
    }
    let url = std::env::var("PROBE_URL")
        .unwrap_or_else(|_| conformance::testkit::postgres::cluster().url());
    let admin = connect(&url).await;
    let coord = Arc::new(coord_postgres::connect(&url).await.expect("coord connect"));
    let queues = coord.queues().expect("queues");
    for &n in &tasks {
        let name = format!("probe-{n}-{}", std::process::id());
        // Warm up: every statement planned on every connection.
        run(&queues, &name, n, Duration::from_millis(500)).await;
        let stats = admin
            .query_one(
                "SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'",
                &[],
            )
            .await
            .is_ok();
        if stats {
            admin
                .batch_execute("SELECT pg_stat_statements_reset(); SELECT pg_stat_reset();")
                .await
                .expect("reset");
        }
        let before = counters(&admin).await;
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (url, stop) = (url.clone(), stop.clone());
            tokio::spawn(async move { sample_waits(&url, &stop).await })
        };
        let t = Instant::now();
        let cycles = run(&queues, &name, n, Duration::from_secs(secs)).await;
        let el = t.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let waits = sampler.await.expect("sampler");
        let after = counters(&admin).await;
        println!(
            "\n{n} tasks: {:.0} cycles/s, {:.2} commits and {:.0} WAL bytes per cycle",
            cycles as f64 / el,
            (after.0 - before.0) as f64 / cycles as f64,
            (after.1 - before.1) as f64 / cycles as f64
        );
        println!("  wait events (5 ms samples of active backends):");
        for (w, c) in &waits {
            println!("    {c:>7}  {w}");
        }
        if stats {
            print_stats(&admin, cycles).await;
        }
        queues.purge(&name).await.expect("purge");
    }
}

async fn connect(url: &str) -> Client {
    let (c, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect");
    tokio::spawn(conn);
    c
}

/// Cycles done by `n` tasks on queue `name` in `d`.
async fn run(q: &coord_core::Queues, name: &str, n: usize, d: Duration) -> u64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (q, name, stop, done) = (q.clone(), name.to_string(), stop.clone(), done.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    q.push(&name, b"m").await.expect("push");
                    let d = q.pop(&name, VISIBILITY, Duration::from_secs(5)).await;
                    d.expect("pop")
                        .expect("a pushed message is there")
                        .ack()
                        .await
                        .expect("ack");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(d).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("task");
    }
    done.load(Ordering::Relaxed)
}

/// Commits and WAL bytes so far.
async fn counters(c: &Client) -> (i64, i64) {
    let r = c
        .query_one(
            "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
                    pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8",
            &[],
        )
        .await
        .expect("counters");
    (r.get(0), r.get(1))
}

/// The wait events of the active backends (other than this sampler's),
/// every 5 ms until `stop`, counted.
async fn sample_waits(url: &str, stop: &AtomicBool) -> BTreeMap<String, u64> {
    let c = connect(url).await;
    let mut seen = BTreeMap::new();
    while !stop.load(Ordering::Relaxed) {
        let rows = c
            .query(
                "SELECT coalesce(wait_event_type || ':' || wait_event, 'running')
                   FROM pg_stat_activity
                  WHERE state = 'active' AND pid <> pg_backend_pid()
                    AND backend_type = 'client backend'",
                &[],
            )
            .await
            .expect("sample");
        for r in rows {
            *seen.entry(r.get::<_, String>(0)).or_insert(0) += 1;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    seen
}

async fn print_stats(c: &Client, cycles: u64) {
    // Every statement run, nested ones included (`track = all`), but the
    // probe's own.
    let r = c
        .query_one(
            "SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_statements
              WHERE query NOT LIKE '%pg_stat%' AND query NOT LIKE '%pg_wal_lsn_diff%'",
            &[],
        )
        .await
        .expect("statement count");
    let calls: i64 = r.get(0);
    println!(
        "  {:.1} statements per cycle, nested ones included",
        calls as f64 / cycles as f64
    );
    println!("  statements by own time (µs per cycle, calls per cycle, mean µs):");
    let rows = c
        .query(
            "SELECT total_exec_time, calls, left(regexp_replace(query, '\\s+', ' ', 'g'), 110)
               FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 25",
            &[],
        )
        .await
        .expect("statements");
    for r in rows {
        let (ms, calls, q): (f64, i64, String) = (r.get(0), r.get(1), r.get(2));
        println!(
            "    {:>8.1} {:>6.2} {:>8.1}  {q}",
            ms * 1000.0 / cycles as f64,
            calls as f64 / cycles as f64,
            ms * 1000.0 / calls.max(1) as f64
        );
    }
    println!("  functions (total and self µs per cycle, calls per cycle):");
    let rows = c
        .query(
            "SELECT funcname, total_time, self_time, calls FROM pg_stat_user_functions
              ORDER BY total_time DESC LIMIT 15",
            &[],
        )
        .await
        .expect("functions");
    for r in rows {
        let (f, total, own, calls): (String, f64, f64, i64) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        println!(
            "    {:>8.1} {:>8.1} {:>6.2}  {f}",
            total * 1000.0 / cycles as f64,
            own * 1000.0 / cycles as f64,
            calls as f64 / cycles as f64
        );
    }
}
