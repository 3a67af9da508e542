//! Where the time of a Redis lock handoff goes: one holder, one waiter on
//! its own client, the time from the release being started to the
//! waiter's acquire returning, beside the same exchange done with raw
//! redis-rs calls (a `DEL` + `PUBLISH` script, the waiter's subscription
//! message, a `SET NX PX`) and the idle `PING` round trip. A profiling aid
//! next to `coord-bench`'s handoff rows.
//!
//! `cargo run --release -p coord-redis --example redis_handoff_probe`

use std::time::{Duration, Instant};

use futures::StreamExt;

const ROUNDS: usize = 400;
const TTL: Duration = Duration::from_secs(30);

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main(worker_threads = 2)]
async fn main() {
    let server = conformance::testkit::redis::server();
    let url = server.url();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();

    let mut rtt = Vec::new();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut raw).await.unwrap();
        rtt.push(t.elapsed());
    }
    let rtt = p50(rtt);

    // Raw: the waiter subscribes, the holder deletes and publishes in one
    // script, the waiter takes the key on the message.
    let release = redis::Script::new(
        "redis.call('del', KEYS[1]) redis.call('publish', KEYS[2], 'x') return 1",
    );
    let mut ps = client.get_async_pubsub().await.unwrap();
    ps.subscribe("probe-wake").await.unwrap();
    let mut waiter = client.get_multiplexed_async_connection().await.unwrap();
    let mut messages = ps.on_message();
    let mut raw_h = Vec::new();
    for _ in 0..ROUNDS {
        let _: () = redis::cmd("SET")
            .arg("probe")
            .arg("a")
            .query_async(&mut raw)
            .await
            .unwrap();
        let t = Instant::now();
        let mut rel = raw.clone();
        let rel_script = release.clone();
        let r = tokio::spawn(async move {
            let _: i64 = rel_script
                .key("probe")
                .key("probe-wake")
                .invoke_async(&mut rel)
                .await
                .unwrap();
        });
        messages.next().await.unwrap();
        let ok: Option<String> = redis::cmd("SET")
            .arg("probe")
            .arg("b")
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut waiter)
            .await
            .unwrap();
        assert!(ok.is_some());
        raw_h.push(t.elapsed());
        r.await.unwrap();
    }
    drop(messages);

    // coord: the holder on one client, the waiter on another.
    let a = coord_redis::RedisOptions::new(&url)
        .connect()
        .await
        .unwrap();
    let b = coord_redis::RedisOptions::new(&url)
        .connect()
        .await
        .unwrap();
    let (la, lb) = (a.locks().unwrap(), b.locks().unwrap());
    let mut coord_h = Vec::new();
    for _ in 0..ROUNDS {
        let g = la.acquire("probe-coord", TTL, TTL).await.unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<Instant>();
        let lb2 = lb.clone();
        let w = tokio::spawn(async move {
            let g = lb2
                .acquire("probe-coord", TTL, Duration::from_secs(5))
                .await
                .unwrap();
            let done = Instant::now();
            let t = rx.await.unwrap();
            g.release().await.unwrap();
            done - t
        });
        // Let the waiter queue (attempt, subscribe, attempt).
        tokio::time::sleep(Duration::from_millis(3)).await;
        let _ = tx.send(Instant::now());
        g.release().await.unwrap();
        coord_h.push(w.await.unwrap());
    }
    let (raw_h, coord_h) = (p50(raw_h), p50(coord_h));
    println!("PING p50 {rtt:?}");
    println!(
        "raw handoff p50 {raw_h:?} ({:.2} RTT)",
        raw_h.as_secs_f64() / rtt.as_secs_f64()
    );
    println!(
        "coord handoff p50 {coord_h:?} ({:.2} RTT)",
        coord_h.as_secs_f64() / rtt.as_secs_f64()
    );
}
