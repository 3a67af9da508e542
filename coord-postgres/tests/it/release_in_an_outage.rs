//! A release sent while PostgreSQL does not answer (see
//! `conformance::faults::outage::release_in_a_long_outage`).

use crate::support;

use conformance::testkit::proxy::FaultProxy;
use support::{direct, slow, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_failed_in_a_long_outage_frees_the_lock_once_the_store_answers() {
    let schema = unique("outage");
    let proxy = FaultProxy::start(conformance::testkit::postgres::cluster().port());
    let here = direct(&schema).await.coord();
    let far = slow(&schema, &proxy).await.coord();
    conformance::faults::outage::release_in_a_long_outage(&far, &here, &proxy, &unique("outage"))
        .await;
}
