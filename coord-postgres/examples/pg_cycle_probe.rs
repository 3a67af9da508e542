//! What one uncontended lock cycle costs the server, coord against the
//! raw durable lease-table cycle of `coord-bench` (the same upsert and
//! owner-checked update, each task on its own connection): cycles per
//! second, commits (`pg_stat_database.xact_commit`), transaction ids,
//! WAL bytes and statements per cycle, client CPU per cycle, the
//! connections coord's pool opened, and the statements' server time from
//! `pg_stat_statements` when the server has it loaded.
//!
//! ```sh
//! PROBE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!   cargo run --release -p coord-postgres --example pg_cycle_probe -- 5 1 32
//! ```
//!
//! Arguments: seconds per run (default 5), then task counts (default 1
//! and 32). Without `PROBE_URL` it runs on a cluster the test kit starts
//! (and measures its server's CPU without `PROBE_PGPID`).
//! `PROBE_ONLY=coord|raw|refused` runs one kind (`refused`: `try_acquire`
//! on names another owner holds). A measuring tool: it asserts nothing
//! about speed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls};

const TTL: Duration = Duration::from_secs(30);

const TAKE: &str = "INSERT INTO probe_raw AS r (name, owner, expires_at) \
     VALUES ($1, $2, clock_timestamp() + interval '30 seconds') \
     ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at \
     WHERE r.owner IS NULL OR r.expires_at <= clock_timestamp()";
const FREE: &str = "UPDATE probe_raw SET owner = NULL WHERE name = $1 AND owner = $2";

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let secs: u64 = args
        .next()
        .map(|s| s.parse().expect("seconds"))
        .unwrap_or(5);
    let mut tasks: Vec<usize> = args.map(|s| s.parse().expect("task count")).collect();
    if tasks.is_empty() {
        tasks = vec![1, 32];
    }
    let url = std::env::var("PROBE_URL").unwrap_or_else(|_| {
        // The test kit's own server: its postmaster is known.
        let pg = conformance::testkit::postgres::cluster();
        if let Some(pm) = pg.pids().first() {
            let _ = POSTMASTER.set(pm.to_string());
        }
        pg.url()
    });
    let only = std::env::var("PROBE_ONLY").unwrap_or_default();
    let runs = |what: &str| only.is_empty() || only == what;
    let admin = connect(&url).await;
    admin
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS probe_raw \
             (name text PRIMARY KEY, owner text, expires_at timestamptz)",
        )
        .await
        .expect("raw table");
    let coord = coord_postgres::connect(&url).await.expect("coord connect");
    let run = Duration::from_secs(secs);
    println!(
        "{:>8} {:>5} {:>9} {:>8} {:>7} {:>7} {:>9} {:>8} {:>8} {:>6}",
        "what",
        "tasks",
        "cycles/s",
        "commits",
        "xids",
        "WAL B",
        "stmts",
        "cpu us",
        "srv us",
        "conns"
    );
    for &n in &tasks {
        if runs("raw") {
            let m = measure(&admin, n, run, |i| raw_worker(url.clone(), i)).await;
            m.print("raw", n);
        }
        if runs("coord") {
            let m = measure(&admin, n, run, |i| coord_worker(coord.clone(), i, false)).await;
            m.print("coord", n);
        }
        if runs("refused") {
            let m = measure(&admin, n, run, |i| coord_worker(coord.clone(), i, true)).await;
            m.print("refused", n);
        }
    }
}

async fn connect(url: &str) -> Arc<Client> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect");
    tokio::spawn(conn);
    Arc::new(client)
}

/// One task's loop, counting its cycles until `stop`.
type Worker = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
type MakeWorker = Box<dyn FnOnce(Arc<AtomicBool>, Arc<AtomicU64>) -> Worker>;

fn raw_worker(url: String, i: usize) -> MakeWorker {
    Box::new(move |stop, count| {
        Box::pin(async move {
            let client = connect(&url).await;
            let take = client.prepare(TAKE).await.expect("prepare");
            let free = client.prepare(FREE).await.expect("prepare");
            let name = format!("probe-raw-{}-{i}", std::process::id());
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                k += 1;
                let owner = k.to_string();
                let took = client.execute(&take, &[&name, &owner]).await.expect("take");
                assert_eq!(took, 1);
                let freed = client.execute(&free, &[&name, &owner]).await.expect("free");
                assert_eq!(freed, 1);
                count.fetch_add(1, Ordering::Relaxed);
            }
        })
    })
}

/// A coord cycle on a name of its own, or (`refused`) a `try_acquire` of
/// a name another owner holds.
fn coord_worker(coord: coord_core::Coord, i: usize, refused: bool) -> MakeWorker {
    Box::new(move |stop, count| {
        Box::pin(async move {
            let locks = coord.locks().expect("locks");
            let name = format!("probe-coord-{}-{i}-{refused}", std::process::id());
            let _held = if refused {
                Some(
                    locks
                        .try_acquire(&name, TTL)
                        .await
                        .expect("hold")
                        .expect("free"),
                )
            } else {
                None
            };
            while !stop.load(Ordering::Relaxed) {
                let g = locks.try_acquire(&name, TTL).await.expect("try_acquire");
                match (g, refused) {
                    (Some(g), false) => g.release().await.expect("release"),
                    (None, true) => {}
                    (g, _) => panic!("unexpected attempt result: granted {}", g.is_some()),
                }
                count.fetch_add(1, Ordering::Relaxed);
            }
        })
    })
}

/// Server counters at one moment.
#[derive(Clone, Copy)]
struct Counters {
    commits: i64,
    xid: i64,
    wal: i64,
    statements: i64,
    conns: i64,
}

async fn counters(admin: &Client) -> Counters {
    let row = admin
        .query_one(
            "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()), \
                    pg_current_xact_id()::text::int8, \
                    (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8, \
                    (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')",
            &[],
        )
        .await
        .expect("counters");
    let statements = match admin
        .query_one(
            "SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_statements \
             WHERE query NOT LIKE '%pg_stat%'",
            &[],
        )
        .await
    {
        Ok(r) => r.get(0),
        Err(_) => 0,
    };
    Counters {
        commits: row.get(0),
        xid: row.get(1),
        wal: row.get(2),
        statements,
        conns: row.get(3),
    }
}

struct Measured {
    rate: f64,
    per_cycle: [f64; 4],
    cpu_us: f64,
    server_us: f64,
    conns: i64,
}

impl Measured {
    fn print(&self, what: &str, n: usize) {
        let [c, x, w, s] = self.per_cycle;
        println!(
            "{what:>8} {n:>5} {:>9.0} {c:>8.2} {x:>7.2} {w:>7.0} {s:>9.2} {:>8.1} {:>8.1} {:>6}",
            self.rate, self.cpu_us, self.server_us, self.conns
        );
    }
}

/// Cycles of `n` tasks over `run` after a 1 s warm-up, with the server
/// counters' deltas per cycle and the client's CPU per cycle. The
/// counters' own statements (one snapshot before, one after) are
/// negligible beside thousands of cycles.
async fn measure<F>(admin: &Client, n: usize, run: Duration, make: F) -> Measured
where
    F: Fn(usize) -> MakeWorker,
{
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..n)
        .map(|i| tokio::spawn(make(i)(stop.clone(), count.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _ = admin
        .batch_execute("SELECT pg_stat_statements_reset()")
        .await;
    let before = counters(admin).await;
    let (c0, t0, cpu0, srv0) = (
        count.load(Ordering::Relaxed),
        Instant::now(),
        cpu_time(),
        server_cpu(),
    );
    tokio::time::sleep(run).await;
    let conns = counters(admin).await.conns;
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.expect("worker");
    }
    let (c1, elapsed, cpu) = (
        count.load(Ordering::Relaxed),
        t0.elapsed(),
        cpu_time() - cpu0,
    );
    let srv = server_cpu().saturating_sub(srv0);
    // pg_stat_database is sent by backends when idle, at most every second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let after = counters(admin).await;
    let cycles = (c1 - c0).max(1) as f64;
    let d = |a: i64, b: i64| (a - b) as f64 / cycles;
    Measured {
        rate: cycles / elapsed.as_secs_f64(),
        per_cycle: [
            d(after.commits, before.commits),
            d(after.xid, before.xid),
            d(after.wal, before.wal),
            d(after.statements, before.statements),
        ],
        cpu_us: cpu.as_secs_f64() * 1e6 / cycles,
        server_us: srv.as_secs_f64() * 1e6 / cycles,
        conns,
    }
}

/// This process's CPU time so far (user + system), from /proc/self/stat.
fn cpu_time() -> Duration {
    proc_cpu("self", false)
}

/// The test kit's postmaster, when the probe runs on the server it starts.
static POSTMASTER: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The CPU time so far of the server's processes: the children of the
/// postmaster whose pid is `PROBE_PGPID` (or the test kit's, when it
/// started the server; none otherwise).
fn server_cpu() -> Duration {
    let Some(pm) = std::env::var("PROBE_PGPID")
        .ok()
        .or_else(|| POSTMASTER.get().cloned())
    else {
        return Duration::ZERO;
    };
    let mut total = Duration::ZERO;
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = e.file_name().to_string_lossy().to_string();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        if rest.split_whitespace().nth(1) == Some(pm.as_str()) {
            total += proc_cpu(&pid, false);
        } else if pid == pm {
            // With its exited children (backends of connections closed
            // during the run: the raw tasks' own connections).
            total += proc_cpu(&pid, true);
        }
    }
    total
}

/// The CPU time (user + system) of process `pid` so far, and with
/// `children` that of its children it has waited for.
fn proc_cpu(pid: &str, children: bool) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let field = |i: usize| f.get(i).copied().unwrap_or(0);
    let mut ticks = field(11) + field(12);
    if children {
        ticks += field(13) + field(14);
    }
    Duration::from_millis(ticks * 10)
}
