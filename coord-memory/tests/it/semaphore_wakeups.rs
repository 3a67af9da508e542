//! Semaphore wake-ups in memory: a release wakes exactly the queued
//! waiters it made grantable, and no waiter of another name.

use std::pin::pin;
use std::time::Duration;

use coord_core::{Attempt, OwnerToken, PermitRequest, Semaphore};
use coord_memory::MemoryBackend;

const SEC: Duration = Duration::from_secs(1);

fn one_of_one() -> PermitRequest {
    PermitRequest {
        permits: 1,
        total: 1,
        ttl: 60 * SEC,
        queue: true,
    }
}

#[tokio::test(start_paused = true)]
async fn a_release_wakes_the_waiter_it_made_grantable_and_no_other_names() {
    let m = MemoryBackend::new();
    let [ha, hb, wa, wb] = std::array::from_fn(|_| OwnerToken::random());
    for (name, holder, waiter) in [("a", &ha, &wa), ("b", &hb, &wb)] {
        let g = m.try_acquire(name, holder.step(), &one_of_one()).await;
        assert!(matches!(g, Ok(Attempt::Granted(_))), "{g:?}");
        let w = m.try_acquire(name, waiter.step(), &one_of_one()).await;
        assert!(matches!(w, Ok(Attempt::Held { .. })), "{w:?}");
    }
    let (sub_a, sub_b) = (
        m.subscribe("a", &wa).await.unwrap(),
        m.subscribe("b", &wb).await.unwrap(),
    );
    let (mut on_a, mut on_b) = (pin!(sub_a.notified()), pin!(sub_b.notified()));
    on_a.as_mut().enable();
    on_b.as_mut().enable();
    assert!(m.release("b", hb.step()).await.unwrap());
    tokio::time::timeout(SEC, on_b)
        .await
        .expect("the waiter made grantable was not woken");
    assert!(
        tokio::time::timeout(SEC, on_a).await.is_err(),
        "a release of b woke the waiter of a"
    );
}
