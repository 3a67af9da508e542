//! Uncontended lock cycles (acquire + release) and limiter checks through
//! coord, next to the raw store operations they are built on, measured in
//! the same run against real servers that the conformance test kit starts
//! on loopback ports. Prints each as a time per operation and as a ratio
//! to the raw operation.
//!
//! ```sh
//! cargo run --release -p coord-bench              # every store
//! cargo run --release -p coord-bench -- redis     # one store
//! ```
//!
//! The raw baselines are the cheapest correct form of the same work:
//! - memory: insert + remove in a mutex-guarded hash map;
//! - redis: `SET key token NX PX ttl` then a compare-and-delete script
//!   (the seed's scheme, without fencing);
//! - postgres: one upsert that takes a free or expired row, then one
//!   owner-checked update that frees it (durable commits);
//! - etcd: a transaction that creates a key on an existing lease, then a
//!   delete.

use std::collections::HashMap;
use std::future::Future;
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use coord::{Algorithm, Coord, Quota};

const TTL: Duration = Duration::from_secs(30);

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let only: Vec<String> = std::env::args().skip(1).collect();
    let wants = |s: &str| only.is_empty() || only.iter().any(|o| o == s);
    println!(
        "{:<10} {:<34} {:>12} {:>8}",
        "store", "operation", "per op", "ratio"
    );
    if wants("memory") {
        memory().await;
    }
    if wants("redis") {
        redis_store().await;
    }
    if wants("postgres") {
        postgres_store().await;
    }
    if wants("etcd") {
        etcd_store().await;
    }
}

/// Mean time per call of `f` over `n` calls, after `n / 10` warm-up calls.
async fn time<F, Fut>(n: u32, mut f: F) -> Duration
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = ()>,
{
    for i in 0..n / 10 {
        f(i).await;
    }
    let start = Instant::now();
    for i in 0..n {
        f(i).await;
    }
    start.elapsed() / n
}

fn report(store: &str, raw_name: &str, raw: Duration, rows: &[(&str, Duration)]) {
    println!("{store:<10} {raw_name:<34} {:>12.1?} {:>8}", raw, "1.00x");
    for (name, t) in rows {
        println!(
            "{store:<10} {name:<34} {:>12.1?} {:>7.2}x",
            t,
            t.as_secs_f64() / raw.as_secs_f64()
        );
    }
}

async fn coord_cycle(coord: &Coord, n: u32) -> Duration {
    let locks = coord.locks().expect("locks");
    let name = format!("bench-{}", std::process::id());
    time(n, |_| {
        let locks = &locks;
        let name = &name;
        async move {
            let g = locks
                .try_acquire(name, TTL)
                .await
                .unwrap()
                .expect("uncontended");
            g.release().await.unwrap();
        }
    })
    .await
}

async fn coord_check(coord: &Coord, n: u32) -> Duration {
    let limiter = coord.limiter().expect("limiter");
    let quota = Quota::new(u64::MAX / 2, Duration::from_secs(60), Algorithm::Gcra);
    let key = format!("bench-{}", std::process::id());
    time(n, |_| {
        let (limiter, key) = (&limiter, &key);
        async move {
            black_box(limiter.check(key, quota).await.unwrap());
        }
    })
    .await
}

async fn memory() {
    let n = 1_000_000;
    let map: Mutex<HashMap<Box<str>, u64>> = Mutex::new(HashMap::new());
    let raw = time(n, |_| {
        let map = &map;
        async move {
            let mut m = map.lock().unwrap();
            m.insert("bench".into(), 1);
            black_box(m.remove("bench"));
        }
    })
    .await;
    let coord = coord::connect("memory://bench").await.expect("memory");
    let cycle = coord_cycle(&coord, n).await;
    report(
        "memory",
        "raw map insert + remove",
        raw,
        &[("coord acquire + release", cycle)],
    );
    println!(
        "{:<10} {:<34} {:>12.0}",
        "memory",
        "coord cycles per second (1 core)",
        1.0 / cycle.as_secs_f64()
    );
}

async fn redis_store() {
    let url = conformance::testkit::redis::url();
    let n = 5_000;
    let client = redis::Client::open(url.as_str()).expect("redis url");
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection");
    let unlock = redis::Script::new(
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end",
    );
    let raw = time(n, |i| {
        let mut con = con.clone();
        let unlock = &unlock;
        async move {
            let token = format!("tok-{i}");
            let ok: Option<String> = redis::cmd("SET")
                .arg("raw-bench")
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(30_000)
                .query_async(&mut con)
                .await
                .unwrap();
            assert!(ok.is_some());
            let _: i64 = unlock
                .key("raw-bench")
                .arg(&token)
                .invoke_async(&mut con)
                .await
                .unwrap();
        }
    })
    .await;
    let zadd = redis::Script::new(
        "redis.call('zremrangebyscore', KEYS[1], 0, ARGV[1]) \
         local c = redis.call('zcard', KEYS[1]) \
         if c < tonumber(ARGV[2]) then redis.call('zadd', KEYS[1], ARGV[3], ARGV[4]) return 1 end return 0",
    );
    let raw_check = time(n, |i| {
        let mut con = con.clone();
        let zadd = &zadd;
        async move {
            let _: i64 = zadd
                .key("raw-bench-z")
                .arg(0)
                .arg(1_000_000_000)
                .arg(i)
                .arg(i)
                .invoke_async(&mut con)
                .await
                .unwrap();
        }
    })
    .await;
    let _: () = redis::cmd("DEL")
        .arg("raw-bench-z")
        .query_async(&mut con)
        .await
        .unwrap();
    let coord = coord::connect(&url).await.expect("coord redis");
    let cycle = coord_cycle(&coord, n).await;
    let check = coord_check(&coord, n).await;
    report(
        "redis",
        "raw SET NX PX + compare-and-delete",
        raw,
        &[("coord acquire + release", cycle)],
    );
    report(
        "redis",
        "raw seed ZSET limiter script",
        raw_check,
        &[("coord limiter check (GCRA)", check)],
    );
}

async fn postgres_store() {
    let url = conformance::testkit::postgres::url();
    let n = 1_000;
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("postgres");
    let conn_task = tokio::spawn(connection);
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS raw_bench (name text PRIMARY KEY, owner text, expires_at timestamptz)",
        )
        .await
        .expect("raw table");
    let take = client
        .prepare(
            "INSERT INTO raw_bench (name, owner, expires_at) VALUES ($1, $2, clock_timestamp() + interval '30 seconds') \
             ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at \
             WHERE raw_bench.owner IS NULL OR raw_bench.expires_at <= clock_timestamp()",
        )
        .await
        .expect("prepare");
    let free = client
        .prepare("UPDATE raw_bench SET owner = NULL WHERE name = $1 AND owner = $2")
        .await
        .expect("prepare");
    let raw = time(n, |i| {
        let (client, take, free) = (&client, &take, &free);
        async move {
            let owner = format!("tok-{i}");
            assert_eq!(client.execute(take, &[&"raw", &owner]).await.unwrap(), 1);
            assert_eq!(client.execute(free, &[&"raw", &owner]).await.unwrap(), 1);
        }
    })
    .await;
    drop(client);
    let _ = conn_task.await;
    let coord = coord::connect(&url).await.expect("coord postgres");
    let cycle = coord_cycle(&coord, n).await;
    report(
        "postgres",
        "raw upsert + owner-checked update",
        raw,
        &[("coord acquire + release", cycle)],
    );
}

async fn etcd_store() {
    let server = conformance::testkit::etcd::shared();
    let n = 1_000;
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .expect("etcd");
    let lease = client.lease_grant(30, None).await.expect("lease").id();
    let raw = time(n, |_| {
        let mut client = client.clone();
        async move {
            let key = "raw-bench";
            let txn = etcd_client::Txn::new()
                .when([etcd_client::Compare::create_revision(
                    key,
                    etcd_client::CompareOp::Equal,
                    0,
                )])
                .and_then([etcd_client::TxnOp::put(
                    key,
                    "tok",
                    Some(etcd_client::PutOptions::new().with_lease(lease)),
                )]);
            assert!(client.txn(txn).await.unwrap().succeeded());
            client.delete(key, None).await.unwrap();
        }
    })
    .await;
    let coord = coord::connect(&server.url()).await.expect("coord etcd");
    let cycle = coord_cycle(&coord, n).await;
    report(
        "etcd",
        "raw txn create-on-lease + delete",
        raw,
        &[("coord acquire + release", cycle)],
    );
}
