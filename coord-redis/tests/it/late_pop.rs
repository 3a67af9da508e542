//! A late copy of a timed-out pop, on a queue that delivers each message
//! once (see `conformance::late_copy::late_pop_with_one_delivery_allowed`;
//! a dropped pop is a conformance case).

use crate::common;
use std::time::Duration;

use common::unique;
use conformance::testkit::proxy::FaultProxy;
use conformance::testkit::redis::RedisServer;
use coord_redis::RedisOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_timed_out_pop_delivers_nothing() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let via = RedisOptions::new(&format!("redis://127.0.0.1:{}", proxy.port()))
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let direct = RedisOptions::new(&server.url()).connect().await.unwrap();
    conformance::late_copy::late_pop_with_one_delivery_allowed(&via, &direct, &proxy, &unique("q"))
        .await;
}

/// See `conformance::late_copy::late_extend_after_a_later_one`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_short_extend_never_outlives_the_guard() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let via = RedisOptions::new(&format!("redis://127.0.0.1:{}", proxy.port()))
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let direct = RedisOptions::new(&server.url()).connect().await.unwrap();
    conformance::late_copy::late_extend_after_a_later_one(&via, &direct, &proxy, &unique("l"))
        .await;
}
