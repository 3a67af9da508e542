//! A release sent while etcd does not answer (see
//! `conformance::faults::outage::release_in_a_long_outage`).

use conformance::testkit::etcd;
use conformance::testkit::proxy::FaultProxy;

use crate::late_support::{CALL_TIMEOUT, connect, direct, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_failed_in_a_long_outage_frees_the_lock_once_the_store_answers() {
    let prefix = unique("outage");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let far = connect(proxy.port(), &prefix, CALL_TIMEOUT).await;
    let near = direct(&prefix).await;
    conformance::faults::outage::release_in_a_long_outage(
        &far.coord(),
        &near.coord(),
        &proxy,
        unique("lock").trim_end_matches('/'),
    )
    .await;
}
