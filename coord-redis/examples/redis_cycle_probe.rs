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
//!
//! `PROBE=guarantees` measures instead what two guarantees cost the
//! server: the backend's own acquire and release scripts, called with the
//! arguments the backend sends, beside the same scripts without the
//! late-copy mark's lookup on acquire (`no-mark`), without the release's
//! clock check that keeps a released token until the server clock has
//! passed it (`no-clock`), and without both. The variants are cut from the
//! scripts' sources (the module is compiled in here too), so they cannot
//! drift from what the backend runs; they are for measuring only. A last
//! variant, `lean`, runs without both and sends no more than a script
//! needs for an owner-checked cycle: the claim's key and the owner, plus
//! the TTL and the waiters' flag on acquire (no mark key, no stamp, the
//! release's wake-up channel and payload written into the script).

use std::sync::Arc;
use std::time::Duration;

use coord_core::{Lock, OwnerToken};
use coord_redis::{RedisBackend, RedisOptions};

/// The backend's scripts, compiled into this example to read their
/// sources (`Scripts::sources`).
#[allow(dead_code)]
#[path = "../src/scripts/mod.rs"]
mod scripts;

mod support;

const TASKS: usize = 32;
const TTL: Duration = Duration::from_secs(30);

/// One 1 s slice of `f` on [`TASKS`] tasks: cycles per second.
async fn slice<F, Fut>(f: F) -> f64
where
    F: Fn(usize) -> Fut + Send + Sync + 'static + Clone,
    Fut: std::future::Future<Output = ()> + Send,
{
    let (calls, secs) = support::run(TASKS, Duration::from_secs(1), f).await;
    calls / secs
}

/// One 1 s slice of the backend's scripts through the `Lock` trait.
async fn trait_slice(b: Arc<RedisBackend>) -> f64 {
    slice(move |i| {
        let b = b.clone();
        async move {
            let k = format!("probe-trait-{i}");
            let me = OwnerToken::random();
            b.try_acquire(&k, me.step(), TTL).await.unwrap();
            b.release(&k, me.step()).await.unwrap();
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
    let (user, system) = support::server_cpu(server);
    user + system
}

/// This process's CPU seconds so far.
fn cpu() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let f: Vec<&str> = s.rsplit(')').next().unwrap().split_whitespace().collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
}

/// The least a clock-seeded fenced acquire needs: the server's `TIME`
/// in the value, set with `NX PX`; returns the value, or nil when held.
fn fenced_min() -> Arc<redis::Script> {
    Arc::new(redis::Script::new(
        "local t = redis.call('TIME') \
         local v = ARGV[1] .. ':' .. t[1] .. t[2] \
         if redis.call('SET', KEYS[1], v, 'NX', 'PX', ARGV[2]) then return v end \
         return false",
    ))
}

/// One 1 s slice of a raw `SET NX PX` (`take` None) or of the script
/// `take`, each followed by the raw compare-and-delete of what it set.
async fn unlocked_slice(
    raw: redis::aio::MultiplexedConnection,
    path: &'static str,
    take: Option<Arc<redis::Script>>,
) -> f64 {
    let unlock = Arc::new(redis::Script::new(
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end",
    ));
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
            let deleted: i64 = unlock.key(&k).arg(v).invoke_async(&mut con).await.unwrap();
            assert_eq!(deleted, 1, "{path}: the unlock deletes what was set");
        }
    })
    .await
}

/// The lock acquire and release scripts as the backend runs them, and
/// the variants without the mark lookup and without the clock check.
struct Variants {
    acquire: String,
    release: String,
    acquire_no_mark: String,
    release_no_clock: String,
    /// [`Self::release_no_clock`] publishing without its channel and
    /// payload arguments.
    release_lean: String,
}

fn variants() -> Variants {
    let sources = scripts::Scripts::new().sources;
    // `Scripts::new` builds acquire first, release second.
    let (acquire, release) = (sources[0].clone(), sources[1].clone());
    let check = "local gone = redis.call('GET', KEYS[2])\n";
    assert!(
        acquire.starts_with(check),
        "the acquire no longer starts with the mark lookup"
    );
    let end = acquire.find("end\n").expect("the mark check's end") + "end\n".len();
    let acquire_no_mark = acquire[end..].to_string();
    let free = "free(KEYS[1], tok)";
    assert_eq!(release.matches(free).count(), 1, "the release frees once");
    let release_no_clock = release.replace(free, "redis.call('DEL', KEYS[1])");
    let publish = "ARGV[2], ARGV[3]";
    assert_eq!(
        release.matches(publish).count(),
        1,
        "the release publishes once"
    );
    let release_lean = release_no_clock.replace(publish, "'coord:wake', KEYS[1]");
    Variants {
        acquire,
        release,
        acquire_no_mark,
        release_no_clock,
        release_lean,
    }
}

/// One 1 s slice of `acquire` + `release` scripts on the raw connection,
/// with the keys and arguments the backend sends for a default-layout
/// lock nobody else waits for; `lean`: only those the `lean` variant
/// reads (see the file's docs).
async fn scripts_slice(
    con: redis::aio::MultiplexedConnection,
    (acquire, release): (Arc<redis::Script>, Arc<redis::Script>),
    lean: bool,
) -> f64 {
    slice(move |i| {
        let (mut con, acquire, release) = (con.clone(), acquire.clone(), release.clone());
        async move {
            let claim = format!("coord:{{lock:probe-cost-{i}}}");
            let owner = OwnerToken::random().to_hex();
            let left = format!("{claim}:left:{owner}");
            let stamp = coord_core::late::stamp().to_string();
            let mut acquire = acquire.key(&claim);
            if !lean {
                acquire.key(&left);
            }
            acquire.arg(&owner).arg(TTL.as_millis() as u64).arg("0");
            if !lean {
                acquire.arg(&stamp);
            }
            let (granted, _): (i64, redis::Value) = acquire.invoke_async(&mut con).await.unwrap();
            assert_eq!(granted, 1, "{claim} is free");
            let mut release = release.key(&claim);
            release.arg(&owner);
            if !lean {
                release
                    .arg("coord:wake")
                    .arg(format!("lock:probe-cost-{i}"));
            }
            let released: i64 = release.invoke_async(&mut con).await.unwrap();
            assert_eq!(released, 1, "the owner releases {claim}");
        }
    })
    .await
}

/// What the late-copy mark and the release's clock check cost the
/// server, per cycle (see the file's docs).
async fn guarantees(
    server: &conformance::testkit::redis::RedisServer,
    con: redis::aio::MultiplexedConnection,
) {
    let v = variants();
    let s = |src: &str| Arc::new(redis::Script::new(src));
    let rows = [
        ("backend", s(&v.acquire), s(&v.release)),
        ("no-mark", s(&v.acquire_no_mark), s(&v.release)),
        ("no-clock", s(&v.acquire), s(&v.release_no_clock)),
        ("neither", s(&v.acquire_no_mark), s(&v.release_no_clock)),
        ("lean", s(&v.acquire_no_mark), s(&v.release_lean)),
    ];
    // Per round, each row's throughput and server CPU per cycle; the last
    // row is the fenced floor's. Rows are compared within a round (the
    // VM's speed drifts between rounds), and the medians reported.
    const ROUNDS: usize = 10;
    let mut per = vec![Vec::new(); rows.len() + 1];
    for round in 0..=ROUNDS {
        for (j, runs) in per.iter_mut().enumerate() {
            let s0 = server_cpu(server);
            let rate = match rows.get(j) {
                Some((name, a, r)) => {
                    let lean = *name == "lean";
                    scripts_slice(con.clone(), (a.clone(), r.clone()), lean).await
                }
                None => unlocked_slice(con.clone(), "fenced-min", Some(fenced_min())).await,
            };
            // The first round warms up.
            if round > 0 {
                runs.push((rate, (server_cpu(server) - s0) / rate));
            }
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let floor = rows.len();
    let names = rows.iter().map(|r| r.0).chain(["floor"]);
    for (j, name) in names.enumerate() {
        let of = |k: usize| median((0..ROUNDS).map(|r| per[j][r].1 / per[k][r].1).collect());
        println!(
            "{name:>8}: {:.0} cycles/s, server cpu/cycle {:.1} us ({:.2} of the backend's, {:.2} of the floor's; medians of {ROUNDS} rounds)",
            median(per[j].iter().map(|x| x.0).collect()),
            median(per[j].iter().map(|x| x.1).collect()) * 1e6,
            of(0),
            of(floor),
        );
    }
}

#[tokio::main(worker_threads = 2)]
async fn main() {
    let server = conformance::testkit::redis::server();
    let url = server.url();
    let client = redis::Client::open(url.as_str()).unwrap();
    let raw = client.get_multiplexed_async_connection().await.unwrap();
    if std::env::var("PROBE").as_deref() == Ok("guarantees") {
        guarantees(server, raw).await;
        return;
    }
    let b = Arc::new(
        RedisBackend::connect(RedisOptions::new(&url))
            .await
            .unwrap(),
    );
    let coord = Arc::new(RedisOptions::new(&url).connect().await.unwrap());
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
                    let take = match *path {
                        "script-setnx" => Some(script_set.clone()),
                        "fenced-min" => Some(fenced_min()),
                        _ => None,
                    };
                    unlocked_slice(raw.clone(), path, take).await
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
