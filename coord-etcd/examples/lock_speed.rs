//! coord's uncontended lock cycle next to etcd's own lock RPC, on a
//! private etcd started by the test kit (a measurement, not a test: it
//! asserts nothing about speed).
//!
//! Each of N tasks (1 and 32) repeats, on a name of its own:
//! - **lock RPC**: `etcd-client`'s `lock` + `unlock` on a lease per task
//!   kept alive for the whole run (what etcd's own lock service costs);
//! - **coord**: `Locks::try_acquire` + `Guard::release`, through the
//!   `Coord` facade (validation, guards, everything a user pays for).
//!
//! For each it prints cycles per second, the client's CPU time per cycle
//! (user + system time of this process, which runs no server), the
//! server's CPU time per cycle (its `process_cpu_seconds_total`) and the gRPC
//! calls the server handled per cycle, by method.
//!
//! ```text
//! cargo run --release -p coord-etcd --example lock_speed [seconds per run, default 2] [rounds, default 3] [raw | coord | rpc | floor] [tasks]
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use conformance::testkit::etcd::EtcdServer;
use etcd_client::{Client, Compare, CompareOp, LockOptions, PutOptions, Txn, TxnOp};

const METHODS: [&str; 6] = [
    "Txn",
    "Range",
    "LeaseGrant",
    "LeaseRevoke",
    "LeaseKeepAlive",
    "Lock",
];
const MORE: [&str; 4] = ["Unlock", "DeleteRange", "Put", "Watch"];

/// User + system CPU time of this process so far (all threads).
fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 (1-based) of the whole line.
    let t = ticks(11) + ticks(12);
    Duration::from_millis(t * 10)
}

fn calls(server: &EtcdServer) -> Vec<f64> {
    let mut v: Vec<f64> = METHODS
        .iter()
        .chain(MORE.iter())
        .map(|m| {
            server.metric(
                "grpc_server_started_total",
                &[&format!("grpc_method=\"{m}\"")],
            )
        })
        .collect();
    // Keepalive messages on open streams (a stream is counted as started
    // once, its messages here).
    v.push(server.metric(
        "grpc_server_msg_received_total",
        &["grpc_method=\"LeaseKeepAlive\""],
    ));
    v
}

struct Run {
    cycles: u64,
    elapsed: Duration,
    cpu: Duration,
    /// The etcd server's CPU time (its `process_cpu_seconds_total`).
    server_cpu: f64,
    calls: Vec<f64>,
}

impl Run {
    fn rate(&self) -> f64 {
        self.cycles as f64 / self.elapsed.as_secs_f64()
    }

    fn print(&self, label: &str, tasks: usize) {
        let per_s = self.cycles as f64 / self.elapsed.as_secs_f64();
        let cpu_us = self.cpu.as_secs_f64() * 1e6 / self.cycles.max(1) as f64;
        let server_us = self.server_cpu * 1e6 / self.cycles.max(1) as f64;
        let per: Vec<String> = METHODS
            .iter()
            .chain(MORE.iter())
            .chain(["keepalive msgs"].iter())
            .zip(&self.calls)
            .filter(|(_, c)| **c > 0.0)
            .map(|(m, c)| format!("{m} {:.2}", c / self.cycles.max(1) as f64))
            .collect();
        println!(
            "{label:>9} tasks={tasks:>2}: {per_s:>8.0} cycles/s, client CPU {cpu_us:>6.0} us/cycle, server CPU {server_us:>6.0} us/cycle, calls/cycle: {}",
            per.join(", ")
        );
    }
}

async fn measure<F, Fut>(server: &EtcdServer, tasks: usize, secs: f64, f: F) -> Run
where
    F: Fn(usize, Arc<AtomicU64>, Instant) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let count = Arc::new(AtomicU64::new(0));
    let before = calls(server);
    let server0 = server.metric("process_cpu_seconds_total", &[]);
    let cpu0 = cpu();
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs_f64(secs);
    let handles: Vec<_> = (0..tasks)
        .map(|i| tokio::spawn(f(i, count.clone(), until)))
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    let elapsed = t0.elapsed();
    let cpu = cpu() - cpu0;
    let after = calls(server);
    Run {
        cycles: count.load(Ordering::Relaxed),
        elapsed,
        cpu,
        server_cpu: server.metric("process_cpu_seconds_total", &[]) - server0,
        calls: after.iter().zip(&before).map(|(a, b)| a - b).collect(),
    }
}

async fn lock_rpc(server: &EtcdServer, tasks: usize, secs: f64) -> Run {
    let client = Client::connect([server.endpoint()], None).await.unwrap();
    // One lease per task, kept alive for the whole run.
    let mut leases = Vec::new();
    let mut keepers = Vec::new();
    for _ in 0..tasks {
        let mut c = client.clone();
        let id = c.lease_grant(30, None).await.unwrap().id();
        let (mut k, mut s) = c.lease_keep_alive(id).await.unwrap();
        keepers.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                if k.keep_alive().await.is_err() || s.message().await.is_err() {
                    return;
                }
            }
        }));
        leases.push(id);
    }
    let run = measure(server, tasks, secs, |i, count, until| {
        let mut c = client.clone();
        let lease = leases[i];
        async move {
            let name = format!("speed-rpc-{i}");
            while Instant::now() < until {
                let r = c
                    .lock(name.as_str(), Some(LockOptions::new().with_lease(lease)))
                    .await
                    .unwrap();
                c.unlock(r.key().to_vec()).await.unwrap();
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
    .await;
    for k in keepers {
        k.abort();
    }
    let mut c = client.clone();
    for id in leases {
        let _ = c.lease_revoke(id).await;
    }
    run
}

/// The floor of coord's scheme, on `etcd-client` directly: a create
/// transaction on the task's lease together with a keepalive of it (on a
/// stream kept open), then a delete transaction.
async fn raw_cycle(server: &EtcdServer, tasks: usize, secs: f64) -> Run {
    let client = Client::connect([server.endpoint()], None).await.unwrap();
    let mut leases = Vec::new();
    for _ in 0..tasks {
        let mut c = client.clone();
        leases.push(c.lease_grant(30, None).await.unwrap().id());
    }
    measure(server, tasks, secs, |i, count, until| {
        let mut c = client.clone();
        let lease = leases[i];
        async move {
            let key = format!("speed-raw-{i}");
            let (mut k, mut s) = c.lease_keep_alive(lease).await.unwrap();
            let mut kv = c.kv_client();
            while Instant::now() < until {
                let txn = Txn::new()
                    .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(
                        key.as_str(),
                        "",
                        Some(PutOptions::new().with_lease(lease)),
                    )]);
                let (r, _) = tokio::join!(kv.txn(txn), async {
                    k.keep_alive().await.unwrap();
                    s.message().await.unwrap().unwrap()
                });
                let rev = r.unwrap().header().unwrap().revision();
                let del = Txn::new()
                    .when([Compare::create_revision(
                        key.as_str(),
                        CompareOp::Equal,
                        rev,
                    )])
                    .and_then([TxnOp::delete(key.as_str(), None)]);
                assert!(kv.txn(del).await.unwrap().succeeded());
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
    .await
}

async fn coord_cycle(server: &EtcdServer, tasks: usize, secs: f64) -> Run {
    let coord = coord_etcd::connect(&server.url()).await.unwrap();
    let locks = coord.locks().unwrap();
    let ttl = Duration::from_secs(30);
    measure(server, tasks, secs, |i, count, until| {
        let locks = locks.clone();
        async move {
            let name = format!("speed-coord-{i}");
            while Instant::now() < until {
                let g = locks
                    .try_acquire(&name, ttl)
                    .await
                    .unwrap()
                    .expect("uncontended");
                g.release().await.unwrap();
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
    .await
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2.0);
    let rounds: usize = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(3);
    // A third argument `raw`: also the floor of coord's scheme. `coord`,
    // `rpc` or `floor`: only that one, at the task count given as the
    // fourth argument (default 1), for a profiler (perf, callgrind).
    let third = std::env::args().nth(3).unwrap_or_default();
    let raw = third == "raw";
    if let "coord" | "rpc" | "floor" | "kv" | "txn" | "txncmp" | "txndel" | "txnrange" =
        third.as_str()
    {
        let tasks: usize = std::env::args()
            .nth(4)
            .and_then(|a| a.parse().ok())
            .unwrap_or(1);
        return profile(&third, tasks, secs, rounds);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = EtcdServer::start();
    rt.block_on(async {
        for tasks in [1usize, 32] {
            // Warm up both (connections, the first leases).
            let _ = lock_rpc(&server, tasks, 0.3).await;
            let _ = coord_cycle(&server, tasks, 0.3).await;
            // Interleaved rounds, so that both see the same load from
            // whatever else runs on the machine; the median ratio.
            let mut ratios = Vec::new();
            for _ in 0..rounds {
                let r = lock_rpc(&server, tasks, secs).await;
                r.print("lock RPC", tasks);
                let c = coord_cycle(&server, tasks, secs).await;
                c.print("coord", tasks);
                if raw {
                    raw_cycle(&server, tasks, secs).await.print("raw floor", tasks);
                }
                ratios.push(c.rate() / r.rate());
            }
            ratios.sort_by(f64::total_cmp);
            println!(
                "    coord / lock RPC at {tasks} tasks: median {:.2}x of {rounds} rounds {ratios:.2?}",
                ratios[ratios.len() / 2]
            );
        }
    });
}

/// One subject alone, `rounds` runs of `secs` at `tasks` tasks.
fn profile(which: &str, tasks: usize, secs: f64, rounds: usize) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = EtcdServer::start();
    rt.block_on(async {
        for _ in 0..rounds {
            let run = match which {
                "coord" => coord_cycle(&server, tasks, secs).await,
                "rpc" => lock_rpc(&server, tasks, secs).await,
                "kv" => kv_cycle(&server, tasks, secs, Shape::Kv).await,
                "txn" => kv_cycle(&server, tasks, secs, Shape::Txn).await,
                "txncmp" => kv_cycle(&server, tasks, secs, Shape::TxnCmp).await,
                "txndel" => kv_cycle(&server, tasks, secs, Shape::TxnDel).await,
                "txnrange" => kv_cycle(&server, tasks, secs, Shape::TxnRange).await,
                _ => raw_cycle(&server, tasks, secs).await,
            };
            run.print(which, tasks);
        }
    });
}

/// The etcd-client calls of one cycle in [`kv_cycle`]: how the key is
/// written on the task's lease, and how it is removed.
#[derive(Clone, Copy)]
enum Shape {
    /// A plain put, then a plain delete.
    Kv,
    /// A txn of the put alone, then a txn of the delete alone.
    Txn,
    /// A put if the key is absent, then a delete if it is present (txns).
    TxnCmp,
    /// The put-if-absent txn, then a plain delete.
    TxnDel,
    /// As coord's try_acquire: a put of an owner's key if no key is under
    /// the name's prefix (a range compare), then a plain delete.
    TxnRange,
}

/// The raw etcd-client calls of a cycle, shaped as `shape` says, each task
/// on a lease of its own.
async fn kv_cycle(server: &EtcdServer, tasks: usize, secs: f64, shape: Shape) -> Run {
    let client = Client::connect([server.endpoint()], None).await.unwrap();
    let mut leases = Vec::new();
    for _ in 0..tasks {
        let mut c = client.clone();
        leases.push(c.lease_grant(30, None).await.unwrap().id());
    }
    measure(server, tasks, secs, |i, count, until| {
        let mut kv = client.kv_client();
        let lease = leases[i];
        async move {
            let prefix = format!("speed-kv-{i}/");
            let end = format!("speed-kv-{i}0");
            let key = format!("{prefix}0123456789abcdef0123456789abcdef");
            let on_lease = || Some(PutOptions::new().with_lease(lease));
            let absent = || Compare::create_revision(key.as_str(), CompareOp::Equal, 0);
            while Instant::now() < until {
                let put = TxnOp::put(key.as_str(), key.as_str(), on_lease());
                match shape {
                    Shape::Kv => {
                        kv.put(key.as_str(), key.as_str(), on_lease())
                            .await
                            .unwrap();
                    }
                    Shape::Txn => {
                        kv.txn(Txn::new().and_then([put])).await.unwrap();
                    }
                    Shape::TxnCmp | Shape::TxnDel => {
                        kv.txn(Txn::new().when([absent()]).and_then([put]))
                            .await
                            .unwrap();
                    }
                    Shape::TxnRange => {
                        let empty = Compare::version(prefix.as_str(), CompareOp::Equal, 0)
                            .with_range(end.as_str());
                        kv.txn(Txn::new().when([empty]).and_then([put]))
                            .await
                            .unwrap();
                    }
                }
                let del = TxnOp::delete(key.as_str(), None);
                match shape {
                    Shape::Txn => {
                        kv.txn(Txn::new().and_then([del])).await.unwrap();
                    }
                    Shape::TxnCmp => {
                        let present = Compare::create_revision(key.as_str(), CompareOp::Greater, 0);
                        kv.txn(Txn::new().when([present]).and_then([del]))
                            .await
                            .unwrap();
                    }
                    Shape::Kv | Shape::TxnDel | Shape::TxnRange => {
                        kv.delete(key.as_str(), None).await.unwrap();
                    }
                }
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
    .await
}
