//! A late copy of a barrier arrival through a slow network (see
//! `conformance::late_copy::late_copy_of_a_timed_out_barrier_arrival`).

use crate::support;

use conformance::testkit::proxy::FaultProxy;
use support::{direct, slow, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_timed_out_arrival_does_not_count() {
    let schema = unique("barrier_late");
    let proxy = FaultProxy::start(conformance::testkit::postgres::cluster().port());
    let here = direct(&schema).await.coord();
    let far = slow(&schema, &proxy).await.coord();
    conformance::late_copy::late_copy_of_a_timed_out_barrier_arrival(
        &far,
        &here,
        &proxy,
        &unique("barrier-late"),
    )
    .await;
}

/// See `conformance::late_copy::late_copy_of_an_arrival_that_passed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_an_arrival_that_passed_counts_nowhere() {
    let schema = unique("barrier_passed");
    let proxy = FaultProxy::start(conformance::testkit::postgres::cluster().port());
    let here = direct(&schema).await.coord();
    let far = slow(&schema, &proxy).await.coord();
    conformance::late_copy::late_copy_of_an_arrival_that_passed(
        &far,
        &here,
        &proxy,
        &unique("barrier-passed"),
    )
    .await;
}

/// See `conformance::late_copy::late_copy_of_a_withdrawn_arrival_after_its_generation_completed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_withdrawn_arrival_landing_after_its_generation_completed_counts_nowhere()
{
    let schema = unique("barrier_late_done");
    let proxy = FaultProxy::start(conformance::testkit::postgres::cluster().port());
    let here = direct(&schema).await.coord();
    let far = slow(&schema, &proxy).await.coord();
    conformance::late_copy::late_copy_of_a_withdrawn_arrival_after_its_generation_completed(
        &far,
        &here,
        &proxy,
        &unique("barrier-late-done"),
    )
    .await;
}
