//! Semaphore cases of waiters: woken by notification, every waiter that
//! fits, the FIFO head never overtaken.

use super::{LONG, gated};
use crate::testkit::wait::until;
use crate::{Factory, WOKEN, unique, wake_poll};
use std::time::Duration;
use tokio::time::{Instant, sleep};

/// A waiting acquire gets a permit within [`WOKEN`] of its release's reply
/// although its polling fallback is [`wake_poll`]: the wake-up came from
/// the store.
pub async fn semaphore_waiter_is_woken_by_notification(f: &Factory) {
    let a = f.client().await;
    let b = f.client().await;
    let poll = wake_poll(&b);
    let b = b.with_poll_interval(poll);
    let Some([sa, sb]) = gated([&a, &b]) else {
        return;
    };
    let name = unique("sem-wake");
    let p1 = sa.acquire(&name, 2, LONG, Duration::ZERO).await.unwrap();
    let p2 = sa.acquire(&name, 2, LONG, Duration::ZERO).await.unwrap();
    let n2 = name.clone();
    let waiter = tokio::spawn(async move {
        let p = sb.acquire(&n2, 2, LONG, Duration::from_secs(20)).await;
        (Instant::now(), p)
    });
    // Let the waiter attempt, subscribe and settle into its long sleep.
    sleep(Duration::from_millis(1500)).await;
    p1.release().await.unwrap();
    // From the release's reply: its round trip is not the waiter's delay.
    let released_at = Instant::now();
    let (got_at, p) = waiter.await.unwrap();
    let p = p.expect("the waiter must get the released permit");
    let lag = got_at.saturating_duration_since(released_at);
    assert!(
        lag <= WOKEN,
        "waiter took {lag:?} after release (poll {poll:?}): not woken by a notification"
    );
    p.release().await.unwrap();
    p2.release().await.unwrap();
}

/// A release wakes every waiter that now fits, not one: with both permits
/// of 2 held by one grant and two waiters for 1 each (polling at
/// [`wake_poll`]), both are granted within [`WOKEN`] of the release's
/// reply. A store that wakes one waiter per release leaves the other
/// to its next poll or to the holder's TTL.
pub async fn semaphore_release_wakes_every_waiter_that_fits(f: &Factory) {
    let a = f.client().await;
    let (b, c) = (f.client().await, f.client().await);
    let poll = wake_poll(&b);
    let (b, c) = (b.with_poll_interval(poll), c.with_poll_interval(poll));
    let Some([sa, sb, sc]) = gated([&a, &b, &c]) else {
        return;
    };
    let name = unique("sem-wake-all");
    let both = sa
        .acquire_many(&name, 2, 2, LONG, Duration::ZERO)
        .await
        .unwrap();
    let mut waiters = Vec::new();
    for s in [sb, sc] {
        let name = name.clone();
        waiters.push(tokio::spawn(async move {
            let p = s.acquire(&name, 2, LONG, Duration::from_secs(20)).await;
            (Instant::now(), p)
        }));
    }
    // Let both waiters attempt, queue, subscribe and settle into their
    // long sleeps.
    sleep(Duration::from_secs(1)).await;
    both.release().await.unwrap();
    // From the release's reply: its round trip is not the waiters' delay.
    let released_at = Instant::now();
    let deadline = released_at + WOKEN;
    while Instant::now() < deadline && !waiters.iter().all(|w| w.is_finished()) {
        sleep(Duration::from_millis(5)).await;
    }
    let done = waiters.iter().filter(|w| w.is_finished()).count();
    assert!(
        done == waiters.len(),
        "{done} of the 2 waiters for 1 permit were granted within {WOKEN:?} of the release \
         of both permits (poll {poll:?}): the release woke only one waiter"
    );
    let mut granted = Vec::new();
    for (i, w) in waiters.into_iter().enumerate() {
        let (at, p) = w.await.unwrap();
        let p = p.unwrap_or_else(|e| panic!("waiter {i}: {e:?}"));
        let lag = at.saturating_duration_since(released_at);
        assert!(
            lag <= WOKEN,
            "waiter {i} was granted {lag:?} after the release"
        );
        granted.push(p);
    }
    for p in granted {
        p.release().await.unwrap();
    }
}

/// On a FIFO store a waiting request for 2 at the head of the queue is not
/// overtaken by later requests for 1 (a single attempt or a waiting one),
/// though 1 permit is free; when 2 are free it is granted, promptly, and
/// the later request for 1 (which would not fit beside it) only after the
/// next release. Skipped on stores that do not queue.
pub async fn semaphore_fifo_head_is_not_overtaken_by_smaller_requests(f: &Factory) {
    let (a, b, c) = (f.client().await, f.client().await, f.client().await);
    let Some([sa, sb, sc]) = gated([&a, &b, &c]) else {
        return;
    };
    if !sa.is_fifo() {
        eprintln!(
            "skipped: {} does not queue semaphore waiters (is_fifo is false)",
            a.capabilities().backend
        );
        return;
    }
    let name = unique("sem-fifo");
    // 3 permits: 1 kept, 1 released soon, 1 free.
    let keep = sa.acquire(&name, 3, LONG, Duration::ZERO).await.unwrap();
    let held = sa.acquire(&name, 3, LONG, Duration::ZERO).await.unwrap();
    let n2 = name.clone();
    let big = tokio::spawn(async move {
        let p = sb
            .acquire_many(&n2, 2, 3, LONG, Duration::from_secs(20))
            .await;
        (Instant::now(), p)
    });
    // The checks below need the request for 2 in the queue: wait until
    // the store shows it waiting (or it was granted, which is the bug).
    until("the request for 2 queued", LONG, || async {
        big.is_finished() || sc.inspect(&name).await.unwrap().waiters >= Some(1)
    })
    .await;
    assert!(!big.is_finished(), "2 permits granted with 1 free");
    assert!(
        sc.try_acquire(&name, 3, LONG).await.unwrap().is_none(),
        "a later request for 1 overtook the queued request for 2"
    );
    let n3 = name.clone();
    let sc2 = sc.clone();
    let small = tokio::spawn(async move {
        let p = sc2.acquire(&n3, 3, LONG, Duration::from_secs(20)).await;
        (Instant::now(), p)
    });
    until("the request for 1 queued behind it", LONG, || async {
        small.is_finished() || sc.inspect(&name).await.unwrap().waiters >= Some(2)
    })
    .await;
    assert!(
        !small.is_finished(),
        "a later waiting request for 1 overtook the queued request for 2"
    );
    // 2 free now: exactly enough for the head, not for the one behind it.
    // Timed from the release's reply: its round trip is not the waiter's.
    held.release().await.unwrap();
    let released_at = Instant::now();
    let (big_at, big) = big.await.unwrap();
    let big = big.expect("the head of the queue must be granted");
    let lag = big_at.saturating_duration_since(released_at);
    assert!(
        lag <= WOKEN,
        "the head was granted {lag:?} after the release"
    );
    sleep(Duration::from_millis(300)).await;
    assert!(
        !small.is_finished(),
        "3 permits held beside 1 more: more than permits_total"
    );
    keep.release().await.unwrap();
    let released_at = Instant::now();
    let (small_at, small) = small.await.unwrap();
    let small = small.expect("the later request gets the permit given back");
    let lag = small_at.saturating_duration_since(released_at);
    assert!(
        lag <= WOKEN,
        "the second in line was granted {lag:?} after the release"
    );
    assert!(
        small.fencing_token() > big.fencing_token(),
        "granted out of order"
    );
    small.release().await.unwrap();
    big.release().await.unwrap();
}
