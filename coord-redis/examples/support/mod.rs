//! What the Redis probes share: the server's CPU time, and a loop of
//! concurrent tasks for a fixed time.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use conformance::testkit::redis::RedisServer;

/// redis-server's CPU seconds so far (`INFO cpu`): user, system.
pub fn server_cpu(server: &RedisServer) -> (f64, f64) {
    let f = |name: &str| server.info("cpu", name).trim().parse::<f64>().unwrap();
    (f("used_cpu_user"), f("used_cpu_sys"))
}

/// Run `f(task)` in a loop on each of `tasks` tasks for `time`: how many
/// calls ended, and in how many seconds (every task's last call is let
/// finish).
pub async fn run<F, Fut>(tasks: usize, time: Duration, f: F) -> (f64, f64)
where
    F: Fn(usize) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = ()> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let n = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let hs: Vec<_> = (0..tasks)
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
    tokio::time::sleep(time).await;
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.await.unwrap();
    }
    (
        n.load(Ordering::Relaxed) as f64,
        start.elapsed().as_secs_f64(),
    )
}
