//! Where the server time of a Redis work queue goes: 16 tasks on one
//! queue through the raw `Queue` trait, in three phases (every task
//! pushes, then pops, then acks, [`PER_TASK`] messages each), with the
//! server's CPU and its `EVALSHA` time per step (`INFO commandstats`)
//! for each phase; then the whole push + pop + ack cycle for 2 s, beside
//! the raw reliable-queue pattern (`LPUSH`, `LMOVE` to a processing list,
//! `LREM`). A profiling aid next to `coord-bench`.
//!
//! `cargo run --release -p coord-redis --example redis_queue_probe`
//! (`PROBE_TASKS=1` for one task).

use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance::testkit::redis::RedisServer;
use coord_core::{Lane, NewMessage, OwnerToken, PopAttempt, Queue, QueueConfig};
use coord_redis::{RedisBackend, RedisOptions};

/// Messages each task pushes, pops and acks in the phases.
const PER_TASK: usize = 500;
const VIS: Duration = Duration::from_secs(60);

mod support;
use support::server_cpu;

/// (calls, µs) of a command so far (`INFO commandstats`).
fn cmdstat(server: &RedisServer, cmd: &str) -> (f64, f64) {
    let line = server.info("commandstats", &format!("cmdstat_{cmd}"));
    let field = |name: &str| {
        line.split(',')
            .find_map(|f| f.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (field("calls"), field("usec"))
}

/// Run `f(task)` on every task at once; prints the phase's numbers.
async fn phase<F, Fut, T>(server: &RedisServer, name: &str, tasks: usize, f: F) -> Vec<T>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let (cpu0, (n0, us0)) = (server_cpu(server), cmdstat(server, "evalsha"));
    let start = Instant::now();
    let hs: Vec<_> = (0..tasks).map(|i| tokio::spawn(f(i))).collect();
    let mut out = Vec::new();
    for h in hs {
        out.push(h.await.unwrap());
    }
    let el = start.elapsed().as_secs_f64();
    let steps = (tasks * PER_TASK) as f64;
    let (n1, us1) = cmdstat(server, "evalsha");
    let cpu1 = server_cpu(server);
    println!(
        "{name:>5}: {:>7.0} steps/s; server CPU {:>5.1} us/step ({:.1} user, {:.1} system); \
         EVALSHA {:>5.1} us/call ({} calls)",
        steps / el,
        (cpu1.0 + cpu1.1 - cpu0.0 - cpu0.1) / steps * 1e6,
        (cpu1.0 - cpu0.0) / steps * 1e6,
        (cpu1.1 - cpu0.1) / steps * 1e6,
        (us1 - us0) / (n1 - n0).max(1.0),
        n1 - n0
    );
    out
}

/// Loop `f(task)` on every task for 2 s: cycles per second, server CPU
/// per cycle (user, system).
async fn cycles<F, Fut>(server: &RedisServer, tasks: usize, f: F) -> (f64, (f64, f64))
where
    F: Fn(usize) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let cpu0 = server_cpu(server);
    let (c, secs) = support::run(tasks, Duration::from_secs(2), f).await;
    let cpu1 = server_cpu(server);
    (
        c / secs,
        ((cpu1.0 - cpu0.0) / c * 1e6, (cpu1.1 - cpu0.1) / c * 1e6),
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let tasks: usize = std::env::var("PROBE_TASKS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(16);
    let server = conformance::testkit::redis::server();
    let url = server.url();
    let b = Arc::new(
        RedisBackend::connect(RedisOptions::new(&url))
            .await
            .unwrap(),
    );
    let cfg = QueueConfig::default();
    let q = "probe-queue";
    println!("{tasks} tasks, {PER_TASK} messages each, one queue");
    phase(server, "push", tasks, |_| {
        let b = b.clone();
        async move {
            for _ in 0..PER_TASK {
                b.push(q, &NewMessage::new(b"m")).await.unwrap();
            }
        }
    })
    .await;
    let owners: Vec<OwnerToken> = (0..tasks).map(|_| OwnerToken::random()).collect();
    let popped = phase(server, "pop", tasks, |i| {
        let (b, o) = (b.clone(), owners[i]);
        async move {
            let mut ids = Vec::new();
            for _ in 0..PER_TASK {
                match b.try_pop(q, Lane::Main, &o, VIS, &cfg).await.unwrap() {
                    PopAttempt::Delivered { message, .. } => ids.push(message.id),
                    PopAttempt::Empty { .. } => panic!("the queue ran dry"),
                }
            }
            ids
        }
    })
    .await;
    let popped = Arc::new(popped);
    phase(server, "ack", tasks, |i| {
        let (b, o, popped) = (b.clone(), owners[i], popped.clone());
        async move {
            for id in &popped[i] {
                assert!(b.ack(q, Lane::Main, *id, &o).await.unwrap());
            }
        }
    })
    .await;
    let (rate, cpu) = cycles(server, tasks, {
        let b = b.clone();
        move |_| {
            let b = b.clone();
            async move {
                let o = OwnerToken::random();
                let name = format!("{q}-cycle");
                b.push(&name, &NewMessage::new(b"m")).await.unwrap();
                let PopAttempt::Delivered { message, .. } =
                    b.try_pop(&name, Lane::Main, &o, VIS, &cfg).await.unwrap()
                else {
                    panic!("a pushed message is there")
                };
                assert!(b.ack(&name, Lane::Main, message.id, &o).await.unwrap());
            }
        }
    })
    .await;
    println!(
        "coord cycle: {rate:>7.0} cycles/s; server CPU {:>5.1} us/cycle ({:.1} user, {:.1} system)",
        cpu.0 + cpu.1,
        cpu.0,
        cpu.1
    );
    let raw = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let (rate, cpu) = cycles(server, tasks, move |i| {
        let mut c = raw.clone();
        async move {
            let v = format!("m-{i}-{}", OwnerToken::random().to_hex());
            let _: () = redis::cmd("LPUSH")
                .arg("probe-raw")
                .arg(&v)
                .query_async(&mut c)
                .await
                .unwrap();
            let got: Option<String> = redis::cmd("LMOVE")
                .arg("probe-raw")
                .arg("probe-raw-processing")
                .arg("RIGHT")
                .arg("LEFT")
                .query_async(&mut c)
                .await
                .unwrap();
            let got = got.expect("a pushed message is there");
            let _: () = redis::cmd("LREM")
                .arg("probe-raw-processing")
                .arg(1)
                .arg(&got)
                .query_async(&mut c)
                .await
                .unwrap();
        }
    })
    .await;
    println!(
        "  raw cycle: {rate:>7.0} cycles/s; server CPU {:>5.1} us/cycle ({:.1} user, {:.1} system)",
        cpu.0 + cpu.1,
        cpu.0,
        cpu.1
    );
}
