//! Late copies of a producer's and a consumer's steps: a push held in the
//! network, a timed-out pop, on a queue that
//! delivers each message once (see
//! `conformance::late_copy::late_pop_with_one_delivery_allowed`; a dropped
//! pop is a conformance case), and an extend of a delivery overtaken by a
//! later one.

use crate::common;

use common::unique;
use conformance::testkit::redis::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_timed_out_pop_delivers_nothing() {
    let server = RedisServer::start();
    let (proxy, via, direct) = common::through_proxy(&server).await;
    conformance::late_copy::late_pop_with_one_delivery_allowed(&via, &direct, &proxy, &unique("q"))
        .await;
}

/// See `conformance::late_copy::late_push_lands_once`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_held_in_the_network_lands_once() {
    let server = RedisServer::start();
    let (proxy, via, direct) = common::through_proxy(&server).await;
    conformance::late_copy::late_push_lands_once(&via, &direct, &proxy, &unique("q")).await;
}

/// See `conformance::late_copy::late_copy_of_a_delivery_extend_after_a_later_one`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_an_earlier_delivery_extend_changes_nothing() {
    let server = RedisServer::start();
    let (proxy, via, direct) = common::through_proxy(&server).await;
    conformance::late_copy::late_copy_of_a_delivery_extend_after_a_later_one(
        &via,
        &direct,
        &proxy,
        &unique("q"),
    )
    .await;
}

/// See `conformance::late_copy::late_extend_after_a_later_one`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_short_extend_never_outlives_the_guard() {
    let server = RedisServer::start();
    let (proxy, via, direct) = common::through_proxy(&server).await;
    conformance::late_copy::late_extend_after_a_later_one(&via, &direct, &proxy, &unique("l"))
        .await;
}
