//! A barrier arrival whose outcome its wait never learned (the store
//! recorded it, the reply was lost, and every retry failed until the
//! deadline) is settled afterwards: once the store answers again the
//! participant is withdrawn, so nobody passes with it counted.

use std::time::Duration;

use coord_core::Error;

use crate::support::faulty::{Fault, Faulty};

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

#[tokio::test(start_paused = true)]
async fn a_failed_wait_whose_arrival_landed_is_withdrawn() {
    let f = Faulty::new();
    let b = f.coord(100 * MS).barriers().unwrap();
    f.next("barrier.arrive", Fault::LoseReply, 1);
    f.next("barrier.arrive", Fault::Unavailable, 1000);
    let e = b.wait("phase", 2, "p1", S).await.unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "got {e:?}");
    assert!(
        f.calls("barrier.arrive") >= 2,
        "the arrival was not retried"
    );
    f.heal();
    // The cleanup's time: its first tries, a few round trips.
    tokio::time::sleep(S).await;
    let r = b.wait("phase", 2, "p2", 500 * MS).await;
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "p2 passed a 2-party barrier alone: {r:?}"
    );
}

/// The same when the caller's own timeout drops the wait while the
/// arrival is still being retried: the retries end at the wait's deadline
/// without an answer, and the participant is withdrawn once the store
/// answers.
#[tokio::test(start_paused = true)]
async fn a_dropped_wait_whose_arrival_never_got_an_answer_is_withdrawn() {
    let f = Faulty::new();
    let b = f.coord(100 * MS).barriers().unwrap();
    f.next("barrier.arrive", Fault::LoseReply, 1);
    f.next("barrier.arrive", Fault::Unavailable, 1000);
    let r = tokio::time::timeout(500 * MS, b.wait("phase", 2, "p1", 2 * S)).await;
    assert!(
        r.is_err(),
        "the wait ended before the caller's timeout: {r:?}"
    );
    // The arrival's retries give up at the wait's deadline, 2 s.
    tokio::time::sleep(3 * S).await;
    f.heal();
    tokio::time::sleep(10 * S).await;
    let r = b.wait("phase", 2, "p2", 500 * MS).await;
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "p2 passed a 2-party barrier alone: {r:?}"
    );
}

/// An arrival that failed without ever reaching the store (every try
/// refused before it was sent) leaves nothing to settle, and its cleanup
/// does not make it arrive after all: a later pair passes together.
#[tokio::test(start_paused = true)]
async fn a_failed_wait_whose_arrival_never_landed_is_not_counted_later() {
    let f = Faulty::new();
    let b = f.coord(100 * MS).barriers().unwrap();
    f.next("barrier.arrive", Fault::Broken, 1);
    let e = b.wait("phase", 2, "p1", S).await.unwrap_err();
    assert!(matches!(e, Error::Store { .. }), "got {e:?}");
    tokio::time::sleep(10 * S).await;
    assert_eq!(
        f.calls("barrier.arrive"),
        1,
        "a broken arrival was sent again"
    );
    let r = b.wait("phase", 2, "p2", 500 * MS).await;
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "p2 passed a 2-party barrier alone: {r:?}"
    );
}

/// An arrival whose tries were all unanswered and never reached the store
/// is not sent again by its cleanup: with another participant already
/// waiting, a copy sent now would complete the generation, and that
/// participant would pass with one whose wait had already failed. The
/// cleanup withdraws the arrival id instead, wherever it stands.
#[tokio::test(start_paused = true)]
async fn the_cleanup_of_an_unanswered_arrival_never_completes_a_generation() {
    let f = Faulty::new();
    let coord = f.coord(100 * MS);
    let b = coord.barriers().unwrap();
    let waiting = tokio::spawn({
        let b = coord.barriers().unwrap();
        async move { b.wait("phase", 2, "p2", 30 * S).await }
    });
    tokio::time::sleep(100 * MS).await;
    f.next("barrier.arrive", Fault::Unavailable, 1000);
    let e = b.wait("phase", 2, "p1", S).await.unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "got {e:?}");
    f.heal();
    tokio::time::sleep(10 * S).await;
    assert!(
        !waiting.is_finished(),
        "p2 passed a 2-party barrier with p1, whose wait had failed: {:?}",
        waiting.await
    );
    // The barrier still works: another participant completes it.
    b.wait("phase", 2, "p3", S).await.unwrap();
    waiting.await.unwrap().unwrap();
}
