//! How a guard counts its deadline across extends: only an extend whose
//! reply never came may still land and set the store's expiry back, so
//! only such an extend's shorter TTL bounds the deadlines counted after it.

use std::time::Duration;

use coord_core::LockGuard;
use coord_memory::MemoryBackend;
use support::faulty::{Fault, Faulty};

use crate::support;

const S: Duration = Duration::from_secs(1);

/// A lock held for 10 s, then extended to 1 s with the reply lost (the
/// extend was applied; its caller got an error). The store is returned
/// with the guard, to live as long as it.
async fn held_10_s_then_extended_to_1_s_with_the_reply_lost() -> (std::sync::Arc<Faulty>, LockGuard)
{
    let f = Faulty::new();
    let locks = f.coord(S).locks().unwrap();
    let g = locks.acquire("l", 10 * S, Duration::ZERO).await.unwrap();
    f.next("lock.extend", Fault::LoseReply, 1);
    assert!(g.extend(S).await.is_err(), "the reply was not lost");
    (f, g)
}

/// Extended to 1 s, then to 30 s, both answered: the guard counts 30 s
/// (the 1 s extend landed, no copy of it is left to land later).
#[tokio::test(start_paused = true)]
async fn an_answered_short_extend_does_not_bound_a_later_one() {
    let locks = MemoryBackend::coord().locks().unwrap();
    let g = locks.acquire("l", 10 * S, Duration::ZERO).await.unwrap();
    g.extend(S).await.unwrap();
    g.extend(30 * S).await.unwrap();
    assert!(
        g.remaining() > 25 * S,
        "an answered extend to 1 s still bounds the guard: {:?} left",
        g.remaining()
    );
    g.release().await.unwrap();
}

/// Extended to 1 s with the reply lost (it may still land), then to 30 s,
/// answered: the guard counts 1 s from the second extend, not 30 s, since
/// the first one's copy may land after it and set the store's expiry back
/// to 1 s.
#[tokio::test(start_paused = true)]
async fn an_unanswered_short_extend_bounds_a_later_one() {
    let (_store, g) = held_10_s_then_extended_to_1_s_with_the_reply_lost().await;
    g.extend(30 * S).await.unwrap();
    assert!(
        g.remaining() <= S,
        "an extend to 1 s whose reply was lost does not bound the guard: {:?} left",
        g.remaining()
    );
}

/// Extended to 1 s with the reply lost, and nothing after: the guard counts
/// 1 s from when the extend was sent, not the 10 s it had, since the store
/// may have applied the extend whatever its caller heard.
#[tokio::test(start_paused = true)]
async fn an_unanswered_short_extend_brings_the_deadline_forward() {
    let (_store, g) = held_10_s_then_extended_to_1_s_with_the_reply_lost().await;
    assert!(
        g.remaining() <= S,
        "an extend to 1 s whose reply was lost left the guard its 10 s: {:?} left",
        g.remaining()
    );
}
