//! coord-core's store-independent logic, driven through the in-memory
//! backend with scripted faults (`support::faulty`) and paused time: which
//! errors are retried and which returned, how retries back off and end at
//! the deadline, which calls the guards and cleanup send.

use crate::support;
use std::time::Duration;

use coord_core::{Algorithm, Error, FencingToken, LeaderInfo, Quota};
use futures::StreamExt;
use support::faulty::{Fault, Faulty};
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

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

// ---- observing an election ----

fn info(candidate: &str, term: u64) -> Option<LeaderInfo> {
    Some(LeaderInfo {
        candidate: candidate.into(),
        term: FencingToken(term),
    })
}

/// `observe` polls when subscribing is unavailable, and a broken
/// subscription is yielded as an error.
#[tokio::test(start_paused = true)]
async fn observe_polls_without_a_subscription_and_yields_a_broken_one() {
    let f = Faulty::new();
    f.always("election.subscribe", Fault::Unavailable);
    let el = f.coord(100 * MS).elections().unwrap();
    let mut seen = Box::pin(el.observe("obs-poll").unwrap());
    assert_eq!(seen.next().await.unwrap().unwrap(), None);
    let lead = el.campaign("obs-poll", "a", 10 * S, 10 * S).await.unwrap();
    let got = tokio::time::timeout(S, seen.next())
        .await
        .expect("polling saw the leader");
    assert_eq!(got.unwrap().unwrap().unwrap().candidate, "a");
    lead.resign().await.unwrap();

    f.always("election.subscribe", Fault::Broken);
    let mut broken = Box::pin(el.observe("obs-broken").unwrap());
    let e = broken.next().await.unwrap().unwrap_err();
    assert!(matches!(e, Error::Store { .. }), "got {e:?}");
}

/// A retryable leader read is retried quietly (10 ms later); a broken one
/// is yielded as an error and the stream goes on.
#[tokio::test(start_paused = true)]
async fn observe_retries_unavailable_reads_and_yields_broken_ones() {
    let f = Faulty::new();
    let el = f.coord(10 * S).elections().unwrap();
    let lead = el.campaign("obs-read", "a", 60 * S, 10 * S).await.unwrap();
    let mut seen = Box::pin(el.observe("obs-read").unwrap());
    f.next("election.leader", Fault::Unavailable, 2);
    let started = Instant::now();
    let got = seen
        .next()
        .await
        .unwrap()
        .expect("an unavailable read was yielded");
    assert_eq!(got.unwrap().term, lead.term());
    assert_eq!(started.elapsed(), 30 * MS, "retried after 10 then 20 ms");
    f.next("election.leader", Fault::Broken, 1);
    // Nothing changes: the next item is the broken read, at the next poll.
    let e = seen.next().await.unwrap().unwrap_err();
    assert!(matches!(e, Error::Store { .. }), "got {e:?}");
    lead.resign().await.unwrap();
    assert_eq!(seen.next().await.unwrap().unwrap(), None);
}

/// `observe` yields changes only: an unchanged leader is not yielded again
/// at every poll.
#[tokio::test(start_paused = true)]
async fn observe_yields_nothing_while_nothing_changes() {
    let f = Faulty::new();
    let el = f.coord(100 * MS).elections().unwrap();
    let lead = el.campaign("obs-same", "a", 60 * S, 10 * S).await.unwrap();
    let mut seen = Box::pin(el.observe("obs-same").unwrap());
    assert!(seen.next().await.unwrap().unwrap().is_some());
    assert!(
        tokio::time::timeout(5 * S, seen.next()).await.is_err(),
        "an unchanged leader was yielded again"
    );
    assert!(f.calls("election.leader") >= 40, "it did not poll");
    lead.resign().await.unwrap();
}

/// Stale reads (a lagging replica) never make `observe` go back: a lower
/// term is skipped, and so is a term already left (the office fell vacant
/// after it, so it ended for good).
#[tokio::test(start_paused = true)]
async fn observe_never_goes_back_on_stale_reads() {
    let f = Faulty::new();
    let el = f.coord(100 * MS).elections().unwrap();
    let mut seen = Box::pin(el.observe("obs-stale").unwrap());
    f.answer_leader([info("a", 5), info("b", 3), None, info("a", 5), info("c", 7)]);
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(seen.next().await.unwrap().unwrap());
    }
    assert_eq!(got, vec![info("a", 5), None, info("c", 7)]);
}

// ---- waiting on a rate limiter ----

fn one_per_second() -> Quota {
    Quota::new(1, S, Algorithm::FixedWindow)
}

/// `RateLimiter::wait` sleeps exactly the denial's `retry_after`, checks
/// again, and is admitted; a wait that ends exactly at that time still
/// gets its check.
#[tokio::test(start_paused = true)]
async fn a_limiter_wait_sleeps_retry_after_and_is_admitted_at_the_deadline() {
    let f = Faulty::new();
    let lim = f.coord(S).limiter().unwrap();
    assert!(lim.check("w", one_per_second()).await.unwrap().allowed);
    let denied = lim.check("w", one_per_second()).await.unwrap();
    assert!(!denied.allowed);
    let retry = denied.retry_after;
    assert!(retry > Duration::ZERO && retry <= S, "{retry:?}");
    let started = Instant::now();
    let d = lim
        .wait("w", one_per_second(), 1, retry)
        .await
        .expect("admitted at the deadline");
    assert!(d.allowed);
    assert_eq!(started.elapsed(), retry);
    assert_eq!(
        f.calls("limiter.check"),
        4,
        "one denied check, one admitted"
    );
}

/// A wait whose next check would come after its `max_wait` gives up at
/// once with `Timeout`, and one with room to spare is admitted.
#[tokio::test(start_paused = true)]
async fn a_limiter_wait_gives_up_when_the_retry_is_past_its_deadline() {
    let f = Faulty::new();
    let lim = f.coord(S).limiter().unwrap();
    assert!(lim.check("w2", one_per_second()).await.unwrap().allowed);
    let started = Instant::now();
    let e = lim
        .wait("w2", one_per_second(), 1, 500 * MS)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "got {e:?}");
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "it slept before giving up"
    );
    assert_eq!(f.calls("limiter.check"), 2);
    let d = lim
        .wait("w2", one_per_second(), 1, 5 * S)
        .await
        .expect("admitted within 5 s");
    assert!(d.allowed);
    assert_eq!(started.elapsed(), S);
}

// ---- acquiring: what a failed or abandoned attempt leaves ----

/// Whether `name` can be taken right now by another owner.
async fn is_free(f: &Faulty, name: &str) -> bool {
    let o = coord_core::OwnerToken::random();
    match coord_core::Lock::try_acquire(&*f.inner, name, &o, S)
        .await
        .unwrap()
    {
        coord_core::Attempt::Granted(_) => {
            coord_core::Lock::release(&*f.inner, name, &o)
                .await
                .unwrap();
            true
        }
        coord_core::Attempt::Held { .. } => false,
    }
}

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
