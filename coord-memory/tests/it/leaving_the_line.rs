//! A waiting acquire that gives up leaves the store's queue before it
//! returns, and if the caller's own timeout drops it during that round
//! trip, it still leaves it (in the background): no place in line outlives
//! the acquire that held it.

use std::time::Duration;

use tokio::time::Instant;

use crate::slow_store::{Lag, Slow};

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);
const LONG: Duration = Duration::from_secs(300);

/// A store where leaving the line (a semaphore release) takes 100 ms to
/// reach it; everything else answers at once.
fn slow_release() -> std::sync::Arc<Slow> {
    let slow = Slow::new(Lag::default());
    slow.set("semaphore.release", Lag::new(100 * MS, Duration::ZERO));
    slow
}

#[tokio::test(start_paused = true)]
async fn a_semaphore_acquire_dropped_while_leaving_the_line_leaves_no_place() {
    let slow = slow_release();
    let sem = slow.coord(60 * S).semaphores().unwrap();
    assert!(sem.is_fifo());
    let holder = sem.acquire("pool", 1, LONG, Duration::ZERO).await.unwrap();
    // It gives up at 1 s and starts leaving the line; the caller's timeout
    // drops it 50 ms into that.
    let r = tokio::time::timeout(1050 * MS, sem.acquire("pool", 1, LONG, S)).await;
    assert!(
        r.is_err(),
        "the acquire ended before the caller's timeout: {r:?}"
    );
    holder.release().await.unwrap();
    tokio::time::sleep(S).await;
    let waiters = coord_core::Semaphore::inspect(&*slow.inner, "pool")
        .await
        .unwrap()
        .waiters;
    assert_eq!(
        waiters,
        Some(0),
        "the dropped acquire kept its place in line"
    );
    let started = Instant::now();
    let p = sem.acquire("pool", 1, LONG, 60 * S).await.unwrap();
    assert!(
        started.elapsed() < S,
        "an idle semaphore made the next request wait {:?}",
        started.elapsed()
    );
    p.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_writer_dropped_while_leaving_the_line_lets_readers_in() {
    let slow = slow_release();
    let rw = slow.coord(60 * S).rw_locks().unwrap();
    let reader = rw.read("config", LONG, Duration::ZERO).await.unwrap();
    let r = tokio::time::timeout(1050 * MS, rw.write("config", LONG, S)).await;
    assert!(
        r.is_err(),
        "the write ended before the caller's timeout: {r:?}"
    );
    tokio::time::sleep(S).await;
    let second = rw.try_read("config", LONG).await.unwrap();
    assert!(
        second.is_some(),
        "readers are refused behind a writer that gave up"
    );
    second.unwrap().release().await.unwrap();
    reader.release().await.unwrap();
}
