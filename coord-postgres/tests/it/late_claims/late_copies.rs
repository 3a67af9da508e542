//! Late copies through a slow proxy: a copy of a timed-out acquire, lease
//! grant or campaign takes nothing, and a late copy of a holder's first
//! attempt or of an extend never shortens or undoes a later extend.

use crate::support;
use std::time::{Duration, Instant};

use conformance::facade_claim::Held;
use conformance::testkit::postgres::cluster;
use conformance::testkit::proxy::FaultProxy;
use coord_core::Coord;
use support::{LATENCY, LONG, direct, slow, unique, until_late_attempts_landed};

use super::{Case, SERIAL, kind, row};

/// Take `name` as `case` says with a long TTL, waiting up to `wait`.
async fn take(
    c: &Coord,
    case: Case,
    name: &str,
    wait: Duration,
) -> coord_core::Result<Option<Held>> {
    case.take(c, name, LONG, wait).await
}

/// The first attempt of a client behind a slow proxy is delayed past its
/// call timeout; the client gives up (its cleanup releases the owner, which
/// marks it); the holder releases; the late copy lands on the free claim.
/// The next attempt of another client must be granted.
async fn a_late_copy_takes_nothing(case: Case) {
    let _serial = SERIAL.lock().await;
    let schema = unique("late_claim");
    let proxy = FaultProxy::start(cluster().port());
    let direct_backend = direct(&schema).await;
    let here = direct_backend.coord();
    let far = slow(&schema, &proxy).await;
    let name = unique("late-claim");
    // Prepare the slow connection's statements: the late attempt is then
    // one message, sent at once.
    // (Its 200 ms call timeout can pass on a loaded machine before the
    // proxy's latency is even set: tried again, a few times.)
    let mut tries = 0;
    let warm = loop {
        tries += 1;
        match take(&far.coord(), case, &unique("warm"), Duration::ZERO).await {
            Ok(g) => break g.expect("the slow client takes a free name"),
            Err(e) if e.is_retryable() && tries < 10 => continue,
            Err(e) => panic!("warming the slow client up ({tries} tries): {e}"),
        }
    };
    warm.release().await;
    let held = take(&here, case, &name, Duration::ZERO)
        .await
        .unwrap()
        .expect("the holder takes the free claim");

    proxy.latency(LATENCY);
    let started = Instant::now();
    let waiter = tokio::spawn({
        let (c, name) = (far.coord(), name.clone());
        async move {
            take(&c, case, &name, Duration::from_millis(600))
                .await
                .is_ok_and(|h| h.is_some())
        }
    });
    // Healed before the first attempt times out, so the cleanup after it
    // (a lease's revoke, at once) is not delayed too.
    tokio::time::sleep(Duration::from_millis(50)).await;
    proxy.latency(Duration::ZERO);
    assert!(
        !waiter.await.unwrap(),
        "{case:?}: the slow client got the held claim"
    );
    // Its cleanup (in the background) has marked the owner by now.
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.release().await;
    until_late_attempts_landed(started).await;
    let late = row(&direct_backend, kind(case), &name).await;
    let next = take(&here, case, &name, Duration::ZERO).await.unwrap();
    assert!(
        next.is_some(),
        "{case:?}: the claim is free and nobody waits, yet it is refused: the \
         timed-out attempt's late copy took it (row after it landed: {late:?})"
    );
    assert_eq!(
        late,
        Some((false, 1)),
        "{case:?}: (owner set, marks) once the late copy landed"
    );
    next.unwrap().release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_lock_attempt_after_a_timed_out_acquire_takes_no_lock() {
    a_late_copy_takes_nothing(Case::Lock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_timed_out_lease_grant_takes_no_lease() {
    a_late_copy_takes_nothing(Case::Lease).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_timed_out_campaign_elects_nobody() {
    a_late_copy_takes_nothing(Case::Election).await;
}

/// See `conformance::late_copy::late_copy_after_extend`.
async fn late_copy_after_extend(kind: conformance::claim_kind::ClaimKind) {
    let _serial = SERIAL.lock().await;
    let schema = unique("late_extend");
    let proxy = FaultProxy::start(cluster().port());
    let here = direct(&schema).await;
    let far = slow(&schema, &proxy).await;
    conformance::late_copy::late_copy_after_extend(
        kind,
        &*far,
        &*here,
        &proxy,
        &unique("late-extend"),
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

/// See `conformance::late_copy::late_copy_of_an_extend_after_a_later_one`.
async fn late_extend_after_a_later_one(kind: conformance::claim_kind::ClaimKind) {
    let _serial = SERIAL.lock().await;
    let schema = unique("late_extend2");
    let proxy = FaultProxy::start(cluster().port());
    let here = direct(&schema).await;
    let far = slow(&schema, &proxy).await;
    conformance::late_copy::late_copy_of_an_extend_after_a_later_one(
        kind,
        &*far,
        &*here,
        &proxy,
        &unique("late-extend2"),
        false,
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
