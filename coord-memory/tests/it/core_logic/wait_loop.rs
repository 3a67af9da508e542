//! The wait loop: a failed first attempt is retried and a broken one
//! returned, a waiter polls when subscribing fails, a wait for ever
//! outlasts a lock held for years, and attempts failing while waiting
//! back off, broken ones ending the wait.

use crate::support;
use std::time::Duration;

use coord_core::Error;
use support::faulty::{Fault, Faulty};
use tokio::time::Instant;

use super::{MS, S};

// ---- the wait loop ----

/// A first attempt that fails with a retryable error is retried within the
/// wait (at once, after subscribing); a non-retryable one is returned at
/// once.
#[tokio::test(start_paused = true)]
async fn a_failed_first_attempt_is_retried_and_a_broken_one_returned() {
    let f = Faulty::new();
    let locks = f.coord(S).locks().unwrap();
    f.next("lock.try_acquire", Fault::Unavailable, 1);
    let started = Instant::now();
    let g = locks
        .acquire("first-fails", 30 * S, S)
        .await
        .expect("the retry is granted");
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(f.calls("lock.try_acquire"), 2);
    g.release().await.unwrap();

    f.next("lock.try_acquire", Fault::Broken, 1);
    let e = locks.acquire("first-broken", 30 * S, S).await.unwrap_err();
    assert!(matches!(e, Error::Store { .. }), "got {e:?}");
    assert_eq!(
        f.calls("lock.try_acquire"),
        3,
        "a broken attempt was retried"
    );
}

/// A waiter whose subscription is unavailable polls and still gets the
/// lock after its release; a broken subscription is returned.
#[tokio::test(start_paused = true)]
async fn a_waiter_polls_when_subscribing_fails_and_returns_a_broken_subscription() {
    let f = Faulty::new();
    let locks = f.coord(100 * MS).locks().unwrap();
    let held = locks.acquire("sub", 30 * S, Duration::ZERO).await.unwrap();
    f.always("lock.subscribe", Fault::Unavailable);
    let l2 = locks.clone();
    let waiting = tokio::spawn(async move { l2.acquire("sub", 30 * S, 10 * S).await });
    tokio::time::sleep(S).await;
    held.release().await.unwrap();
    let g = tokio::time::timeout(S, waiting)
        .await
        .expect("polling got it")
        .unwrap()
        .unwrap();
    g.release().await.unwrap();

    let held = locks.acquire("sub2", 30 * S, Duration::ZERO).await.unwrap();
    f.always("lock.subscribe", Fault::Broken);
    let e = locks.acquire("sub2", 30 * S, 10 * S).await.unwrap_err();
    assert!(matches!(e, Error::Store { .. }), "got {e:?}");
    held.release().await.unwrap();
}

/// `Duration::MAX` waits for ever: a lock held for 665 days (a one-year
/// TTL, extended once) is still awaited and then granted.
#[tokio::test(start_paused = true)]
async fn a_wait_for_ever_outlasts_a_lock_held_for_years() {
    let f = Faulty::new();
    let locks = f.coord(S).locks().unwrap();
    let year = Duration::from_secs(365 * 86_400);
    let day = Duration::from_secs(86_400);
    let held = locks.acquire("years", year, Duration::ZERO).await.unwrap();
    // The waiter polls only yearly: it wakes at the holder's expiry hint.
    let l2 = f.coord(year).locks().unwrap();
    let started = Instant::now();
    let waiting = tokio::spawn(async move { l2.acquire("years", S, Duration::MAX).await });
    tokio::time::sleep(300 * day).await;
    held.extend(year).await.unwrap();
    let g = waiting.await.unwrap().expect("a wait for ever ended");
    assert!(
        started.elapsed() >= 665 * day,
        "granted after {:?}",
        started.elapsed()
    );
    g.release().await.unwrap();
}

/// Attempts that fail while waiting are retried with doubling backoff
/// (5, 10, 20 ms) and the waiter still gets the lock; a broken attempt
/// ends the wait with its error.
#[tokio::test(start_paused = true)]
async fn failed_attempts_while_waiting_back_off_and_broken_ones_end_the_wait() {
    let f = Faulty::new();
    let locks = f.coord(10 * S).locks().unwrap();
    let held = locks
        .acquire("backoff", 2 * S, Duration::ZERO)
        .await
        .unwrap();
    let l2 = locks.clone();
    let waiting = tokio::spawn(async move { l2.acquire("backoff", 30 * S, 30 * S).await });
    tokio::time::sleep(500 * MS).await;
    let before = f.calls("lock.try_acquire");
    // The holder's expiry (2 s) wakes the waiter; its attempts then fail 3
    // times before one gets through.
    f.next("lock.try_acquire", Fault::Unavailable, 3);
    std::mem::forget(held); // crash: no release, the TTL frees it
    let g = waiting.await.unwrap().expect("the waiter got the lock");
    let t = f.times("lock.try_acquire");
    let retries: Vec<Duration> = t[before..].windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(retries, vec![5 * MS, 10 * MS, 20 * MS], "retry gaps");
    g.release().await.unwrap();

    let held = locks
        .acquire("broken-wait", 30 * S, Duration::ZERO)
        .await
        .unwrap();
    let l2 = locks.clone();
    let waiting = tokio::spawn(async move { l2.acquire("broken-wait", 30 * S, 30 * S).await });
    tokio::time::sleep(100 * MS).await;
    f.next("lock.try_acquire", Fault::Broken, 1);
    held.release().await.unwrap();
    let e = waiting.await.unwrap().unwrap_err();
    assert!(matches!(e, Error::Store { .. }), "got {e:?}");
}
