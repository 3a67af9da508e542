//! `Coord::health` on a path that stops answering (the scenario is
//! `conformance::faults::health`).

use crate::support::{CALL_TIMEOUT, slow, unique};
use conformance::faults::health::unanswered_probe;
use conformance::testkit::postgres::cluster;
use conformance::testkit::proxy::FaultProxy;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_bounded_by_the_call_timeout_and_recovers() {
    let proxy = FaultProxy::start(cluster().port());
    let backend = slow(&unique("health"), &proxy).await;
    unanswered_probe(&backend.coord(), &proxy, CALL_TIMEOUT).await;
}
