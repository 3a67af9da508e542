//! Barrier waits under faults: a subscription or completion check that is
//! unavailable is polled or retried soon and a broken one returned, a
//! failing arrival backs off exponentially and stops before the deadline,
//! and no withdraw is sent for an arrival that completed or was refused.

use crate::support;

use coord_core::Error;
use support::faulty::{Fault, Faulty};
use tokio::time::Instant;

use super::{MS, S};

// ---- barriers ----

/// A barrier wait whose subscription fails with a retryable error still
/// passes, by polling.
#[tokio::test(start_paused = true)]
async fn a_barrier_wait_polls_when_subscribing_is_unavailable() {
    let f = Faulty::new();
    f.always("barrier.subscribe", Fault::Unavailable);
    let b = f.coord(100 * MS).barriers().unwrap();
    let b2 = b.clone();
    let first = tokio::spawn(async move { b2.wait("poll", 2, "p1", 10 * S).await });
    tokio::time::sleep(50 * MS).await;
    let g = b.wait("poll", 2, "p2", 10 * S).await.unwrap();
    assert_eq!(first.await.unwrap().unwrap(), g);
    assert!(f.calls("barrier.subscribe") >= 1);
}

/// A non-retryable subscription error ends the wait with that error.
#[tokio::test(start_paused = true)]
async fn a_barrier_wait_returns_a_broken_subscription() {
    let f = Faulty::new();
    f.always("barrier.subscribe", Fault::Broken);
    let b = f.coord(100 * MS).barriers().unwrap();
    let err = b.wait("broken-sub", 2, "p1", 10 * S).await.unwrap_err();
    assert!(matches!(err, Error::Store { .. }), "got {err:?}");
}

/// A retryable completion check is retried within 20 ms, not after a
/// whole polling interval, and the wait passes.
#[tokio::test(start_paused = true)]
async fn a_barrier_completion_check_is_retried_soon() {
    let f = Faulty::new();
    // No notifications reach the waiter: only its checks can see completion.
    f.always("barrier.subscribe", Fault::Unavailable);
    let b = f.coord(10 * S).barriers().unwrap();
    let b2 = b.clone();
    let first = tokio::spawn(async move { b2.wait("recheck", 2, "p1", 60 * S).await });
    tokio::time::sleep(10 * MS).await;
    // The other participant completes the generation, and the waiter's next
    // check fails once.
    f.next("barrier.is_complete", Fault::Unavailable, 1);
    let g = coord_core::Barrier::arrive(
        &*f.inner,
        "recheck",
        2,
        "p2",
        &coord_core::OwnerToken::random(),
    )
    .await
    .unwrap();
    assert!(g.complete);
    let started = Instant::now();
    // Wake the waiter's loop once by polling: with a 10 s interval it first
    // checks after 5-10 s; the failed check is then retried within 20 ms.
    let got = tokio::time::timeout(30 * S, first)
        .await
        .expect("the wait passes")
        .unwrap()
        .unwrap();
    assert_eq!(got, g.generation);
    let checks = f.calls("barrier.is_complete");
    assert!(checks >= 2, "{checks} checks");
    // The passing check came at most 20 ms after the failed one, which came
    // within one polling interval.
    assert!(
        started.elapsed() <= 10 * S + 20 * MS,
        "passed after {:?}",
        started.elapsed()
    );
}

/// A non-retryable completion check ends the wait with that error.
#[tokio::test(start_paused = true)]
async fn a_barrier_wait_returns_a_broken_completion_check() {
    let f = Faulty::new();
    f.always("barrier.is_complete", Fault::Broken);
    let b = f.coord(100 * MS).barriers().unwrap();
    let err = b.wait("broken-check", 2, "p1", 10 * S).await.unwrap_err();
    assert!(matches!(err, Error::Store { .. }), "got {err:?}");
}

/// An arrival that keeps failing is retried with doubling backoff
/// (20, 40, 80 ms, ...) and given up as soon as the next retry would reach
/// the deadline: with a 140 ms wait, tries at 0, 20 and 60 ms, and the
/// error comes back at 60 ms (a retry at 140 ms would be at the deadline).
#[tokio::test(start_paused = true)]
async fn a_failing_arrival_backs_off_and_stops_before_the_deadline() {
    let f = Faulty::new();
    f.always("barrier.arrive", Fault::Unavailable);
    let b = f.coord(10 * S).barriers().unwrap();
    let started = Instant::now();
    let err = b.wait("backoff", 2, "p1", 140 * MS).await.unwrap_err();
    assert!(err.is_retryable(), "got {err:?}");
    assert_eq!(started.elapsed(), 60 * MS);
    assert_eq!(f.calls("barrier.arrive"), 3);
}

/// Over a longer wait the backoff keeps doubling (capped by the polling
/// interval and 1 s): a 5 s wait makes 9 tries, not hundreds.
#[tokio::test(start_paused = true)]
async fn a_failing_arrival_backs_off_exponentially() {
    let f = Faulty::new();
    f.always("barrier.arrive", Fault::Unavailable);
    let b = f.coord(10 * S).barriers().unwrap();
    let started = Instant::now();
    let err = b.wait("backoff-long", 2, "p1", 5 * S).await.unwrap_err();
    assert!(err.is_retryable(), "got {err:?}");
    // 0, 20, 60, 140, 300, 620, 1260, 2260, 3260, 4260 ms; 5260 > 5000.
    assert_eq!(f.calls("barrier.arrive"), 10);
    assert_eq!(started.elapsed(), 4260 * MS);
}

/// A wait dropped while its arrival is in flight, where that arrival
/// completed the generation, sends no withdraw (the participant passed).
#[tokio::test(start_paused = true)]
async fn a_dropped_wait_whose_arrival_completed_sends_no_withdraw() {
    let f = Faulty::new();
    let b = f.coord(100 * MS).barriers().unwrap();
    let b2 = b.clone();
    let first = tokio::spawn(async move { b2.wait("drop-complete", 2, "p1", 10 * S).await });
    tokio::time::sleep(10 * MS).await;
    // p2's arrival completes the generation, but p2's wait is dropped
    // before the reply is seen.
    f.next("barrier.arrive", Fault::LoseReply, 1);
    let _ = tokio::time::timeout(5 * MS, b.wait("drop-complete", 2, "p2", 10 * S)).await;
    first.await.unwrap().unwrap();
    tokio::time::sleep(S).await;
    assert_eq!(f.calls("barrier.withdraw"), 0);
}

/// An arrival the store refused (a non-retryable error, so nothing was
/// recorded) leaves nothing to settle: no withdraw is sent.
#[tokio::test(start_paused = true)]
async fn a_refused_arrival_sends_no_withdraw() {
    let f = Faulty::new();
    f.next("barrier.arrive", Fault::Broken, 1);
    let b = f.coord(100 * MS).barriers().unwrap();
    let err = b.wait("refused", 2, "p1", 10 * S).await.unwrap_err();
    assert!(!err.is_retryable(), "got {err:?}");
    tokio::time::sleep(S).await;
    assert_eq!(f.calls("barrier.withdraw"), 0);
}
