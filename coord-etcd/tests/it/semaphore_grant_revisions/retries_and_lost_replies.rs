//! A retry of an owner's grant with a longer TTL (through another client
//! or the same one) keeps the grant that long, and a lost reply of a
//! moving extend (also an adopter's first) keeps the grant.

use std::sync::Arc;
use std::time::Duration;

use conformance::testkit::etcd;
use conformance::testkit::proxy::FaultProxy;
use coord_core::{Attempt, OwnerToken};
use tokio::time::sleep;

use crate::semaphore_support;
use semaphore_support::*;

/// The trait: "If `owner` already holds a grant of `name`, the attempt
/// succeeds again with the same token ... it may refresh the TTL", and the
/// reference store (coord-memory) sets the grant's expiry to the retry's
/// TTL. A retry through another client with a longer TTL is answered
/// Granted (the caller counts its validity from that TTL), so the grant
/// must then last that long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_through_other_client_with_longer_ttl_keeps_the_grant_that_long() {
    let p = unique("fix-ttl2");
    let (ca, cb) = (coord(&p).await, coord(&p).await);
    let (a, b) = (raw(&ca), raw(&cb));
    let n = "t";
    let o = OwnerToken::random();
    let t1 = granted(a.try_acquire(n, o.step(), &req(1, 1, SHORT, false)).await);
    let t2 = granted(b.try_acquire(n, o.step(), &req(1, 1, LONG, false)).await);
    assert_eq!(t1, t2);
    sleep(PAST_SHORT).await;
    let kept = has_grant(&p, n, &o).await;
    let intruder = b
        .try_acquire(n, OwnerToken::random().step(), &req(1, 1, LONG, false))
        .await;
    assert!(
        kept,
        "adopted grant answered Granted for {LONG:?} but etcd dropped it after {PAST_SHORT:?} \
         (the first client's {SHORT:?} lease); a new owner then got {intruder:?}"
    );
    assert!(matches!(intruder, Ok(Attempt::Held { .. })), "{intruder:?}");
    assert!(b.release(n, o.step()).await.unwrap());
}

/// The same through one client: a retry of an own grant with a longer TTL
/// is answered Granted, so it must last the longer TTL (as on memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_through_same_client_with_longer_ttl_keeps_the_grant_that_long() {
    let p = unique("fix-ttl1");
    let ca = coord(&p).await;
    let a = raw(&ca);
    let n = "t";
    let o = OwnerToken::random();
    let t1 = granted(a.try_acquire(n, o.step(), &req(1, 1, SHORT, false)).await);
    let t2 = granted(a.try_acquire(n, o.step(), &req(1, 1, LONG, false)).await);
    assert_eq!(t1, t2);
    sleep(PAST_SHORT).await;
    let kept = has_grant(&p, n, &o).await;
    let intruder = a
        .try_acquire(n, OwnerToken::random().step(), &req(1, 1, LONG, false))
        .await;
    assert!(
        kept,
        "retried grant answered Granted for {LONG:?} but etcd dropped it after {PAST_SHORT:?} \
         (the first attempt's {SHORT:?} lease); a new owner then got {intruder:?}"
    );
    assert!(matches!(intruder, Ok(Attempt::Held { .. })), "{intruder:?}");
    assert!(a.release(n, o.step()).await.unwrap());
}

/// An extend that moves the grant (another TTL) whose reply is lost: the
/// call errs, so the holder knows nothing new, and its grant must still be
/// held until its last known deadline (the grant was live; an extend never
/// ends a grant). If the move landed on the new lease and that lease is
/// then revoked for the error, the grant is gone while its holder (still
/// inside its validity) believes it holds, and another owner is granted the
/// same permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_reply_of_a_moving_extend_keeps_the_grant() {
    let p = unique("fix-lostmove");
    let proxy = Arc::new(FaultProxy::start(etcd::shared().client_port()));
    let far_c = coord_at(proxy.port(), &p, 3000).await;
    let far = raw(&far_c);
    let near_c = coord(&p).await;
    let near = raw(&near_c);
    let n = "m";
    let o = OwnerToken::random();
    granted(far.try_acquire(n, o.step(), &req(1, 1, LONG, false)).await);
    let g = state(&p, n).await.0[0].clone();
    // Another TTL: a move. Its request reaches etcd, its reply does not.
    let dropper = drop_reply_of_move(proxy.clone(), g.key.clone(), g.lease);
    sleep(Duration::from_millis(200)).await;
    proxy.latency(Duration::from_millis(250));
    let r = far.extend(n, o.step(), Duration::from_secs(20)).await;
    let moved = tokio::time::timeout(Duration::from_secs(5), dropper)
        .await
        .map(|j| j.unwrap())
        .unwrap_or(false);
    proxy.heal();
    assert!(
        moved && r.is_err(),
        "the move applied ({moved}), its reply dropped: {r:?}"
    );
    // The revocation (if any) runs in the background.
    sleep(Duration::from_millis(1500)).await;
    let kept = has_grant(&p, n, &o).await;
    let ext = far.extend(n, o.step(), LONG).await;
    let intruder = near
        .try_acquire(n, OwnerToken::random().step(), &req(1, 1, LONG, false))
        .await;
    assert!(
        kept && matches!(ext, Ok(true)),
        "grant kept in etcd: {kept}; extend through the healed client (within the grant's \
         {LONG:?}): {ext:?}; a second owner then got {intruder:?}"
    );
    assert!(matches!(intruder, Ok(Attempt::Held { .. })), "{intruder:?}");
    let _ = far.release(n, o.step()).await;
}

/// Same, for an adopted grant. A retry of the owner through another
/// client moves the grant onto that client's lease with the retry's TTL
/// at once (the adopted lease's TTL is unknown), so the move whose reply
/// is lost here is the retry's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_reply_of_an_adopters_first_extend_keeps_the_grant() {
    let p = unique("fix-lostadopt");
    let proxy = Arc::new(FaultProxy::start(etcd::shared().client_port()));
    let far_c = coord_at(proxy.port(), &p, 3000).await;
    let far = raw(&far_c);
    let near_c = coord(&p).await;
    let near = raw(&near_c);
    let n = "m";
    let o = OwnerToken::random();
    granted(near.try_acquire(n, o.step(), &req(1, 1, LONG, false)).await);
    let g = state(&p, n).await.0[0].clone();
    let dropper = drop_reply_of_move(proxy.clone(), g.key.clone(), g.lease);
    sleep(Duration::from_millis(200)).await;
    proxy.latency(Duration::from_millis(250));
    let r = far.try_acquire(n, o.step(), &req(1, 1, LONG, false)).await;
    let moved = tokio::time::timeout(Duration::from_secs(5), dropper)
        .await
        .map(|j| j.unwrap())
        .unwrap_or(false);
    proxy.heal();
    assert!(
        moved && r.is_err(),
        "the move applied ({moved}), its reply dropped: {r:?}"
    );
    sleep(Duration::from_millis(1500)).await;
    let kept = has_grant(&p, n, &o).await;
    let intruder = near
        .try_acquire(n, OwnerToken::random().step(), &req(1, 1, LONG, false))
        .await;
    assert!(
        kept,
        "adopted grant gone after a lost extend reply (its writer still holds it for \
         {LONG:?}); a second owner then got {intruder:?}"
    );
    assert!(matches!(intruder, Ok(Attempt::Held { .. })), "{intruder:?}");
    let _ = near.release(n, o.step()).await;
}
