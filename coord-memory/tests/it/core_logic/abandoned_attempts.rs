//! What a failed or abandoned acquire leaves: an attempt with a lost reply
//! is cleaned up, a timed-out acquire sends no release, an acquire dropped
//! mid-attempt releases its grant, a failed `acquire_all` released what it
//! took, and a `MultiGuard` reports, keeps alive and releases its locks.

use crate::support;
use std::time::Duration;

use coord_core::Error;
use support::faulty::{Fault, Faulty};

use super::{MS, S, is_free};

// ---- acquiring: what a failed or abandoned attempt leaves ----

/// An attempt whose reply was lost (granted on the store, unknown to the
/// caller) is released in the background: the lock does not stay taken
/// for its TTL.
#[tokio::test(start_paused = true)]
async fn an_attempt_with_a_lost_reply_is_cleaned_up() {
    let f = Faulty::new();
    let locks = f.coord(S).locks().unwrap();
    f.next("lock.try_acquire", Fault::LoseReply, 1);
    let e = locks
        .acquire("lost-reply", 30 * S, Duration::ZERO)
        .await
        .unwrap_err();
    assert!(e.is_retryable(), "got {e:?}");
    tokio::time::sleep(MS).await;
    assert!(
        is_free(&f, "lost-reply").await,
        "the lost grant stays held until its TTL"
    );
}

/// A plain timed-out acquire (the lock stayed busy, every reply seen)
/// sends no release: there is nothing of its own to clean up.
#[tokio::test(start_paused = true)]
async fn a_timed_out_acquire_sends_no_release() {
    let f = Faulty::new();
    let locks = f.coord(100 * MS).locks().unwrap();
    let held = locks.acquire("busy", 30 * S, Duration::ZERO).await.unwrap();
    let e = locks.acquire("busy", 30 * S, 500 * MS).await.unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "got {e:?}");
    tokio::time::sleep(S).await;
    assert_eq!(f.calls("lock.release"), 0);
    held.release().await.unwrap();
}

/// An acquire dropped while its granting attempt is on the wire releases
/// that grant in the background.
#[tokio::test(start_paused = true)]
async fn an_acquire_dropped_mid_attempt_releases_its_grant() {
    let f = Faulty::new();
    let locks = f.coord(S).locks().unwrap();
    f.next("lock.try_acquire", Fault::SlowReply(S), 1);
    let r = tokio::time::timeout(100 * MS, locks.acquire("dropped", 30 * S, 10 * S)).await;
    assert!(r.is_err(), "the acquire finished: {r:?}");
    assert!(
        !is_free(&f, "dropped").await,
        "the attempt was not granted on the store"
    );
    tokio::time::sleep(10 * MS).await;
    assert!(
        is_free(&f, "dropped").await,
        "the abandoned grant stays held until its TTL"
    );
}

/// An `acquire_all` that fails on a later lock has released the earlier
/// ones when it returns (not later, in the background).
#[tokio::test(start_paused = true)]
async fn a_failed_acquire_all_has_released_what_it_took() {
    let f = Faulty::new();
    let locks = f.coord(100 * MS).locks().unwrap();
    let held = locks
        .acquire("all-b", 30 * S, Duration::ZERO)
        .await
        .unwrap();
    let e = locks
        .acquire_all(
            ["all-a", "all-b"],
            coord_core::LockOptions::new(30 * S).wait(300 * MS),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "got {e:?}");
    assert!(
        is_free(&f, "all-a").await,
        "`all-a` is still held after acquire_all failed"
    );
    held.release().await.unwrap();
}

/// `acquire_all` deduplicates and sorts the names; `MultiGuard` reports
/// them and each lock's token.
#[tokio::test(start_paused = true)]
async fn a_multi_guard_reports_sorted_names_and_tokens() {
    let f = Faulty::new();
    let locks = f.coord(S).locks().unwrap();
    let both = locks
        .acquire_all(["m-b", "m-a", "m-b"], coord_core::LockOptions::new(30 * S))
        .await
        .unwrap();
    assert_eq!(both.names(), vec!["m-a", "m-b"]);
    assert_eq!(both.guards().len(), 2);
    let (a, b) = (
        both.fencing_token("m-a").unwrap(),
        both.fencing_token("m-b").unwrap(),
    );
    assert!(a < b, "taken in sorted order");
    assert_eq!(both.fencing_token("m-c"), None);
    both.release().await.unwrap();
}

/// `MultiGuard::keep_alive` starts every lock's watchdog, and its release
/// reports a lock that was lost while still releasing the others.
#[tokio::test(start_paused = true)]
async fn a_multi_guard_keeps_alive_and_reports_a_lost_lock_on_release() {
    let f = Faulty::new();
    let locks = f.coord(S).locks().unwrap();
    let mut both = locks
        .acquire_all(["k-a", "k-b"], coord_core::LockOptions::new(3 * S))
        .await
        .unwrap();
    assert!(both.guards().iter().all(|g| !g.has_watchdog()));
    both.keep_alive();
    assert!(both.guards().iter().all(|g| g.has_watchdog()));
    tokio::time::sleep(10 * S).await;
    assert!(
        both.guards().iter().all(|g| g.is_valid()),
        "the watchdogs did not renew"
    );
    // `k-b` is taken away; the watchdog notices at its next renewal.
    assert!(locks.force_release("k-b").await.unwrap());
    let e = both.release().await.unwrap_err();
    assert!(e.is_ownership_lost(), "got {e:?}");
    assert!(is_free(&f, "k-a").await, "`k-a` was not released");
}
