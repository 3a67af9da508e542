//! Guards and their watchdog: a guard knows its name and watchdog,
//! `keep_alive` starts one watchdog, a failed renewal is retried a
//! twentieth of the TTL later and a broken one loses the guard at once,
//! `Ownership` follows the guard, and a shortened extend counts from
//! before its request was sent.

use crate::support;
use std::time::Duration;

use support::faulty::{Fault, Faulty};
use tokio::time::Instant;

use super::{MS, S, is_free};

// ---- guards ----

/// A guard reports its own name, and `keep_alive` shows in `has_watchdog`.
#[tokio::test(start_paused = true)]
async fn a_guard_knows_its_name_and_its_watchdog() {
    let f = Faulty::new();
    let locks = f.coord(S).locks().unwrap();
    let mut g = locks
        .acquire("order:7", 3 * S, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(g.name(), "order:7");
    assert_eq!(g.ownership().name(), "order:7");
    assert!(!g.has_watchdog());
    g.keep_alive();
    assert!(g.has_watchdog());
    g.release().await.unwrap();
}

/// Calling `keep_alive` twice starts one watchdog: renewals every third of
/// the TTL, not twice as many.
#[tokio::test(start_paused = true)]
async fn keep_alive_twice_starts_one_watchdog() {
    let f = Faulty::new();
    let locks = f.coord(S).locks().unwrap();
    let mut g = locks
        .acquire("one-dog", 3 * S, Duration::ZERO)
        .await
        .unwrap();
    g.keep_alive();
    g.keep_alive();
    tokio::time::sleep(10 * S + 500 * MS).await;
    let renewals = f.calls("lock.extend");
    assert!(
        (9..=11).contains(&renewals),
        "{renewals} renewals in 10.5 s with a 3 s TTL"
    );
    assert!(g.is_valid());
    g.release().await.unwrap();
}

/// A renewal that fails with a retryable error is retried a twentieth of
/// the TTL later, and the guard stays valid.
#[tokio::test(start_paused = true)]
async fn a_failed_renewal_is_retried_a_twentieth_of_the_ttl_later() {
    let f = Faulty::new();
    let locks = f.coord(S).locks().unwrap();
    let g = locks
        .acquire("retry-renew", 3 * S, Duration::ZERO)
        .await
        .unwrap()
        .with_watchdog();
    f.next("lock.extend", Fault::Unavailable, 1);
    tokio::time::sleep(5 * S).await;
    let t = f.times("lock.extend");
    assert!(t.len() >= 3, "{} renewals", t.len());
    assert_eq!(
        t[1] - t[0],
        150 * MS,
        "the failed renewal was retried after {:?}",
        t[1] - t[0]
    );
    assert!(g.is_valid(), "one failed renewal lost the guard");
    assert!(tokio::time::timeout(MS, g.lost()).await.is_err());
    g.release().await.unwrap();
}

/// A renewal that fails with a non-retryable error loses the guard at
/// once, long before its deadline.
#[tokio::test(start_paused = true)]
async fn a_broken_renewal_loses_the_guard_at_once() {
    let f = Faulty::new();
    let locks = f.coord(S).locks().unwrap();
    let g = locks
        .acquire("broken-renew", 30 * S, Duration::ZERO)
        .await
        .unwrap()
        .with_watchdog();
    f.next("lock.extend", Fault::Broken, 1);
    let started = Instant::now();
    tokio::time::timeout(20 * S, g.lost())
        .await
        .expect("the guard was not lost");
    // The first renewal comes a third of the TTL in, and loses it.
    assert!(
        started.elapsed() <= 10 * S + 10 * MS,
        "lost after {:?}",
        started.elapsed()
    );
    assert!(!g.is_valid());
    assert_eq!(f.calls("lock.extend"), 1, "a broken renewal was retried");
}

/// `Ownership` (what `with_lock` hands its closure) tells the truth about
/// the claim: its remaining validity, and is_valid false once the local
/// deadline passed without renewal.
#[tokio::test(start_paused = true)]
async fn ownership_follows_the_guard() {
    let f = Faulty::new();
    let locks = f.coord(S).locks().unwrap();
    let g = locks.acquire("own", 3 * S, Duration::ZERO).await.unwrap();
    let own = g.ownership();
    assert!(own.is_valid());
    assert_eq!(own.remaining(), g.remaining());
    assert!(own.remaining() > 2 * S);
    tokio::time::sleep(2 * S).await;
    assert!(own.remaining() < S && !own.remaining().is_zero());
    tokio::time::sleep(S).await;
    assert!(own.remaining().is_zero());
    assert!(!own.is_valid(), "valid past its deadline");
    assert!(!g.is_valid());
}

/// A shortened extend whose reply is slow (applied on the store at once,
/// answered 300 ms later): the new deadline counts from before the request
/// was sent, not from the reply; the guard is valid up to it and invalid
/// from it on; the lost signal, waiting on the old deadline, fires at it,
/// before the store frees the lock. Time is paused, so timers are exact:
/// on real servers a loaded machine only wakes the signal later.
#[tokio::test(start_paused = true)]
async fn a_shortened_extend_counts_from_before_its_request_was_sent() {
    let f = Faulty::new();
    let locks = f.coord(S).locks().unwrap();
    let g = locks
        .acquire("slow-extend", 30 * S, Duration::ZERO)
        .await
        .unwrap();
    let lost = tokio::spawn(g.lost());
    let token = g.lost_token();
    tokio::time::sleep(200 * MS).await;
    f.next("lock.extend", Fault::SlowReply(300 * MS), 1);
    let sent = Instant::now();
    g.extend(S).await.unwrap();
    assert_eq!(sent.elapsed(), 300 * MS, "the reply was not slow");
    let deadline = sent + S - coord_core::drift(S);
    assert_eq!(
        g.valid_until(),
        deadline,
        "the deadline is {:?} after the request was sent",
        g.valid_until() - sent
    );
    tokio::time::sleep_until(deadline - MS).await;
    assert!(g.is_valid(), "invalid before the deadline");
    assert!(!token.is_cancelled(), "lost before the deadline");
    lost.await.unwrap();
    assert_eq!(Instant::now(), deadline, "lost fired off the deadline");
    assert!(token.is_cancelled());
    assert!(!g.is_valid(), "lost fired while the guard says valid");
    assert!(!is_free(&f, "slow-extend").await, "freed before lost fired");
    tokio::time::sleep_until(sent + S).await;
    assert!(is_free(&f, "slow-extend").await, "not freed at its TTL");
}
