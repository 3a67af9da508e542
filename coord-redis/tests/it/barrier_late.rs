//! A late copy of a barrier arrival through a slow network: the arrival
//! of a waiter behind a proxy is held past the call timeout, the waiter
//! gives up and is withdrawn, and the held copy lands afterwards. It must
//! not make the waiter a member again.

use crate::common;
use std::time::Duration;

use common::{SEC, unique};
use conformance::testkit::proxy::FaultProxy;
use conformance::testkit::redis::RedisServer;
use coord_redis::RedisOptions;

/// 3 parties: b waits; a's arrival is held in the network 2.5 s (its
/// client's call timeout is 200 ms), a times out and is withdrawn; then
/// the held copy lands. c's arrival must not complete the generation (2
/// live participants of 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_timed_out_arrival_does_not_count() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let via = RedisOptions::new(&format!("redis://127.0.0.1:{}", proxy.port()))
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let direct = RedisOptions::new(&server.url()).connect().await.unwrap();
    let name = unique("barrier-late");
    // Warm the slow client's connection, so the held arrival is one message.
    via.barriers()
        .unwrap()
        .wait("warm", 1, "w", SEC)
        .await
        .unwrap();
    let b = tokio::spawn({
        let (direct, name) = (direct.clone(), name.clone());
        async move {
            let barriers = direct.barriers().unwrap();
            barriers.wait(&name, 3, "b", 30 * SEC).await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.deliver_late(
        |chunk| chunk.windows(6).any(|w| w == b"a-late"),
        Duration::from_millis(2500),
        Duration::from_millis(300),
    );
    let a = via.barriers().unwrap().wait(&name, 3, "a-late", SEC).await;
    assert!(a.is_err(), "a passed alone with b: {a:?}");
    assert_eq!(proxy.held(), 1, "the arrival was held");
    let deadline = tokio::time::Instant::now() + 5 * SEC;
    while proxy.delivered() < 1 {
        assert!(tokio::time::Instant::now() < deadline, "never delivered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let the store apply it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let c = direct.barriers().unwrap().wait(&name, 3, "c", SEC).await;
    assert!(
        matches!(c, Err(coord_core::Error::Timeout { .. })),
        "a barrier of 3 passed with 2 live participants (the late copy of a \
         withdrawn arrival counted): {c:?}"
    );
    assert!(
        !b.is_finished(),
        "b passed without a third live participant"
    );
    b.abort();
}
