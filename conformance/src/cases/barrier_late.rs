//! Barrier cases for cleanups that name the attempt they undo: a withdraw
//! names one arrival (one wait), a late copy of a withdrawn arrival is
//! refused, and a withdraw of an earlier wait leaves the participant's
//! next wait in place. They drive the raw `Barrier` trait, so the "late
//! copy" lands deterministically (the same request the core sends again
//! on a retry, landing after the withdraw) without a network proxy.

use coord_core::OwnerToken;

use crate::unique;

/// A waiter timed out and was withdrawn; the late copy of its first
/// arrival (held in the network past the call timeout) then lands. It must
/// not make the participant a member again: a barrier of 3 never passes
/// with 2 live participants.
pub async fn barrier_late_copy_of_a_withdrawn_arrival_is_refused(f: &crate::Factory) {
    if crate::cases::offered(f.client().await.barriers()).is_none() {
        return;
    }
    let name = unique("barrier-late");
    let raw = f.client().await.raw_barrier().unwrap();
    let (a, b, c) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let first = raw.arrive(&name, 3, "b", &b).await.unwrap();
    assert!(!first.complete);
    let ga = raw.arrive(&name, 3, "a", &a).await.unwrap();
    assert_eq!(ga.generation, first.generation);
    assert!(raw.withdraw(&name, ga.generation, "a", &a).await.unwrap());
    // The late copy of a's arrival lands after the withdraw.
    let late = raw.arrive(&name, 3, "a", &a).await;
    assert!(
        matches!(late, Err(coord_core::Error::ArrivalLost { .. })),
        "a late copy of a withdrawn arrival was not refused: {late:?}"
    );
    // c arrives: 2 live participants of 3, the generation stays open.
    let gc = raw.arrive(&name, 3, "c", &c).await.unwrap();
    assert!(
        !gc.complete,
        "a barrier of 3 completed with 2 live participants (a withdrawn arrival counted)"
    );
    assert!(!raw.is_complete(&name, gc.generation).await.unwrap());
    // A new wait of a (a new arrival id) joins as usual and completes it.
    let again = raw.arrive(&name, 3, "a", &OwnerToken::random()).await;
    let again = again.unwrap();
    assert!(again.complete && again.generation == gc.generation);
}

/// A dropped wait's background withdraw lands after the same
/// participant's next wait arrived: it withdraws only its own arrival, and
/// the next wait still counts.
pub async fn barrier_withdraw_of_an_earlier_wait_leaves_the_next_wait(f: &crate::Factory) {
    if crate::cases::offered(f.client().await.barriers()).is_none() {
        return;
    }
    let name = unique("barrier-next");
    let raw = f.client().await.raw_barrier().unwrap();
    let (old, next) = (OwnerToken::random(), OwnerToken::random());
    let g = raw.arrive(&name, 2, "p1", &old).await.unwrap();
    assert!(!g.complete);
    let g2 = raw.arrive(&name, 2, "p1", &next).await.unwrap();
    assert_eq!((g2.generation, g2.complete), (g.generation, false));
    // The dropped wait's withdraw: its arrival no longer counts.
    assert!(raw.withdraw(&name, g.generation, "p1", &old).await.unwrap());
    // A late copy of the old arrival is refused.
    let late = raw.arrive(&name, 2, "p1", &old).await;
    assert!(
        matches!(late, Err(coord_core::Error::ArrivalLost { .. })),
        "a late copy of a withdrawn arrival was not refused: {late:?}"
    );
    // p1's next wait still counts: p2 completes the generation.
    let done = raw
        .arrive(&name, 2, "p2", &OwnerToken::random())
        .await
        .unwrap();
    assert!(
        done.complete && done.generation == g.generation,
        "the withdraw of an earlier wait removed the participant's next wait"
    );
    assert!(raw.is_complete(&name, g.generation).await.unwrap());
    // Withdrawing the next wait after it passed: it passed.
    assert!(
        !raw.withdraw(&name, g.generation, "p1", &next)
            .await
            .unwrap()
    );
}

/// A withdraw of an arrival whose generation was never learned
/// ([`ANY_GENERATION`](coord_core::ANY_GENERATION)) undoes it wherever it
/// stands: recorded in the open generation, it no longer counts; never
/// recorded, a late copy of it is refused; recorded in a generation that
/// completed, the next generation is untouched.
pub async fn barrier_withdraw_of_an_arrival_of_unknown_generation(f: &crate::Factory) {
    if crate::cases::offered(f.client().await.barriers()).is_none() {
        return;
    }
    let any = coord_core::ANY_GENERATION;
    let raw = f.client().await.raw_barrier().unwrap();
    // Recorded in the open generation.
    let name = unique("barrier-any-open");
    let a = OwnerToken::random();
    let g = raw.arrive(&name, 2, "p1", &a).await.unwrap();
    assert!(!g.complete);
    assert!(raw.withdraw(&name, any, "p1", &a).await.unwrap());
    let other = raw
        .arrive(&name, 2, "p2", &OwnerToken::random())
        .await
        .unwrap();
    assert!(
        !other.complete,
        "a barrier of 2 completed with an arrival withdrawn from an unknown generation"
    );
    // Never recorded: the late copy is refused.
    let name = unique("barrier-any-never");
    let a = OwnerToken::random();
    assert!(raw.withdraw(&name, any, "p1", &a).await.unwrap());
    let late = raw.arrive(&name, 2, "p1", &a).await;
    assert!(
        matches!(late, Err(coord_core::Error::ArrivalLost { .. })),
        "a late copy of an arrival withdrawn before it landed was not refused: {late:?}"
    );
    let other = raw
        .arrive(&name, 2, "p2", &OwnerToken::random())
        .await
        .unwrap();
    assert!(!other.complete, "a refused late copy counted");
    // Recorded in a generation that completed: the next one is untouched.
    let name = unique("barrier-any-passed");
    let a = OwnerToken::random();
    raw.arrive(&name, 2, "p1", &a).await.unwrap();
    let done = raw
        .arrive(&name, 2, "p2", &OwnerToken::random())
        .await
        .unwrap();
    assert!(done.complete);
    let next = raw
        .arrive(&name, 2, "p1", &OwnerToken::random())
        .await
        .unwrap();
    assert!(!next.complete && next.generation > done.generation);
    raw.withdraw(&name, any, "p1", &a).await.unwrap();
    let last = raw
        .arrive(&name, 2, "p2", &OwnerToken::random())
        .await
        .unwrap();
    assert!(
        last.complete && last.generation == next.generation,
        "withdrawing an arrival that had passed removed the participant's next wait"
    );
}
