//! The in-memory store drops the state of idle names as new names come
//! (every 1024 new names per shard): it must keep every name something
//! still depends on.

use std::time::Duration;

use coord_core::{Attempt, Barrier, OwnerToken, PermitRequest, Semaphore};
use coord_memory::MemoryBackend;

const MS: Duration = Duration::from_millis(1);

fn request(permits: u32, ttl: Duration) -> PermitRequest {
    PermitRequest {
        permits,
        total: 2,
        ttl,
        queue: true,
    }
}

/// A semaphore whose holders all expired but whose queue still holds a
/// live waiter is not idle: swept, the waiter would lose its place, and a
/// newcomer asking for less would be granted ahead of it.
#[tokio::test(start_paused = true)]
async fn a_sweep_keeps_a_semaphore_whose_only_live_entry_is_a_queued_waiter() {
    let m = MemoryBackend::new();
    let (holder, waiter, newcomer) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let granted = m
        .try_acquire("s", holder.step(), &request(1, 50 * MS))
        .await;
    assert!(matches!(granted, Ok(Attempt::Granted(_))), "{granted:?}");
    let queued = m
        .try_acquire("s", waiter.step(), &request(2, 60_000 * MS))
        .await;
    assert!(matches!(queued, Ok(Attempt::Held { .. })), "{queued:?}");
    tokio::time::advance(100 * MS).await;
    // Enough new names, in every shard, for a sweep to run.
    for i in 0..64 * 1024 {
        let (name, o) = (format!("other-{i}"), OwnerToken::random());
        m.try_acquire(&name, o.step(), &request(1, 60_000 * MS))
            .await
            .unwrap();
    }
    let late = m
        .try_acquire("s", newcomer.step(), &request(1, 60_000 * MS))
        .await;
    assert!(
        matches!(late, Ok(Attempt::Held { .. })),
        "a newcomer was granted ahead of the queued waiter: {late:?}"
    );
    let w = m
        .try_acquire("s", waiter.step(), &request(2, 60_000 * MS))
        .await;
    assert!(matches!(w, Ok(Attempt::Granted(_))), "{w:?}");
}

/// A barrier whose generation just completed is idle (nobody waits in
/// it), so a sweep may drop it before a participant of that generation
/// asked whether it completed; made again (by the next generation's first
/// arrival, or by the withdraw of an arrival whose generation was never
/// learned), the barrier must still say that generation completed (it came
/// before), not that its arrival was lost with an earlier state.
#[tokio::test(start_paused = true)]
async fn a_barrier_swept_after_its_generation_completed_still_says_so() {
    let m = MemoryBackend::new();
    let mut completed = Vec::new();
    for name in ["by-arrival", "by-withdraw"] {
        let first = m
            .arrive(name, 2, "p1", &OwnerToken::random())
            .await
            .unwrap();
        assert!(!first.complete);
        let last = m
            .arrive(name, 2, "p2", &OwnerToken::random())
            .await
            .unwrap();
        assert!(last.complete && last.generation == first.generation);
        completed.push((name, first.generation));
    }
    // Enough new names, in every shard, for a sweep to run.
    for i in 0..64 * 1024 {
        let name = format!("other-{i}");
        m.arrive(&name, 1, "p", &OwnerToken::random())
            .await
            .unwrap();
    }
    let next = m
        .arrive("by-arrival", 2, "p3", &OwnerToken::random())
        .await
        .unwrap();
    assert!(!next.complete && next.generation > completed[0].1);
    let any = coord_core::ANY_GENERATION;
    m.withdraw("by-withdraw", any, "p3", &OwnerToken::random())
        .await
        .unwrap();
    for (name, generation) in completed {
        assert!(
            m.is_complete(name, generation).await.unwrap(),
            "{name}: p1's generation completed, but the barrier made again does not say so"
        );
    }
}
