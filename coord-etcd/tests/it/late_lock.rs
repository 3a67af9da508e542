//! Late lock attempts (the etcd twin of coord-redis's
//! `tests/it/claim_wakeups_and_tokens.rs` and `tests/it/late_claims.rs`):
//! a transaction of a lock attempt that its client gave up on (the call
//! timed out on a slow link) still reaches etcd after the acquire has
//! ended. It must take nothing: no lock nobody releases
//! (for its TTL, 60 s) and no place in line nobody waits for.
//!
//! On etcd the attempt writes its key on a lease that the client revokes
//! when it gives the owner up (or never hands on as a spare while the
//! attempt may still land), and etcd refuses a transaction whose lease is
//! gone. These tests hold that to account.
//!
//! The fault is [`FaultProxy::deliver_late`], as in `semaphore_late.rs`:
//! the attempt's transaction (picked by the owner's lock key in its bytes)
//! is held [`LATE`] and then written on its old connection, while the
//! client's end of that connection is cut after [`CUT_AFTER`], so its
//! retry, release and cleanup reach etcd first, on a new connection.

use std::sync::Arc;
use std::time::Duration;

use conformance::testkit::etcd;
use conformance::testkit::proxy::FaultProxy;
use coord_core::{Attempt, Error, Lock, OwnerToken};
use coord_etcd::EtcdBackend;
use late_support::{
    CALL_TIMEOUT, CUT_AFTER, SEC, connect, direct, unique, until_answered,
    until_the_late_copy_landed, writes_an_owner_key,
};

use crate::late_support;
/// The slow client (calls time out after `timeout`), its connection
/// warmed by a lock cycle on another name.
async fn slow(prefix: &str, proxy: &FaultProxy, timeout: Duration) -> Arc<EtcdBackend> {
    let b = connect(proxy.port(), prefix, timeout).await;
    let o = OwnerToken::random();
    // The same owner's retry of an unanswered attempt is that attempt.
    granted(Ok(until_answered("the warm-up acquire", || {
        b.try_acquire("warm", o.step(), 2 * SEC)
    })
    .await));
    assert!(until_answered("the warm-up release", || b.release("warm", o.step())).await);
    b
}

/// The call timeout of the slow client whose held attempt fails by the
/// cut ([`CUT_AFTER`]), not by a timeout: its other calls (the retry, the
/// release, the revoke of the held attempt's lease, which must land before
/// the held copy) are answered on a loaded machine too.
const PATIENT: Duration = Duration::from_secs(2);

/// How late the held attempt of an acquire lands: after that acquire
/// ended, although its client's connection was cut under it and the
/// acquire's later attempts waited for the reconnect ([`WAIT`]).
const LATE: Duration = Duration::from_secs(5);
/// How long those acquires wait: room for the reconnect after the cut,
/// so their last attempt is answered, on a loaded machine too.
const WAIT: Duration = Duration::from_secs(3);

fn granted(a: coord_core::Result<Attempt>) {
    assert!(
        matches!(a, Ok(Attempt::Granted(_))),
        "expected a grant: {a:?}"
    );
}

/// The keys of the lock `name` under `prefix`, with their leases.
async fn keys(prefix: &str, name: &str) -> Vec<(String, i64)> {
    late_support::keys(prefix, &format!("lock/{name}/")).await
}

/// A waiting acquire's attempt is held in the network; the acquire times
/// out (the lock is held), the holder releases, then the held transaction
/// lands on the free lock. The next acquire must be granted at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_attempt_after_a_timed_out_acquire_takes_no_lock() {
    let prefix = unique("late-lock");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let far = slow(&prefix, &proxy, PATIENT).await;
    let near = direct(&prefix).await;
    let holder = OwnerToken::random();
    granted(near.try_acquire("ghost", holder.step(), 60 * SEC).await);
    proxy.deliver_late(
        writes_an_owner_key("lock/ghost/".to_string()),
        LATE,
        CUT_AFTER,
    );
    let locks = far.coord().locks().unwrap();
    let r = locks.acquire("ghost", 60 * SEC, WAIT).await;
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "expected a timeout: {r:?}"
    );
    assert_eq!(proxy.held(), 1, "no attempt was held");
    assert_eq!(proxy.delivered(), 0, "the held attempt was not late");
    assert!(near.release("ghost", holder.step()).await.unwrap());
    until_the_late_copy_landed(&proxy).await;
    let left = keys(&prefix, "ghost").await;
    let a = near
        .try_acquire("ghost", OwnerToken::random().step(), 10 * SEC)
        .await;
    assert!(
        matches!(a, Ok(Attempt::Granted(_))),
        "the lock is free and nobody waits, yet an attempt got {a:?} (keys: \
         {left:?}: the timed-out waiter's late attempt took it)"
    );
    assert!(left.is_empty(), "keys left: {left:?}");
}

/// An acquire's first attempt is held in the network past the call
/// timeout; its retry is granted and the lock released; then the held
/// transaction lands. It must not take the lock (its lease may have gone
/// back to the spare pool with the grant, still alive).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_attempt_after_a_granted_retry_and_release_takes_no_lock() {
    let prefix = unique("late-retry");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let far = slow(&prefix, &proxy, PATIENT).await;
    let near = direct(&prefix).await;
    proxy.deliver_late(
        writes_an_owner_key("lock/ghost/".to_string()),
        LATE,
        CUT_AFTER,
    );
    let locks = far.coord().locks().unwrap();
    let g = locks
        .acquire("ghost", 60 * SEC, WAIT)
        .await
        .expect("the retry was not granted");
    assert_eq!(proxy.held(), 1, "no attempt was held");
    g.release().await.unwrap();
    assert_eq!(proxy.delivered(), 0, "the held attempt was not late");
    until_the_late_copy_landed(&proxy).await;
    let left = keys(&prefix, "ghost").await;
    let a = near
        .try_acquire("ghost", OwnerToken::random().step(), 10 * SEC)
        .await;
    assert!(
        matches!(a, Ok(Attempt::Granted(_))),
        "the lock is free and nobody waits, yet an attempt got {a:?} (keys: \
         {left:?}: the released owner's late attempt took it)"
    );
    assert!(left.is_empty(), "keys left by a released owner: {left:?}");
}

/// A one-shot attempt is held in the network; its owner gives up and
/// releases, which revokes the attempt's lease, but the store does not
/// answer for 6 s (more than a few tries of that revoke). The held
/// transaction lands after the store answers again, maybe on the lease
/// that still lives: a key nobody holds. The client's revoke, tried again
/// until answered, must end it soon after, not at the lease's TTL (60 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_attempt_is_ended_by_its_cleanup_after_a_long_outage() {
    let prefix = unique("late-outage");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    // After the outage the client's connections are closed, as a real
    // one's time out, and it connects again.
    proxy.close_after_loss(true);
    let far = slow(&prefix, &proxy, CALL_TIMEOUT).await;
    let near = direct(&prefix).await;
    proxy.deliver_late(
        writes_an_owner_key("lock/ghost/".to_string()),
        Duration::from_secs(8),
        CUT_AFTER,
    );
    let owner = OwnerToken::random();
    let attempt = {
        let far = far.clone();
        tokio::spawn(async move { far.try_acquire("ghost", owner.step(), 60 * SEC).await })
    };
    conformance::testkit::wait::until("the attempt held", 10 * SEC, || async { proxy.held() == 1 })
        .await;
    proxy.blackhole();
    let r = attempt.await.unwrap();
    assert!(r.is_err(), "the held attempt was answered: {r:?}");
    let outage = tokio::time::Instant::now();
    let r = far.release("ghost", owner.step()).await;
    assert!(r.is_err(), "the release was answered in the outage: {r:?}");
    tokio::time::sleep_until(outage + 6 * SEC).await;
    proxy.heal();
    conformance::testkit::wait::until("the late copy delivered", 10 * SEC, || async {
        proxy.delivered() == 1
    })
    .await;
    let freed = conformance::testkit::wait::holds_within(20 * SEC, || async {
        keys(&prefix, "ghost").await.is_empty()
    })
    .await;
    assert!(
        freed.is_some(),
        "the late attempt's key is still there 20 s after the store answers again \
         (keys: {:?}): its lease's revoke was given up",
        keys(&prefix, "ghost").await
    );
    let a = near
        .try_acquire("ghost", OwnerToken::random().step(), 10 * SEC)
        .await;
    granted(a);
}

/// See `conformance::late_copy::late_copy_after_extend`.
async fn late_copy_after_extend(kind: conformance::claim_kind::ClaimKind) {
    let prefix = unique("late-extend");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let far = connect(proxy.port(), &prefix, CALL_TIMEOUT).await;
    let near = direct(&prefix).await;
    conformance::late_copy::late_copy_after_extend(
        kind,
        &*far,
        &*near,
        &proxy,
        unique("late-extend").trim_end_matches('/'),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_late_copy_of_a_holders_first_attempt_never_shortens_its_extend() {
    late_copy_after_extend(conformance::claim_kind::ClaimKind::Lock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_late_copy_of_a_holders_first_attempt_never_shortens_its_extend() {
    late_copy_after_extend(conformance::claim_kind::ClaimKind::Semaphore).await;
}

/// See `conformance::late_copy::late_copy_of_a_timed_out_barrier_arrival`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_timed_out_barrier_arrival_does_not_count() {
    let prefix = unique("late-barrier");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let far = connect(proxy.port(), &prefix, CALL_TIMEOUT).await;
    let near = direct(&prefix).await;
    conformance::late_copy::late_copy_of_a_timed_out_barrier_arrival(
        &far.coord(),
        &near.coord(),
        &proxy,
        unique("barrier").trim_end_matches('/'),
    )
    .await;
}

/// See `conformance::late_copy::late_copy_of_a_withdrawn_arrival_after_its_generation_completed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_withdrawn_barrier_arrival_after_its_generation_completed_counts_nowhere()
{
    let prefix = unique("late-barrier-done");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let far = connect(proxy.port(), &prefix, CALL_TIMEOUT).await;
    let near = direct(&prefix).await;
    conformance::late_copy::late_copy_of_a_withdrawn_arrival_after_its_generation_completed(
        &far.coord(),
        &near.coord(),
        &proxy,
        unique("barrier-done").trim_end_matches('/'),
    )
    .await;
}

/// See `conformance::late_copy::late_pop_with_one_delivery_allowed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_timed_out_pop_delivers_nothing() {
    let prefix = unique("late-pop");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let far = connect(proxy.port(), &prefix, CALL_TIMEOUT).await;
    let near = direct(&prefix).await;
    conformance::late_copy::late_pop_with_one_delivery_allowed(
        &far.coord(),
        &near.coord(),
        &proxy,
        unique("q").trim_end_matches('/'),
    )
    .await;
}

/// See `conformance::late_copy::late_push_lands_once`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_held_in_the_network_lands_once() {
    let prefix = unique("late-push");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let far = connect(proxy.port(), &prefix, CALL_TIMEOUT).await;
    let near = direct(&prefix).await;
    conformance::late_copy::late_push_lands_once(
        &far.coord(),
        &near.coord(),
        &proxy,
        unique("q").trim_end_matches('/'),
    )
    .await;
}

/// See `conformance::late_copy::late_copy_of_a_delivery_extend_after_a_later_one`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_an_earlier_delivery_extend_changes_nothing() {
    let prefix = unique("late-qext");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let far = connect(proxy.port(), &prefix, CALL_TIMEOUT).await;
    let near = direct(&prefix).await;
    conformance::late_copy::late_copy_of_a_delivery_extend_after_a_later_one(
        &far.coord(),
        &near.coord(),
        &proxy,
        unique("q").trim_end_matches('/'),
    )
    .await;
}

/// See `conformance::late_copy::late_extend_after_a_later_one`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_short_extend_never_outlives_the_guard() {
    let prefix = unique("late-extend");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let far = connect(proxy.port(), &prefix, CALL_TIMEOUT).await;
    let near = direct(&prefix).await;
    conformance::late_copy::late_extend_after_a_later_one(
        &far.coord(),
        &near.coord(),
        &proxy,
        unique("l").trim_end_matches('/'),
    )
    .await;
}

/// See `conformance::late_copy::late_copy_of_an_arrival_that_passed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_an_arrival_that_passed_counts_nowhere() {
    let prefix = unique("barrier-passed");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let far = connect(proxy.port(), &prefix, CALL_TIMEOUT).await;
    let near = direct(&prefix).await;
    conformance::late_copy::late_copy_of_an_arrival_that_passed(
        &far.coord(),
        &near.coord(),
        &proxy,
        unique("barrier").trim_end_matches('/'),
    )
    .await;
}

/// See `conformance::late_copy::late_copy_of_an_extend_after_a_later_one`.
async fn late_extend_after_a_later_one(kind: conformance::claim_kind::ClaimKind) {
    let prefix = unique("late-extend2");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let far = connect(proxy.port(), &prefix, CALL_TIMEOUT).await;
    let near = direct(&prefix).await;
    conformance::late_copy::late_copy_of_an_extend_after_a_later_one(
        kind,
        &*far,
        &*near,
        &proxy,
        unique("late-extend2").trim_end_matches('/'),
        // A semaphore extend reads the grant first, then writes the
        // owner's token into its slots: the write is the one held.
        kind == conformance::claim_kind::ClaimKind::Semaphore,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_late_copy_of_an_extend_never_undoes_a_later_one() {
    late_extend_after_a_later_one(conformance::claim_kind::ClaimKind::Lock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_late_copy_of_an_extend_never_undoes_a_later_one() {
    late_extend_after_a_later_one(conformance::claim_kind::ClaimKind::Semaphore).await;
}
