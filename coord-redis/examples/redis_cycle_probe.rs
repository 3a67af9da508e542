//! Where the time of a Redis lock cycle goes at 32 concurrent tasks: raw
//! commands (`SET NX PX` + a compare-and-delete script), two floors of a
//! scripted acquire with the same unlock (`SET NX PX` inside a script;
//! and the least a clock-seeded fencing token needs, the server's `TIME`
//! in the value), the backend's scripts through the `Lock` trait, and the
//! whole coord `Locks` API, interleaved in 1 s slices on one server, with
//! the client's and the server's CPU time per cycle. A profiling aid next
//! to `coord-bench`.
//!
//! `cargo run --release -p coord-redis --example redis_cycle_probe`; with
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

/// One 1 s slice of the backend's scripts through the `Lock` trait.
async fn trait_slice(b: Arc<RedisBackend>) -> f64 {
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
}

/// One 1 s slice of the whole coord `Locks` API.
async fn coord_slice(coord: Arc<coord_core::Coord>) -> f64 {
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
                trait_slice(b.clone()).await
            } else {
                coord_slice(coord.clone()).await
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
    // The floors of any fenced acquire done in a script (the raw unlock
    // after each): `SET NX PX` moved into a script, and the least a
    // clock-seeded token needs (the server's `TIME`, the token in the
    // value).
    let script_set = Arc::new(redis::Script::new(
        "return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])",
    ));
    let fenced_min = Arc::new(redis::Script::new(
        "local t = redis.call('TIME') \
         local v = ARGV[1] .. ':' .. t[1] .. t[2] \
         if redis.call('SET', KEYS[1], v, 'NX', 'PX', ARGV[2]) then return v end \
         return false",
    ));
    const PATHS: [&str; 5] = ["raw", "script-setnx", "fenced-min", "trait", "coord"];
    let mut sums = [0.0f64; 5];
    let mut cpus = [0.0f64; 5];
    let mut scpus = [0.0f64; 5];
    for round in 0..4 {
        let mut rates = [0.0f64; 5];
        for (j, path) in PATHS.iter().enumerate() {
            let (c0, s0) = (cpu(), server_cpu(server));
            rates[j] = match *path {
                "raw" | "script-setnx" | "fenced-min" => {
                    let (raw, unlock) = (raw.clone(), unlock.clone());
                    let take = match *path {
                        "script-setnx" => Some(script_set.clone()),
                        "fenced-min" => Some(fenced_min.clone()),
                        _ => None,
                    };
                    let path = *path;
                    slice(move |i| {
                        let (mut con, unlock, take) = (raw.clone(), unlock.clone(), take.clone());
                        async move {
                            let k = format!("probe:{path}:{i}");
                            // The value set: the unlock compares it.
                            let v: Option<String> = match take {
                                None => redis::cmd("SET")
                                    .arg(&k)
                                    .arg("tok")
                                    .arg("NX")
                                    .arg("PX")
                                    .arg(30000)
                                    .query_async(&mut con)
                                    .await
                                    .unwrap(),
                                Some(s) => s
                                    .key(&k)
                                    .arg("tok")
                                    .arg(30000)
                                    .invoke_async(&mut con)
                                    .await
                                    .unwrap(),
                            };
                            // `SET` answers OK; the fenced floor, the value it set.
                            let v = match v.as_deref() {
                                Some("OK") => "tok".to_string(),
                                Some(v) => v.to_string(),
                                None => panic!("{path}: {k} is held (its last unlock failed)"),
                            };
                            let deleted: i64 =
                                unlock.key(&k).arg(v).invoke_async(&mut con).await.unwrap();
                            assert_eq!(deleted, 1, "{path}: the unlock deletes what was set");
                        }
                    })
                    .await
                }
                "trait" => trait_slice(b.clone()).await,
                _ => coord_slice(coord.clone()).await,
            };
            if round > 0 {
                sums[j] += rates[j];
                cpus[j] += (cpu() - c0) / rates[j];
                scpus[j] += (server_cpu(server) - s0) / rates[j];
            }
        }
        println!(
            "round {round}: {}",
            PATHS
                .iter()
                .zip(rates)
                .map(|(p, r)| format!("{p} {r:.0}/s"))
                .collect::<Vec<_>>()
                .join("  ")
        );
    }
    for (j, path) in PATHS.iter().enumerate() {
        println!(
            "{path:>12}: {:.2} of raw's throughput; server cpu/cycle {:.1} us, client {:.1} us",
            sums[j] / sums[0],
            scpus[j] / 3.0 * 1e6,
            cpus[j] / 3.0 * 1e6
        );
    }
}
