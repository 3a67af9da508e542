//! A late copy of a barrier arrival through a slow network: the first
//! arrival of a waiter behind a proxy is delayed 3 s, past its call
//! timeout; the waiter gives up and is withdrawn; the delayed copy lands
//! afterwards and must not make it a member again.

use crate::support;
use std::time::{Duration, Instant};

use conformance::testkit::proxy::FaultProxy;
use support::{LATENCY, LONG, direct, slow, unique, until_late_attempts_landed};

/// 3 parties: b waits; a's first arrival is delayed 3 s (its call timeout
/// is 200 ms); a times out and is withdrawn; the delayed copy lands. c's
/// arrival must not complete the generation (2 live participants of 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_timed_out_arrival_does_not_count() {
    let schema = unique("barrier_late");
    let proxy = FaultProxy::start(conformance::testkit::postgres::cluster().port());
    let here = direct(&schema).await.coord();
    let far = slow(&schema, &proxy).await.coord();
    let name = unique("barrier-late");
    // Prepare the slow connection's statements: the delayed arrival is
    // then one message, sent at once.
    far.barriers()
        .unwrap()
        .wait(&unique("warm"), 1, "w", LONG)
        .await
        .unwrap();
    let b = tokio::spawn({
        let (here, name) = (here.clone(), name.clone());
        async move { here.barriers().unwrap().wait(&name, 3, "b", LONG).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.latency(LATENCY);
    let started = Instant::now();
    let a = tokio::spawn({
        let (far, name) = (far.clone(), name.clone());
        async move {
            far.barriers()
                .unwrap()
                .wait(&name, 3, "a", Duration::from_millis(600))
                .await
        }
    });
    // Healed before the first arrival times out, so the retries and the
    // withdraw after it are not delayed too.
    tokio::time::sleep(Duration::from_millis(50)).await;
    proxy.latency(Duration::ZERO);
    let a = a.await.unwrap();
    assert!(a.is_err(), "a passed alone with b: {a:?}");
    until_late_attempts_landed(started).await;
    let c = here
        .barriers()
        .unwrap()
        .wait(&name, 3, "c", Duration::from_secs(1))
        .await;
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
