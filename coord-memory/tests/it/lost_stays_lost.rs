//! Once a guard is lost (its lost signal fired: the local validity deadline
//! passed, or the store said the claim is gone), it stays lost and its
//! calls say so: `extend` refuses with `NotHeld` and changes nothing on the
//! store, the watchdog renews nothing, and `is_valid` and the lost token
//! keep telling the same story.

use std::time::Duration;

use coord_core::{Error, OwnerToken};

use crate::support::faulty::{Fault, Faulty};

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

/// Whether another owner can take `name` on the store right now.
async fn is_free(f: &Faulty, name: &str) -> bool {
    let o = OwnerToken::random();
    match coord_core::Lock::try_acquire(&*f.inner, name, o.step(), S)
        .await
        .unwrap()
    {
        coord_core::Attempt::Granted(_) => {
            coord_core::Lock::release(&*f.inner, name, o.step())
                .await
                .unwrap();
            true
        }
        coord_core::Attempt::Held { .. } => false,
    }
}

#[tokio::test(start_paused = true)]
async fn extend_after_the_lost_signal_refuses_and_changes_nothing() {
    let f = Faulty::new();
    let locks = f.coord(S).locks().unwrap();
    let g = locks.acquire("job", 10 * S, Duration::ZERO).await.unwrap();
    let token = g.lost_token();
    // The local deadline is the drift margin (102 ms) before the store's.
    tokio::time::sleep_until(g.valid_until() + MS).await;
    assert!(token.is_cancelled(), "the lost signal did not fire");
    assert!(!is_free(&f, "job").await, "the store let it go already");
    let r = g.extend(10 * S).await;
    assert!(
        matches!(r, Err(Error::NotHeld { .. })),
        "extend of a lost guard: {r:?}"
    );
    assert_eq!(f.calls("lock.extend"), 0, "a lost guard's extend was sent");
    assert!(!g.is_valid());
    assert!(token.is_cancelled() && g.lost_token().is_cancelled());
    // Nothing was extended: the store lets it go at its TTL.
    tokio::time::sleep(200 * MS).await;
    assert!(
        is_free(&f, "job").await,
        "the lost guard's extend kept the lock"
    );
    drop(g);
}

/// An extend whose reply comes only after the lost signal fired (the
/// deadline passed while it was on its way) is refused too: the work under
/// the guard was told to stop, so it must not hear "extended".
#[tokio::test(start_paused = true)]
async fn an_extend_answered_after_the_lost_signal_refuses() {
    let f = Faulty::new();
    let locks = f.coord(S).locks().unwrap();
    let g = locks.acquire("slow", 10 * S, Duration::ZERO).await.unwrap();
    let token = g.lost_token();
    tokio::time::sleep_until(g.valid_until() - 50 * MS).await;
    f.next("lock.extend", Fault::SlowReply(100 * MS), 1);
    let r = g.extend(10 * S).await;
    assert!(token.is_cancelled(), "the lost signal did not fire");
    assert!(
        matches!(r, Err(Error::NotHeld { .. })),
        "extend answered after the loss: {r:?}"
    );
    assert!(!g.is_valid());
    assert!(g.lost_token().is_cancelled());
}

/// Lost because the watchdog's renewal met a non-retryable error, while
/// the store still holds the claim and the deadline is far off: extend
/// refuses too, and the guard stays lost.
#[tokio::test(start_paused = true)]
async fn extend_after_a_failed_renewal_lost_the_guard_refuses() {
    let f = Faulty::new();
    let locks = f.coord(S).locks().unwrap();
    let mut g = locks
        .acquire("broken", 30 * S, Duration::ZERO)
        .await
        .unwrap();
    let token = g.lost_token();
    f.next("lock.extend", Fault::Broken, 1);
    g.keep_alive();
    // The watchdog renews a third of the TTL in (10 s) and gives up.
    tokio::time::sleep(11 * S).await;
    assert!(token.is_cancelled(), "the broken renewal did not lose it");
    assert!(g.remaining() > 10 * S, "the deadline is near: {g:?}");
    assert!(!is_free(&f, "broken").await, "the store let it go already");
    let r = g.extend(30 * S).await;
    assert!(
        matches!(r, Err(Error::NotHeld { .. })),
        "extend of a lost guard: {r:?}"
    );
    assert_eq!(f.calls("lock.extend"), 1, "a lost guard's extend was sent");
    assert!(!g.is_valid());
    assert!(g.lost_token().is_cancelled());
}

/// A lost guard's watchdog renews nothing, and the guard stays lost.
#[tokio::test(start_paused = true)]
async fn a_watchdog_started_on_a_lost_guard_renews_nothing() {
    let f = Faulty::new();
    let locks = f.coord(S).locks().unwrap();
    let mut g = locks.acquire("wd", 10 * S, Duration::ZERO).await.unwrap();
    let token = g.lost_token();
    tokio::time::sleep_until(g.valid_until() + MS).await;
    assert!(token.is_cancelled(), "the lost signal did not fire");
    g.keep_alive();
    tokio::time::sleep(5 * S).await;
    assert_eq!(
        f.calls("lock.extend"),
        0,
        "the watchdog renewed a lost guard"
    );
    assert!(!g.is_valid());
    assert!(is_free(&f, "wd").await);
}
