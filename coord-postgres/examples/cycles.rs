//! Throughput of uncontended lock cycles (try_acquire + release, a name of
//! its own per task) through coord, beside the raw durable lease-table
//! cycle they are built on and session advisory locks, at 1 and 32
//! concurrent tasks, against a throwaway PostgreSQL 15 cluster that the
//! conformance test kit starts on a loopback port.
//!
//! ```sh
//! cargo run --release -p coord-postgres --example cycles             # 10 s each
//! cargo run --release -p coord-postgres --example cycles -- 20 1 32  # 20 s, 1 and 32 tasks
//! cargo run --release -p coord-postgres --example cycles -- nofsync   # CPU, not the disk
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
//! The last two columns are the client process's CPU time per cycle (µs),
//! raw and coord.
//!
//! Each contender runs in 1 s slices, interleaved with the others, and
//! the rates are averaged: on a shared machine the disk's flush time
//! drifts, and it weighs on each alike. A measuring tool for iterating on
//! the backend, not a test: it asserts nothing about speed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use coord_core::Coord;
use tokio_postgres::{Client, NoTls};

const TTL: Duration = Duration::from_secs(30);

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1).peekable();
    // `nofsync` first: the server flushes nothing (fsync = off), so the
    // numbers show the CPU each cycle costs rather than the disk.
    let nofsync = args.next_if(|a| a == "nofsync").is_some();
    let secs: f64 = args
        .next()
        .map(|s| s.parse().expect("seconds"))
        .unwrap_or(10.0);
    let mut tasks: Vec<usize> = args.map(|s| s.parse().expect("task count")).collect();
    if tasks.is_empty() {
        tasks = vec![1, 32];
    }
    let run = Duration::from_secs_f64(secs);
    let url = conformance::testkit::postgres::url();
    if nofsync {
        let pg = conformance::testkit::postgres::cluster();
        pg.psql("postgres", "ALTER SYSTEM SET fsync = off");
        pg.psql("postgres", "SELECT pg_reload_conf()");
    }
    let coord = coord_postgres::connect(&url).await.expect("coord connect");
    setup_raw(&url).await;
    println!(
        "{:>6} {:>14} {:>14} {:>14} {:>10} {:>10} {:>9} {:>9}",
        "tasks",
        "raw cyc/s",
        "advisory cyc/s",
        "coord cyc/s",
        "coord/raw",
        "coord/adv",
        "raw cpu",
        "coord cpu"
    );
    // Short slices, interleaved, so that the load of a shared machine
    // (the disk's flush time above all) weighs on every contender alike.
    let rounds = (secs.ceil() as usize).max(1);
    let slice = run / rounds as u32;
    for &n in &tasks {
        let (mut raw, mut adv, mut c) = (Tally::default(), Tally::default(), Tally::default());
        // `CYCLES_ONLY=raw|advisory|coord` runs one contender (to profile it).
        let only = std::env::var("CYCLES_ONLY").unwrap_or_default();
        let runs = |what: &str| only.is_empty() || only == what;
        for _ in 0..rounds {
            if runs("raw") {
                raw.add(measure(n, slice, |i| raw_worker(url.clone(), i)).await);
            }
            if only == "rawdel" {
                // Not in the default run: the raw cycle with a delete for
                // the release (a row per held name only).
                raw.add(measure(n, slice, |i| raw_worker_del(url.clone(), i)).await);
            }
            if runs("advisory") {
                adv.add(measure(n, slice, |i| advisory_worker(url.clone(), i)).await);
            }
            if runs("coord") {
                c.add(measure(n, slice, |i| coord_worker(coord.clone(), i)).await);
            }
        }
        let r = rounds as f64;
        let (rr, ar, cr) = (raw.rate / r, adv.rate / r, c.rate / r);
        println!(
            "{n:>6} {rr:>14.0} {ar:>14.0} {cr:>14.0} {:>9.2}x {:>9.2}x {:>9.0} {:>9.0}",
            cr / rr,
            cr / ar,
            raw.cpu_us(),
            c.cpu_us()
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

/// This process's CPU time so far (user + system), from /proc/self/stat.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name (which is in parentheses).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15 of the line: 11 and 12 here.
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// Cycles per second of `n` tasks made by `make`, over `run` after a
/// warm-up of a fifth of it, and the client's CPU time over the run.
async fn measure<F>(n: usize, run: Duration, make: F) -> (f64, Duration, u64)
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
    let (t0, cpu0) = (Instant::now(), cpu_time());
    tokio::time::sleep(run).await;
    let c1 = count.load(Ordering::Relaxed);
    let (elapsed, cpu) = (t0.elapsed(), cpu_time() - cpu0);
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.expect("worker");
    }
    ((c1 - c0) as f64 / elapsed.as_secs_f64(), cpu, c1 - c0)
}

/// Sums of [`measure`] results over the rounds.
#[derive(Default)]
struct Tally {
    rate: f64,
    cpu: Duration,
    cycles: u64,
}

impl Tally {
    fn add(&mut self, (rate, cpu, cycles): (f64, Duration, u64)) {
        self.rate += rate;
        self.cpu += cpu;
        self.cycles += cycles;
    }

    /// Client CPU per cycle, in µs.
    fn cpu_us(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.cycles.max(1) as f64
    }
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

fn raw_worker_del(
    url: String,
    i: usize,
) -> Box<dyn FnOnce(Arc<AtomicBool>, Arc<AtomicU64>) -> Worker> {
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
                .prepare("DELETE FROM raw_cycle WHERE name = $1 AND owner = $2")
                .await
                .expect("prepare");
            let name = format!("rawdel-{i}");
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
