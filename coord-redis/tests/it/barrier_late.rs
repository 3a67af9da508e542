//! A late copy of a barrier arrival through a slow network (see
//! `conformance::late_copy::late_copy_of_a_timed_out_barrier_arrival`).

use crate::common;

use common::unique;
use conformance::testkit::redis::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_timed_out_arrival_does_not_count() {
    let server = RedisServer::start();
    let (proxy, via, direct) = common::through_proxy(&server).await;
    conformance::late_copy::late_copy_of_a_timed_out_barrier_arrival(
        &via,
        &direct,
        &proxy,
        &unique("barrier-late"),
    )
    .await;
}

/// See `conformance::late_copy::late_copy_of_an_arrival_that_passed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_an_arrival_that_passed_counts_nowhere() {
    let server = RedisServer::start();
    let (proxy, via, direct) = common::through_proxy(&server).await;
    conformance::late_copy::late_copy_of_an_arrival_that_passed(
        &via,
        &direct,
        &proxy,
        &unique("barrier-passed"),
    )
    .await;
}

/// See `conformance::late_copy::late_copy_of_a_withdrawn_arrival_after_its_generation_completed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_withdrawn_arrival_landing_after_its_generation_completed_counts_nowhere()
{
    let server = RedisServer::start();
    let (proxy, via, direct) = common::through_proxy(&server).await;
    conformance::late_copy::late_copy_of_a_withdrawn_arrival_after_its_generation_completed(
        &via,
        &direct,
        &proxy,
        &unique("barrier-late-done"),
    )
    .await;
}
