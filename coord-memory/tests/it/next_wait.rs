//! A dropped barrier wait's background withdraw that lands after the same
//! participant's next wait arrived withdraws the dropped wait's arrival
//! only: the next wait still counts and passes.

use std::time::Duration;

use crate::slow_store::{Lag, Slow};

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

/// p1's first wait is dropped while it waits; its withdraw takes 500 ms to
/// reach the store; meanwhile p1 waits again (a new arrival in the same
/// generation). When p2 arrives the generation completes, and p1's second
/// wait passes with it.
#[tokio::test(start_paused = true)]
async fn a_dropped_waits_withdraw_leaves_the_next_wait_counted() {
    let slow = Slow::new(Lag::new(MS, MS));
    slow.set("barrier.withdraw", Lag::new(500 * MS, MS));
    let barriers = slow.coord(S).barriers().unwrap();
    let first = tokio::spawn({
        let b = barriers.clone();
        async move { b.wait("next", 2, "p1", 60 * S).await }
    });
    tokio::time::sleep(50 * MS).await;
    assert!(!first.is_finished());
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    let second = tokio::spawn({
        let b = barriers.clone();
        async move { b.wait("next", 2, "p1", 60 * S).await }
    });
    // The dropped wait's withdraw lands after the second arrival.
    tokio::time::sleep(S).await;
    assert!(!second.is_finished());
    let p2 = barriers.wait("next", 2, "p2", 5 * S).await;
    let g = p2.expect("p2 completes the generation with p1's next wait");
    let p1 = tokio::time::timeout(5 * S, second).await;
    assert_eq!(
        p1.unwrap().unwrap().unwrap(),
        g,
        "p1's next wait passes with p2"
    );
}
