//! A release sent while Redis does not answer (see
//! `conformance::faults::outage::release_in_a_long_outage`).

use crate::common;

use common::unique;
use conformance::testkit::redis::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_failed_in_a_long_outage_frees_the_lock_once_the_store_answers() {
    let server = RedisServer::start();
    let (proxy, via, direct) = common::through_proxy(&server).await;
    conformance::faults::outage::release_in_a_long_outage(&via, &direct, &proxy, &unique("outage"))
        .await;
}
