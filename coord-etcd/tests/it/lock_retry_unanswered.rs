//! A lock attempt whose transaction is held in the network (its call
//! fails), then the same owner's retry, whose transaction is slow past the
//! call timeout (unanswered, applied later), then the owner's release.
//! The retry records its own lease for the key the first attempt may
//! still write; the first attempt's lease, recorded nowhere any more, must
//! be revoked when the retry ends unanswered, or the held transaction,
//! landing after the release, takes the lock for nobody until that
//! lease's TTL (60 s).

use std::time::Duration;

use conformance::testkit::etcd;
use conformance::testkit::proxy::FaultProxy;
use conformance::testkit::wait::holds_within;
use coord_core::{Attempt, Lock, OwnerToken};
use late_support::{
    CUT_AFTER, SEC, connect, direct, unique, until_answered, until_the_late_copy_landed,
    writes_an_owner_key,
};
use tokio::time::sleep;

use crate::late_support;

/// The far client's call timeout.
const PATIENT: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_attempt_landing_after_an_unanswered_retry_and_a_release_takes_no_lock() {
    let prefix = unique("late-retry-unanswered");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let far = connect(proxy.port(), &prefix, PATIENT).await;
    let near = direct(&prefix).await;
    // Warm the far client's connection (another name, another TTL).
    let w = OwnerToken::random();
    until_answered("the warm-up acquire", || {
        far.try_acquire("warm", w.step(), 2 * SEC)
    })
    .await;
    assert!(until_answered("the warm-up release", || far.release("warm", w.step())).await);

    let o = OwnerToken::random();
    proxy.deliver_late(
        writes_an_owner_key("lock/ghost/".to_string()),
        8 * SEC,
        CUT_AFTER,
    );
    let first = far.try_acquire("ghost", o.step(), 60 * SEC).await;
    assert!(first.is_err(), "the held attempt was answered: {first:?}");
    assert_eq!(proxy.held(), 1, "no attempt was held");
    // The retry's transaction reaches etcd after the retry gave up.
    proxy.watch(b"lock/ghost/");
    proxy.slow_requests(b"lock/ghost/", PATIENT + Duration::from_millis(500));
    let second = far.try_acquire("ghost", o.step(), 60 * SEC).await;
    assert!(second.is_err(), "the slow retry was answered: {second:?}");
    assert!(proxy.seen() >= 1, "the retry sent no transaction");
    sleep(SEC).await;
    proxy.heal();
    assert_eq!(proxy.delivered(), 0, "the held attempt was not late");
    // The owner's cleanup.
    until_answered("the release", || far.release("ghost", o.step())).await;
    until_the_late_copy_landed(&proxy).await;
    let keys = || late_support::keys(&prefix, "lock/ghost/");
    let freed = holds_within(5 * SEC, || async { keys().await.is_empty() }).await;
    assert!(
        freed.is_some(),
        "the first attempt, landing after its owner's release, holds the lock for nobody \
         (keys: {:?}): its lease was not revoked when the retry ended unanswered",
        keys().await
    );
    let a = near
        .try_acquire("ghost", OwnerToken::random().step(), 10 * SEC)
        .await;
    assert!(matches!(a, Ok(Attempt::Granted(_))), "{a:?}");
}
