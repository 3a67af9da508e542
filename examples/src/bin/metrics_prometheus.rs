//! Metrics and health: install a Prometheus recorder, check the store's
//! health (what a readiness probe would call), use a few primitives, sample
//! a queue's gauges as a timer would, and print what coord recorded in the
//! Prometheus text format (a service would serve `handle.render()` on
//! `/metrics`, or use the exporter's own HTTP listener). The metrics are
//! listed in `coord::metrics`; `docs/grafana-dashboard.json` charts them.
//! `cargo run -p coord-examples --bin metrics_prometheus`

use std::time::Duration;

use coord::{Algorithm, Quota};
use coord_examples::{connect, fresh};
use metrics_exporter_prometheus::PrometheusBuilder;

#[tokio::main]
async fn main() -> coord::Result<()> {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .expect("no other metrics recorder is installed");
    let coord = connect().await?;
    // A readiness probe: one round trip, the server's version.
    let health = coord.health().await?;
    println!(
        "healthy: {} {} in {:?}",
        health.backend, health.server.version, health.round_trip
    );

    let locks = coord.locks()?;
    let name = fresh("report");
    let guard = locks
        .acquire(&name, Duration::from_secs(10), Duration::from_secs(5))
        .await?;
    // Busy while held: a try is refused (outcome="timeout").
    assert!(
        locks
            .try_acquire(&name, Duration::from_secs(10))
            .await?
            .is_none()
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    let held_now = handle.render();
    guard.release().await?;

    let limiter = coord.limiter()?;
    let key = fresh("api");
    let quota = Quota::new(2, Duration::from_secs(60), Algorithm::Gcra);
    for _ in 0..3 {
        limiter.check(&key, quota).await?;
    }

    // Queue gauges are sampled: a service calls `stats` from a timer for
    // the queues it watches (here once).
    let queues = coord.queues()?;
    let jobs = fresh("jobs");
    queues.push(&jobs, b"resize 42").await?;
    queues.stats(&jobs).await?;

    let text = handle.render();
    for line in text.lines().filter(|l| l.starts_with("coord_")) {
        println!("{line}");
    }
    assert!(
        text.contains("coord_acquire_total"),
        "no acquire metric:\n{text}"
    );
    assert!(
        text.contains("coord_limiter_checks_total"),
        "no limiter metric:\n{text}"
    );
    assert!(
        held_now.lines().any(|l| l.starts_with("coord_held{")
            && l.contains("kind=\"lock\"")
            && l.ends_with(" 1")),
        "the held lock is not in coord_held:\n{held_now}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("coord_queue_messages{")
            && l.contains("state=\"ready\"")
            && l.ends_with(" 1")),
        "no sampled queue gauge:\n{text}"
    );
    Ok(())
}
