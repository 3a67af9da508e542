//! `Coord::health` on a path that stops answering (the scenario is
//! `conformance::faults::health`).

use std::time::Duration;

use conformance::faults::health::unanswered_probe;
use conformance::testkit::etcd;
use conformance::testkit::proxy::FaultProxy;
use coord_etcd::{EtcdBackend, EtcdOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_bounded_by_the_call_timeout_and_recovers() {
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let url = format!("etcd://127.0.0.1:{}?timeout_ms=500", proxy.port());
    let backend = EtcdBackend::connect(EtcdOptions::parse(&url).unwrap())
        .await
        .expect("connect through the proxy");
    unanswered_probe(&backend.coord(), &proxy, Duration::from_millis(500)).await;
}
