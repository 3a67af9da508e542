//! Where the time of a Redis lock cycle goes at 32 concurrent tasks: raw
//! commands (`SET NX PX` + a compare-and-delete script), the backend's
//! scripts through the `Lock` trait, and the whole coord `Locks` API,
//! interleaved in 1 s slices on one server, with the client's and the
//! server's CPU time per cycle. A profiling aid next to `coord-bench`.
//!
//! `cargo run --release -p coord-redis --example cycle_probe`; with
//! `PROBE_ONLY=trait` (or `coord`) only that path runs, 10 s, for a
//! profiler (`perf record -p <pid>`), then the server's `commandstats`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use coord_core::{Lock, OwnerToken};
use coord_redis::{RedisBackend, RedisOptions};

const TASKS: usize = 32;
const TTL: Duration = Duration::from_secs(30);

async fn slice<F, Fut>(f: F) -> f64
where
    F: Fn(usize) -> Fut + Send + Sync + 'static + Clone,
    Fut: std::future::Future<Output = ()> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let n = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let (stop, n, f) = (stop.clone(), n.clone(), f.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    f(i).await;
                    n.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let el = start.elapsed();
    for t in tasks {
        t.await.unwrap();
    }
    n.load(Ordering::Relaxed) as f64 / el.as_secs_f64()
}

/// redis-server's CPU seconds so far (`INFO cpu`).
fn server_cpu(server: &conformance::testkit::redis::RedisServer) -> f64 {
    ["used_cpu_user", "used_cpu_sys"]
        .iter()
        .map(|f| server.info("cpu", f).trim().parse::<f64>().unwrap())
        .sum()
}

/// This process's CPU seconds so far.
fn cpu() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let f: Vec<&str> = s.rsplit(')').next().unwrap().split_whitespace().collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
}

#[tokio::main(worker_threads = 2)]
async fn main() {
    let server = conformance::testkit::redis::server();
    let url = server.url();
    let client = redis::Client::open(url.as_str()).unwrap();
    let raw = client.get_multiplexed_async_connection().await.unwrap();
    let b = Arc::new(
        RedisBackend::connect(RedisOptions::new(&url))
            .await
            .unwrap(),
    );
    let coord = Arc::new(RedisOptions::new(&url).connect().await.unwrap());
    let unlock = Arc::new(redis::Script::new(
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end",
    ));
    // `PROBE_ONLY=trait` (or `raw`, `coord`) runs only that path, for
    // 10 s, to profile it alone (`perf record -g -p <pid>`).
    if let Ok(only) = std::env::var("PROBE_ONLY") {
        let mut rate = 0.0;
        for _ in 0..10 {
            rate += if only == "trait" {
                let b = b.clone();
                slice(move |i| {
                    let b = b.clone();
                    async move {
                        let k = format!("probe-trait-{i}");
                        let me = OwnerToken::random();
                        b.try_acquire(&k, &me, TTL).await.unwrap();
                        b.release(&k, &me).await.unwrap();
                    }
                })
                .await
            } else {
                let coord = coord.clone();
                slice(move |i| {
                    let coord = coord.clone();
                    async move {
                        let locks = coord.locks().unwrap();
                        let g = locks
                            .try_acquire(&format!("probe-coord-{i}"), TTL)
                            .await
                            .unwrap()
                            .unwrap();
                        g.release().await.unwrap();
                    }
                })
                .await
            } / 10.0;
        }
        println!("{only}: {rate:.0} cycles/s over 10 s, {TASKS} tasks");
        for c in ["set", "time", "evalsha"] {
            println!(
                "  {c}: {}",
                server.info("commandstats", &format!("cmdstat_{c}"))
            );
        }
        return;
    }
    let mut sums = [0.0f64; 3];
    let mut cpus = [0.0f64; 3];
    let mut scpus = [0.0f64; 3];
    for round in 0..4 {
        let c0 = cpu();
        let s0 = server_cpu(server);
        let r = {
            let (raw, unlock) = (raw.clone(), unlock.clone());
            slice(move |i| {
                let (mut con, unlock) = (raw.clone(), unlock.clone());
                async move {
                    let k = format!("probe:raw:{i}");
                    let _: Option<String> = redis::cmd("SET")
                        .arg(&k)
                        .arg("tok")
                        .arg("NX")
                        .arg("PX")
                        .arg(30000)
                        .query_async(&mut con)
                        .await
                        .unwrap();
                    let _: i64 = unlock
                        .key(&k)
                        .arg("tok")
                        .invoke_async(&mut con)
                        .await
                        .unwrap();
                }
            })
            .await
        };
        let c1 = cpu();
        let s1 = server_cpu(server);
        let t = {
            let b = b.clone();
            slice(move |i| {
                let b = b.clone();
                async move {
                    let k = format!("probe-trait-{i}");
                    let me = OwnerToken::random();
                    b.try_acquire(&k, &me, TTL).await.unwrap();
                    b.release(&k, &me).await.unwrap();
                }
            })
            .await
        };
        let c2 = cpu();
        let s2 = server_cpu(server);
        let c = {
            let coord = coord.clone();
            slice(move |i| {
                let coord = coord.clone();
                async move {
                    let locks = coord.locks().unwrap();
                    let g = locks
                        .try_acquire(&format!("probe-coord-{i}"), TTL)
                        .await
                        .unwrap()
                        .unwrap();
                    g.release().await.unwrap();
                }
            })
            .await
        };
        let c3 = cpu();
        let s3 = server_cpu(server);
        if round > 0 {
            for (j, v) in [r, t, c].into_iter().enumerate() {
                sums[j] += v;
            }
            cpus[0] += (c1 - c0) / r;
            cpus[1] += (c2 - c1) / t;
            cpus[2] += (c3 - c2) / c;
            scpus[0] += (s1 - s0) / r;
            scpus[1] += (s2 - s1) / t;
            scpus[2] += (s3 - s2) / c;
        }
        println!("round {round}: raw {r:.0}/s  trait {t:.0}/s  coord {c:.0}/s");
    }
    println!(
        "server cpu/cycle us: raw {:.1} trait {:.1} coord {:.1}",
        scpus[0] / 3.0 * 1e6,
        scpus[1] / 3.0 * 1e6,
        scpus[2] / 3.0 * 1e6
    );
    println!(
        "trait/raw {:.2}  coord/raw {:.2}; client cpu/cycle us: raw {:.1} trait {:.1} coord {:.1}",
        sums[1] / sums[0],
        sums[2] / sums[0],
        cpus[0] / 3.0 * 1e6,
        cpus[1] / 3.0 * 1e6,
        cpus[2] / 3.0 * 1e6
    );
}
