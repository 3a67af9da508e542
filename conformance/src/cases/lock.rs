//! Lock cases.

use std::time::Duration;

use coord_core::Error;
use tokio::time::{Instant, sleep, timeout};

use super::ROUNDS;
use crate::{Factory, WOKEN, expiry_slack, ttl, unique, wake_poll};

mod many;
pub use many::{lock_acquire_all_reversed_orders_never_deadlock, lock_mutual_exclusion_under_load};

mod guard;
pub use guard::{
    lock_dropped_guard_is_released_before_ttl, lock_lost_signal_fires_and_with_lock_stops,
    lock_watchdog_keeps_lock_and_stops_at_release,
};

const LONG: Duration = Duration::from_secs(30);

/// A held lock excludes every other client.
pub async fn lock_held_excludes_others(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let name = unique("excl");
    let g = a
        .locks()
        .unwrap()
        .acquire(&name, LONG, Duration::ZERO)
        .await
        .expect("free lock");
    assert!(
        b.locks()
            .unwrap()
            .try_acquire(&name, LONG)
            .await
            .unwrap()
            .is_none(),
        "second client got a held lock"
    );
    assert!(
        a.locks()
            .unwrap()
            .try_acquire(&name, LONG)
            .await
            .unwrap()
            .is_none(),
        "a second grant in the same client"
    );
    let e = b
        .locks()
        .unwrap()
        .acquire(&name, LONG, Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Timeout { .. }),
        "expected Timeout, got {e:?}"
    );
    g.release().await.unwrap();
}

/// Locks are not reentrant: the holder's own client acquiring the name
/// again is another owner, refused while the first guard holds and
/// granted (with a higher token) once it is released.
pub async fn lock_is_not_reentrant(f: &Factory) {
    let c = f.client().await;
    let Ok(locks) = c.locks() else {
        return;
    };
    let name = unique("reentry");
    let first = locks.try_acquire(&name, LONG).await.unwrap().expect("free");
    assert!(
        locks.try_acquire(&name, LONG).await.unwrap().is_none(),
        "a second acquire of a held lock by the same client was granted"
    );
    let waited = locks
        .acquire(&name, LONG, Duration::from_millis(200))
        .await
        .err();
    assert!(
        matches!(waited, Some(Error::Timeout { .. })),
        "a waiting second acquire by the same client: {waited:?}"
    );
    let token = first.fencing_token();
    first.release().await.unwrap();
    let second = locks
        .try_acquire(&name, LONG)
        .await
        .unwrap()
        .expect("free again");
    assert!(second.fencing_token() > token);
    second.release().await.unwrap();
}

/// Different names do not exclude each other (lock splitting).
pub async fn lock_different_names_are_independent(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let base = unique("split");
    let mut guards = Vec::new();
    for i in 0..8 {
        let c = if i % 2 == 0 { &a } else { &b };
        let g = c
            .locks()
            .unwrap()
            .try_acquire(&format!("{base}-product-{i}"), LONG)
            .await
            .unwrap();
        guards
            .push(g.unwrap_or_else(|| panic!("product {i} was blocked by another product's lock")));
    }
    for g in guards {
        g.release().await.unwrap();
    }
}

/// Releasing lets the next client in at once, with a higher token.
pub async fn lock_release_lets_the_next_client_in(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let name = unique("next");
    let g = a
        .locks()
        .unwrap()
        .acquire(&name, LONG, Duration::ZERO)
        .await
        .unwrap();
    let t1 = g.fencing_token();
    g.release().await.unwrap();
    let g2 = b
        .locks()
        .unwrap()
        .try_acquire(&name, LONG)
        .await
        .unwrap()
        .expect("released lock must be free");
    assert!(
        g2.fencing_token() > t1,
        "fencing token must rise: {} then {}",
        t1,
        g2.fencing_token()
    );
    g2.release().await.unwrap();
}

/// A stale guard's release and extend report NotHeld and leave the new
/// holder's lock untouched.
pub async fn lock_stale_guard_cannot_release_or_extend(f: &Factory) {
    let (a, b, c) = (f.client().await, f.client().await, f.client().await);
    let name = unique("stale");
    let short = ttl(&a, Duration::from_secs(1));
    let stale = a
        .locks()
        .unwrap()
        .acquire(&name, short, Duration::ZERO)
        .await
        .unwrap();
    let newer = b
        .locks()
        .unwrap()
        .acquire(&name, LONG, short * 3 + Duration::from_secs(5))
        .await
        .expect("lock must free after its TTL");
    assert!(newer.fencing_token() > stale.fencing_token());
    let e = stale.extend(LONG).await.unwrap_err();
    assert!(matches!(e, Error::NotHeld { .. }), "stale extend: {e:?}");
    let e = stale.release().await.unwrap_err();
    assert!(matches!(e, Error::NotHeld { .. }), "stale release: {e:?}");
    assert!(
        c.locks()
            .unwrap()
            .try_acquire(&name, LONG)
            .await
            .unwrap()
            .is_none(),
        "the stale guard freed the new holder's lock"
    );
    newer.extend(LONG).await.expect("new holder still holds it");
    newer.release().await.unwrap();
}

/// A guard whose extend finds the lock removed (taken away behind its
/// back, long before its TTL) is lost at once: `is_valid` turns false, the
/// lost signal and the lost token fire, without waiting for the local
/// deadline.
pub async fn lock_extend_of_a_removed_lock_marks_the_guard_lost(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let name = unique("removed");
    let g = a
        .locks()
        .unwrap()
        .acquire(&name, LONG, Duration::ZERO)
        .await
        .unwrap();
    let token = g.lost_token();
    assert!(g.is_valid());
    assert!(
        b.locks().unwrap().force_release(&name).await.unwrap(),
        "force_release found nothing to remove"
    );
    let e = g.extend(LONG).await.unwrap_err();
    assert!(matches!(e, Error::NotHeld { .. }), "extend: {e:?}");
    assert!(
        !g.is_valid(),
        "a guard whose extend found the lock gone is still valid"
    );
    assert!(
        !g.ownership().is_valid(),
        "its ownership view is still valid"
    );
    timeout(Duration::from_secs(1), g.lost())
        .await
        .expect("the lost signal waited for the deadline (30 s away)");
    assert!(token.is_cancelled(), "lost token not cancelled");
    assert!(
        g.lost_token().is_cancelled(),
        "a token asked for afterwards is not cancelled"
    );
    assert!(
        g.ownership().lost_token().is_cancelled(),
        "the ownership view's token is not cancelled"
    );
}

/// Extend keeps the lock past its first TTL, never resurrects an expired
/// lock and never changes the fencing token.
pub async fn lock_extend_keeps_token_and_never_resurrects(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let short = ttl(&a, Duration::from_secs(1));
    // The extended lock is held until at least `extended` + 4 x short: a
    // "still held" check answered after that proves nothing (the machine
    // stalled), and the case starts again on a fresh name.
    for _ in 0..ROUNDS {
        let name = unique("extend");
        let g = a
            .locks()
            .unwrap()
            .acquire(&name, short, Duration::ZERO)
            .await
            .unwrap();
        let token = g.fencing_token();
        let extended = Instant::now();
        g.extend(short * 4).await.unwrap();
        sleep(short * 2).await;
        let held = b.locks().unwrap().try_acquire(&name, LONG).await.unwrap();
        if extended.elapsed() >= short * 4 {
            eprintln!("the extended-lock check was answered too late: again on a fresh name");
            drop((g, held));
            continue;
        }
        assert!(held.is_none(), "extended lock expired at its first TTL");
        assert_eq!(g.fencing_token(), token);
        // Let it expire, then extend must fail and not bring it back.
        sleep(short * 3 + Duration::from_millis(500)).await;
        let e = g.extend(LONG).await.unwrap_err();
        assert!(
            matches!(e, Error::NotHeld { .. }),
            "extend of an expired lock: {e:?}"
        );
        // etcd frees an expired lease up to `expiry_slack` after its TTL;
        // a resurrected lock would be held for 30 s.
        let g2 = b
            .locks()
            .unwrap()
            .acquire(&name, LONG, expiry_slack(&a))
            .await
            .expect("extend resurrected an expired lock");
        assert!(g2.fencing_token() > token);
        g2.release().await.unwrap();
        return;
    }
    panic!("{ROUNDS} rounds, each with a check answered too late to judge");
}

/// An unrenewed lock frees after its TTL, and not before.
pub async fn lock_frees_after_ttl_and_not_before(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let t = ttl(&a, Duration::from_secs(2));
    // etcd frees an expired lease up to `expiry_slack` after its TTL.
    let slack = expiry_slack(&a);
    // The grant is made between `sent` and `answered`: the lock may not be
    // free before `sent` + t, and must be by `answered` + t (+ slack). A
    // "still held" check answered after `sent` + t proves nothing (the
    // machine stalled): then the case starts again on a fresh name.
    for _ in 0..ROUNDS {
        let name = unique("ttl");
        let sent = Instant::now();
        let g = a
            .locks()
            .unwrap()
            .acquire(&name, t, Duration::ZERO)
            .await
            .unwrap();
        let answered = Instant::now();
        assert!(g.remaining() <= t);
        sleep(t / 2).await;
        let early = b.locks().unwrap().try_acquire(&name, LONG).await.unwrap();
        if sent.elapsed() >= t {
            eprintln!("the half-TTL check was answered after the TTL: again on a fresh name");
            drop((g, early));
            continue;
        }
        assert!(early.is_none(), "lock freed before half its TTL");
        let g2 = b
            .locks()
            .unwrap()
            .acquire(&name, LONG, t * 2 + Duration::from_secs(3))
            .await
            .expect("lock never freed");
        let (since_sent, waited) = (sent.elapsed(), answered.elapsed());
        assert!(
            since_sent + Duration::from_millis(50) >= t,
            "freed {since_sent:?} after the grant was asked for, TTL {t:?}"
        );
        assert!(
            waited <= t + slack + Duration::from_secs(2),
            "freed only after {waited:?}, TTL {t:?}, expiry slack {slack:?}"
        );
        drop(g);
        g2.release().await.unwrap();
        return;
    }
    panic!("{ROUNDS} rounds, each with a check answered too late to judge");
}

/// A waiting acquire gets the lock within [`WOKEN`] of the release's reply
/// although its polling fallback is [`wake_poll`]: the wake-up came from
/// the store.
pub async fn lock_waiter_is_woken_by_notification(f: &Factory) {
    let a = f.client().await;
    let b = f.client().await;
    let poll = wake_poll(&b);
    let b = b.with_poll_interval(poll);
    let name = unique("wake");
    let g = a
        .locks()
        .unwrap()
        .acquire(&name, LONG, Duration::ZERO)
        .await
        .unwrap();
    let n2 = name.clone();
    let waiter = tokio::spawn(async move {
        let g = b
            .locks()
            .unwrap()
            .acquire(&n2, LONG, Duration::from_secs(20))
            .await;
        (Instant::now(), g)
    });
    // Let the waiter attempt, subscribe and settle into its long sleep.
    sleep(Duration::from_millis(1500)).await;
    g.release().await.unwrap();
    // From the release's reply: its round trip is not the waiter's delay.
    let released_at = Instant::now();
    let (got_at, g2) = waiter.await.unwrap();
    let g2 = g2.expect("waiter must get the lock");
    let lag = got_at.saturating_duration_since(released_at);
    assert!(
        lag <= WOKEN,
        "waiter took {lag:?} after release (poll {poll:?}): not woken by a notification"
    );
    g2.release().await.unwrap();
}

/// An acquire whose wait is never satisfied returns Timeout and leaves
/// nothing held.
pub async fn lock_acquire_timeout_leaves_nothing_held(f: &Factory) {
    let (a, b, c) = (f.client().await, f.client().await, f.client().await);
    let name = unique("timeout");
    let g = a
        .locks()
        .unwrap()
        .acquire(&name, LONG, Duration::ZERO)
        .await
        .unwrap();
    let start = Instant::now();
    let e = b
        .locks()
        .unwrap()
        .acquire(&name, LONG, Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Timeout { .. }),
        "expected Timeout, got {e:?}"
    );
    assert!(e.is_retryable());
    assert!(
        start.elapsed() >= Duration::from_millis(450),
        "gave up early: {:?}",
        start.elapsed()
    );
    g.release().await.unwrap();
    // Give a queued backend's cleanup a moment, then the lock must be free.
    let g3 = c
        .locks()
        .unwrap()
        .acquire(&name, LONG, Duration::from_secs(2))
        .await
        .expect("the timed-out waiter left the lock held");
    g3.release().await.unwrap();
}
