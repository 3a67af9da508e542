//! Late copies of a producer's and a consumer's steps: a push held in the
//! network, a timed-out pop, on a queue that
//! delivers each message once (see
//! `conformance::late_copy::late_pop_with_one_delivery_allowed`; a dropped
//! pop is a conformance case), and an extend of a delivery overtaken by a
//! later one.

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

/// See `conformance::late_copy::late_push_lands_once`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_held_in_the_network_lands_once() {
    let schema = unique("late_push");
    let proxy = FaultProxy::start(conformance::testkit::postgres::cluster().port());
    let here = direct(&schema).await.coord();
    let far = slow(&schema, &proxy).await.coord();
    conformance::late_copy::late_push_lands_once(&far, &here, &proxy, &unique("q")).await;
}

/// See `conformance::late_copy::late_copy_of_a_delivery_extend_after_a_later_one`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_an_earlier_delivery_extend_changes_nothing() {
    let schema = unique("late_qext");
    let proxy = FaultProxy::start(conformance::testkit::postgres::cluster().port());
    let here = direct(&schema).await.coord();
    let far = slow(&schema, &proxy).await.coord();
    conformance::late_copy::late_copy_of_a_delivery_extend_after_a_later_one(
        &far,
        &here,
        &proxy,
        &unique("q"),
    )
    .await;
}

/// See `conformance::late_copy::late_extend_after_a_later_one`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_short_extend_never_outlives_the_guard() {
    let schema = unique("late_extend");
    let proxy = FaultProxy::start(conformance::testkit::postgres::cluster().port());
    let here = direct(&schema).await.coord();
    let far = slow(&schema, &proxy).await.coord();
    conformance::late_copy::late_extend_after_a_later_one(&far, &here, &proxy, &unique("l")).await;
}
