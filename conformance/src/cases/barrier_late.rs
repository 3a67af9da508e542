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
