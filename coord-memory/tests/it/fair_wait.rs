//! A fair lock acquire waits for a ticket first, then for the lock: its
//! `wait` bounds both together.

use std::time::Duration;

use coord_core::{Error, LockOptions};
use coord_memory::MemoryBackend;
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

/// The lock is held; a first fair waiter holds the ticket for 600 ms (its
/// own wait) and gives it up; a second, asking to wait 1 s, gets the ticket
/// then and waits for the lock only what is left of its second: it times
/// out after 1 s in all, not 1.6 s.
#[tokio::test(start_paused = true)]
async fn a_fair_acquire_waits_no_longer_than_asked_its_ticket_included() {
    let locks = MemoryBackend::coord().locks().unwrap();
    let _held = locks.acquire("l", 60 * S, Duration::ZERO).await.unwrap();
    let first = tokio::spawn({
        let locks = locks.clone();
        async move {
            let opts = LockOptions::new(60 * S).wait(600 * MS).fair(true);
            locks.acquire_with("l", opts).await
        }
    });
    tokio::time::sleep(10 * MS).await;
    let started = Instant::now();
    let opts = LockOptions::new(60 * S).wait(S).fair(true);
    let second = locks.acquire_with("l", opts).await;
    let waited = started.elapsed();
    assert!(matches!(second, Err(Error::Timeout { .. })), "{second:?}");
    assert!(
        waited <= S + 50 * MS,
        "a fair acquire asked to wait 1 s waited {waited:?}"
    );
    assert!(matches!(first.await.unwrap(), Err(Error::Timeout { .. })));
}

/// Each fair lock has tickets of its own: a fair holder of one name does
/// not hold up a fair acquire of another.
#[tokio::test(start_paused = true)]
async fn fair_locks_of_two_names_take_tickets_of_their_own() {
    let locks = MemoryBackend::coord().locks().unwrap();
    let fair = LockOptions::new(60 * S).fair(true);
    let _a = locks.acquire_with("a", fair).await.unwrap();
    let b = locks.acquire_with("b", fair).await;
    assert!(b.is_ok(), "a fair acquire of b waited on a's ticket: {b:?}");
}
