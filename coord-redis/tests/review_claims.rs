//! Adversarial review of the one-key claims: wake-ups and tokens against a
//! real redis-server.

mod common;

use std::time::{Duration, Instant};

use common::{SEC, unique};
use conformance::testkit::redis::RedisServer;
use coord_redis::RedisOptions;

/// Two waiters in one client process, the holder in another. The release
/// wakes one of them (one per process); it takes the lock and releases it
/// at once. The second local waiter must then be woken within a round trip
/// or two, not at its polling fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_local_waiter_is_woken_after_the_first_hands_over() {
    let server = RedisServer::start();
    let holder = RedisOptions::new(&server.url()).connect().await.unwrap();
    let waiters = RedisOptions::new(&server.url())
        .connect()
        .await
        .unwrap()
        .with_poll_interval(Duration::from_secs(120));
    let name = unique("two-local");
    let held = holder
        .locks()
        .unwrap()
        .try_acquire(&name, 60 * SEC)
        .await
        .unwrap()
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (w, n) = (waiters.clone(), name.clone());
        tasks.push(tokio::spawn(async move {
            let g = w
                .locks()
                .unwrap()
                .acquire(&n, 60 * SEC, 20 * SEC)
                .await
                .expect("the waiter gets the lock");
            let at = Instant::now();
            g.release().await.unwrap();
            at
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let mut got = Vec::new();
    for t in tasks {
        got.push(t.await.unwrap());
    }
    got.sort();
    let lag = got[1] - released_at;
    assert!(
        lag < 2 * SEC,
        "the second local waiter got the lock {lag:?} after the first release"
    );
}
