//! Metrics: install a Prometheus recorder, use a few primitives, and print
//! what coord recorded in the Prometheus text format (a service would
//! serve `handle.render()` on `/metrics`, or use the exporter's own HTTP
//! listener). The metrics are listed in `coord::metrics`.
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
    guard.release().await?;

    let limiter = coord.limiter()?;
    let key = fresh("api");
    let quota = Quota::new(2, Duration::from_secs(60), Algorithm::Gcra);
    for _ in 0..3 {
        limiter.check(&key, quota).await?;
    }

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
    Ok(())
}
