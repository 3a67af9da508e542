//! Pops whose outcome nobody saw, on a queue that delivers each message
//! once (see `conformance::late_copy::late_pop_with_one_delivery_allowed`
//! and `dropped_pop_with_one_delivery_allowed`).

use crate::support;

use conformance::testkit::proxy::FaultProxy;
use support::{direct, slow, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_timed_out_pop_delivers_nothing() {
    let schema = unique("late_pop");
    let proxy = FaultProxy::start(conformance::testkit::postgres::cluster().port());
    let here = direct(&schema).await.coord();
    let far = slow(&schema, &proxy).await.coord();
    conformance::late_copy::late_pop_with_one_delivery_allowed(&far, &here, &proxy, &unique("q"))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_pop_gives_back_its_delivery_uncounted() {
    let here = direct(&unique("dropped_pop")).await.coord();
    conformance::late_copy::dropped_pop_with_one_delivery_allowed(&here, &unique("q")).await;
}
