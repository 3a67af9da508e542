//! `Coord::health` on a path that stops answering (the scenario is
//! `conformance::faults::health`).

use std::time::Duration;

use conformance::faults::health::unanswered_probe;
use conformance::testkit::proxy::FaultProxy;
use conformance::testkit::redis as kit;
use coord_redis::RedisOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_bounded_by_the_call_timeout_and_recovers() {
    let proxy = FaultProxy::start(kit::server().port());
    let timeout = Duration::from_millis(300);
    let coord = RedisOptions::new(&format!("redis://127.0.0.1:{}", proxy.port()))
        .timeout(timeout)
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect through the proxy");
    unanswered_probe(&coord, &proxy, timeout).await;
}
