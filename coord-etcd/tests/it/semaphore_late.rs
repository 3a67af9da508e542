//! Late semaphore attempts: a transaction of an attempt that its client
//! gave up on (the call timed out on a slow link, or the acquire was
//! cancelled mid-call) still reaches etcd, after the acquire has ended and
//! released. It must change nothing: no place in line nobody waits for
//! (FIFO: it would hold up every later request on the name until it
//! lapses) and no grant nobody releases.
//!
//! On etcd a late transaction writes its keys on a lease, and etcd refuses
//! (as a whole) a transaction whose lease is gone: it is harmless exactly
//! when that lease was revoked before it lands, and not handed on as a
//! spare meanwhile.
//!
//! The fault is made real with [`FaultProxy::deliver_late`]: the slow
//! client (call timeout [`CALL_TIMEOUT`]) reads the name at once, then its
//! transaction (picked by the keys in its bytes) is held [`DELAY`] and
//! written to etcd on its old connection, while the client's end of that
//! connection goes silent and is cut after [`CUT_AFTER`]: the client
//! retries on a new connection and its retry, release and cleanup all
//! reach etcd before the late copy. (A plain latency on the one HTTP/2
//! connection cannot do it: everything sent after a delayed request waits
//! behind it, so it is never overtaken.)

use std::sync::Arc;
use std::time::Duration;

use conformance::testkit::etcd;
use conformance::testkit::proxy::FaultProxy;
use coord_core::{Attempt, Error, OwnerToken, PermitRequest, Semaphore};
use coord_etcd::EtcdBackend;
use late_support::{
    CALL_TIMEOUT, CUT_AFTER, DELAY, SEC, connect, direct, find, unique, until, until_answered,
    until_the_late_copy_landed, writes_an_owner_key,
};
use tokio::time::sleep;

use crate::late_support;
/// The slow client: through `proxy`, call timeout [`CALL_TIMEOUT`], its
/// connection warmed by one grant and release on another name.
async fn slow(prefix: &str, proxy: &FaultProxy) -> Arc<EtcdBackend> {
    let b = connect(proxy.port(), prefix, CALL_TIMEOUT).await;
    let o = OwnerToken::random();
    let r = req(1, 2 * SEC, false);
    // The same owner's retry of an unanswered attempt is that attempt.
    granted(Ok(until_answered("the warm-up acquire", || {
        b.try_acquire("warm", o.step(), &r)
    })
    .await));
    assert!(until_answered("the warm-up release", || b.release("warm", o.step())).await);
    b
}

fn req(total: u32, ttl: Duration, queue: bool) -> PermitRequest {
    PermitRequest {
        permits: 1,
        total,
        ttl,
        queue,
    }
}

fn granted(a: coord_core::Result<Attempt>) {
    assert!(
        matches!(a, Ok(Attempt::Granted(_))),
        "expected a grant: {a:?}"
    );
}

/// Bytes of a grant transaction on `name` taking slot 0 (the name's read
/// has the slots' range `s/`..`s0`, never `s/0`).
fn takes_slot_0(name: &str) -> impl Fn(&[u8]) -> bool + Send + Sync + 'static {
    let key = format!("sem/{name}/s/0").into_bytes();
    move |b| find(b, &key).is_some()
}

/// Bytes of a transaction writing an owner's place on `name` (`w/` and an
/// owner's hex). The first on a full name is the attempt that queues.
fn writes_a_place(name: &str) -> impl Fn(&[u8]) -> bool + Send + Sync + 'static {
    writes_an_owner_key(format!("sem/{name}/w/"))
}

/// The keys of the semaphore `name` under `prefix`, with their leases.
async fn keys(prefix: &str, name: &str) -> Vec<(String, i64)> {
    late_support::keys(prefix, &format!("sem/{name}/")).await
}

/// A waiting acquire's attempt that queues is held in the network; the
/// acquire times out meanwhile and its release removes what it left; then
/// the held transaction lands. It must not queue the owner again: a place
/// nobody renews or removes blocks every request on the name (even a
/// single attempt with every permit free) for 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_attempt_after_a_timed_out_acquire_leaves_no_place() {
    let prefix = unique("late-place");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let far = slow(&prefix, &proxy).await;
    let near = direct(&prefix).await;
    let holder = OwnerToken::random();
    granted(
        near.try_acquire("ghost", holder.step(), &req(1, 60 * SEC, false))
            .await,
    );
    proxy.deliver_late(writes_a_place("ghost"), DELAY, CUT_AFTER);
    let sems = far.coord().semaphores().unwrap();
    let r = sems.acquire("ghost", 1, 60 * SEC, SEC).await;
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "expected a timeout: {r:?}"
    );
    assert_eq!(proxy.held(), 1, "no attempt was held");
    assert_eq!(proxy.delivered(), 0, "the held attempt was not late");
    let now = keys(&prefix, "ghost").await;
    assert!(
        now.iter().all(|(k, _)| !k.contains("/w/")),
        "the timed-out acquire's release left its place: {now:?}"
    );
    until_the_late_copy_landed(&proxy).await;
    assert!(near.release("ghost", holder.step()).await.unwrap());
    let left = keys(&prefix, "ghost").await;
    let a = near
        .try_acquire(
            "ghost",
            OwnerToken::random().step(),
            &req(1, 10 * SEC, false),
        )
        .await;
    assert!(
        matches!(a, Ok(Attempt::Granted(_))),
        "every permit is free and nobody waits, yet a single attempt got {a:?} \
         (keys: {left:?}: the timed-out waiter's place came back)"
    );
}

/// An acquire's grant transaction is held in the network past the call
/// timeout; its retry is granted at once and the permit released right
/// away; then the held transaction lands. It must not take the permit for
/// nobody (until its TTL, 60 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_attempt_after_a_release_takes_no_permit() {
    let prefix = unique("late-grant");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let far = slow(&prefix, &proxy).await;
    let near = direct(&prefix).await;
    proxy.deliver_late(takes_slot_0("late-grant"), DELAY, CUT_AFTER);
    let sems = far.coord().semaphores().unwrap();
    let permit = sems
        .acquire("late-grant", 1, 60 * SEC, 3 * SEC)
        .await
        .expect("the retry was not granted");
    assert_eq!(proxy.held(), 1, "no attempt was held");
    permit.release().await.unwrap();
    assert_eq!(proxy.delivered(), 0, "the held attempt was not late");
    until_the_late_copy_landed(&proxy).await;
    let left = keys(&prefix, "late-grant").await;
    let a = near
        .try_acquire(
            "late-grant",
            OwnerToken::random().step(),
            &req(1, 10 * SEC, false),
        )
        .await;
    assert!(
        matches!(a, Ok(Attempt::Granted(_))),
        "the only permit is free and nobody waits, yet a single attempt got {a:?} \
         (keys: {left:?}: the released owner's late attempt took it)"
    );
    assert!(left.is_empty(), "keys left: {left:?}");
}

/// A waiting acquire's attempt that queues is held in the network; the
/// holder releases meanwhile, so the acquire's retry is granted at once
/// (taking no place), and the permit is released; then the held
/// transaction lands. It must not queue the owner: its place's lease went
/// to the spare pool with the grant, still alive, so the late copy wrote
/// a place on it that nobody renews or removes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_place_after_a_granted_acquire_leaves_no_place() {
    let prefix = unique("late-place-granted");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let far = slow(&prefix, &proxy).await;
    let near = direct(&prefix).await;
    let holder = OwnerToken::random();
    granted(
        near.try_acquire("ghost", holder.step(), &req(1, 60 * SEC, false))
            .await,
    );
    proxy.deliver_late(writes_a_place("ghost"), DELAY, CUT_AFTER);
    let acquire = tokio::spawn({
        let sems = far.coord().semaphores().unwrap();
        async move { sems.acquire("ghost", 1, 60 * SEC, 5 * SEC).await }
    });
    until("the queueing attempt held", 5 * SEC, || proxy.held() >= 1).await;
    assert!(near.release("ghost", holder.step()).await.unwrap());
    let permit = acquire.await.unwrap().expect("the retry was not granted");
    permit.release().await.unwrap();
    assert_eq!(proxy.delivered(), 0, "the held attempt was not late");
    until_the_late_copy_landed(&proxy).await;
    let left = keys(&prefix, "ghost").await;
    let a = near
        .try_acquire(
            "ghost",
            OwnerToken::random().step(),
            &req(1, 10 * SEC, false),
        )
        .await;
    assert!(
        matches!(a, Ok(Attempt::Granted(_))),
        "every permit is free and nobody waits, yet a single attempt got {a:?} \
         (keys: {left:?}: the granted waiter's place came back)"
    );
}

/// An acquire is cancelled (its future dropped) while its grant
/// transaction is held in the network; the cancellation's cleanup runs;
/// then the held transaction lands. It must not take the permit for
/// nobody (until its TTL, 60 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_attempt_of_a_cancelled_acquire_takes_no_permit() {
    let prefix = unique("late-cancel");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let far = slow(&prefix, &proxy).await;
    let near = direct(&prefix).await;
    proxy.deliver_late(takes_slot_0("cancelled"), DELAY, CUT_AFTER);
    let acquire = tokio::spawn({
        let sems = far.coord().semaphores().unwrap();
        async move { sems.acquire("cancelled", 1, 60 * SEC, 10 * SEC).await }
    });
    until("the grant held", 5 * SEC, || proxy.held() >= 1).await;
    // Mid-call (before the call timeout): the transaction is on its way,
    // its reply not come. After the proxy took the request's bytes (30
    // ms): the cancellation of the call stays behind, as when a member
    // forwarded the request on to the leader before the cancel came.
    sleep(Duration::from_millis(100)).await;
    acquire.abort();
    assert!(acquire.await.unwrap_err().is_cancelled());
    // The cleanup (in the background) and anything else reach etcd first.
    sleep(CUT_AFTER + Duration::from_millis(300)).await;
    assert_eq!(proxy.delivered(), 0, "the held attempt was not late");
    until_the_late_copy_landed(&proxy).await;
    let left = keys(&prefix, "cancelled").await;
    let a = near
        .try_acquire(
            "cancelled",
            OwnerToken::random().step(),
            &req(1, 10 * SEC, false),
        )
        .await;
    assert!(
        matches!(a, Ok(Attempt::Granted(_))),
        "the only permit is free and nobody waits, yet a single attempt got {a:?} \
         (keys: {left:?}: the cancelled acquire's late attempt took it)"
    );
}

/// An acquire is cancelled while its attempt that queues is held in the
/// network; the cancellation's cleanup runs; then the held transaction
/// lands. It must not queue the owner: a place nobody renews or removes
/// blocks every request on the name for 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_place_of_a_cancelled_acquire_leaves_no_place() {
    let prefix = unique("late-cancel-place");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let far = slow(&prefix, &proxy).await;
    let near = direct(&prefix).await;
    let holder = OwnerToken::random();
    granted(
        near.try_acquire("ghost", holder.step(), &req(1, 60 * SEC, false))
            .await,
    );
    proxy.deliver_late(writes_a_place("ghost"), DELAY, CUT_AFTER);
    let acquire = tokio::spawn({
        let sems = far.coord().semaphores().unwrap();
        async move { sems.acquire("ghost", 1, 60 * SEC, 10 * SEC).await }
    });
    until("the queueing attempt held", 5 * SEC, || proxy.held() >= 1).await;
    // Mid-call, after the proxy took the request's bytes (see above).
    sleep(Duration::from_millis(100)).await;
    acquire.abort();
    assert!(acquire.await.unwrap_err().is_cancelled());
    sleep(CUT_AFTER + Duration::from_millis(300)).await;
    assert_eq!(proxy.delivered(), 0, "the held attempt was not late");
    until_the_late_copy_landed(&proxy).await;
    assert!(near.release("ghost", holder.step()).await.unwrap());
    let left = keys(&prefix, "ghost").await;
    let a = near
        .try_acquire(
            "ghost",
            OwnerToken::random().step(),
            &req(1, 10 * SEC, false),
        )
        .await;
    assert!(
        matches!(a, Ok(Attempt::Granted(_))),
        "every permit is free and nobody waits, yet a single attempt got {a:?} \
         (keys: {left:?}: the cancelled waiter's place came back)"
    );
}
