//! Late copies of barrier arrivals.

use std::time::{Duration, Instant};

use super::hold_next_naming_for;
use crate::ROUNDS;
use crate::testkit::proxy::FaultProxy;

const SEC: Duration = Duration::from_secs(1);

/// Warm `far`'s connection (a barrier of one beside `name`), so that the
/// arrival held next is one request.
async fn warm(far: &coord_core::Barriers, name: &str) {
    far.wait(&format!("{name}-warm"), 1, "w", 5 * SEC)
        .await
        .unwrap();
}

/// Wait until `proxy` delivered a held request more than `before`
/// (failing at `deadline`), then `settle` while the store applies it.
async fn until_delivered(proxy: &FaultProxy, before: u64, deadline: Instant, settle: Duration) {
    while proxy.delivered() <= before {
        assert!(Instant::now() < deadline, "never delivered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(settle).await;
}

/// 3 parties: b waits (through `direct`); a's arrival (through `via`,
/// whose call timeout must be well under a second) is held in the network
/// 2.5 s, so a's wait times out and a is withdrawn; then the held copy
/// lands. It must not make a a member again: c's arrival must not
/// complete the generation (2 live participants of 3). `name` must not
/// contain `a-late`.
pub async fn late_copy_of_a_timed_out_barrier_arrival(
    via: &coord_core::Coord,
    direct: &coord_core::Coord,
    proxy: &FaultProxy,
    name: &str,
) {
    warm(&via.barriers().unwrap(), name).await;
    let b = tokio::spawn({
        let (direct, name) = (direct.clone(), name.to_string());
        async move {
            let barriers = direct.barriers().unwrap();
            barriers.wait(&name, 3, "b", 30 * SEC).await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    hold_next_naming_for(proxy, "a-late", Duration::from_millis(2500));
    let a = via.barriers().unwrap().wait(name, 3, "a-late", SEC).await;
    assert!(a.is_err(), "a passed alone with b: {a:?}");
    assert_eq!(proxy.held(), 1, "the arrival was held");
    let settle = Duration::from_millis(300);
    until_delivered(proxy, 0, Instant::now() + 5 * SEC, settle).await;
    let c = direct.barriers().unwrap().wait(name, 3, "c", SEC).await;
    assert!(
        matches!(c, Err(coord_core::Error::Timeout { .. })),
        "a barrier of 3 passed with 2 live participants (the late copy of a \
         withdrawn arrival counted): {c:?}"
    );
    assert!(
        !b.is_finished(),
        "b passed without a third live participant"
    );
    b.abort();
}

/// 2 parties. `a-late`'s arrival (through `via`, whose call timeout must
/// be well under a second) is held in the network 4 s; its wait gives up
/// and withdraws it. Then b and c pass that generation (which ends the
/// arrival's tombstone with it). Then the held copy lands. b, waiting
/// again alone, must not pass: the copy is of a wait that ended without
/// passing, and counts in no later generation. A round whose copy landed
/// before b and c passed (a loaded machine) proves nothing and fails as
/// such. `name` must not contain `a-late`.
pub async fn late_copy_of_a_withdrawn_arrival_after_its_generation_completed(
    via: &coord_core::Coord,
    direct: &coord_core::Coord,
    proxy: &FaultProxy,
    name: &str,
) {
    let (far, here) = (via.barriers().unwrap(), direct.barriers().unwrap());
    warm(&far, name).await;
    let started = Instant::now();
    hold_next_naming_for(proxy, "a-late", 4 * SEC);
    let a = far.wait(name, 2, "a-late", SEC).await;
    assert!(a.is_err(), "a passed alone: {a:?}");
    assert_eq!(proxy.held(), 1, "the arrival was held");
    // Let the withdraw land.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // b and c pass the generation a-late was withdrawn from.
    let (b, c) = tokio::join!(
        here.wait(name, 2, "b", 2 * SEC),
        here.wait(name, 2, "c", 2 * SEC)
    );
    let (gb, gc) = (b.unwrap(), c.unwrap());
    assert_eq!(gb, gc);
    assert!(
        proxy.delivered() == 0,
        "the copy landed before the generation passed ({:?}): proves nothing",
        started.elapsed()
    );
    let settle = Duration::from_millis(500);
    until_delivered(proxy, 0, Instant::now() + 10 * SEC, settle).await;
    let again = here.wait(name, 2, "b", SEC).await;
    assert!(
        matches!(again, Err(coord_core::Error::Timeout { .. })),
        "b passed a barrier of 2 alone: the late copy of a-late's withdrawn arrival, \
         landing after its generation {gb} completed, counted in the next: {again:?}"
    );
}

/// 2 parties: q waits (through `direct`); p's arrival (through `via`) is
/// held in the network 3 s and its connection cut, so the wait sends it
/// again (the same arrival) on a new connection, and p and q pass that
/// generation; they pass the next one too. Then the held copy lands, in
/// a generation neither has arrived at. It must count nowhere: q, alone,
/// must not pass (p's old arrival would make it the second party). A
/// round whose copy landed before the second generation passed (a loaded
/// machine) proves nothing and is tried again on a fresh name, up to 3
/// times. `name` must not contain `p-old`.
pub async fn late_copy_of_an_arrival_that_passed(
    via: &coord_core::Coord,
    direct: &coord_core::Coord,
    proxy: &FaultProxy,
    name: &str,
) {
    let (far, here) = (via.barriers().unwrap(), direct.barriers().unwrap());
    let round = |here: coord_core::Barriers, name: String| {
        tokio::spawn(async move { here.wait(&name, 2, "q", 10 * SEC).await })
    };
    for attempt in 0..ROUNDS {
        let name = match attempt {
            0 => name.to_string(),
            n => format!("{name}-again-{n}"),
        };
        let (held_before, delivered_before) = (proxy.held(), proxy.delivered());
        warm(&far, &name).await;
        let q = round(here.clone(), name.clone());
        tokio::time::sleep(Duration::from_millis(200)).await;
        hold_next_naming_for(proxy, "p-old", 3 * SEC);
        let held_at = Instant::now();
        let first = far.wait(&name, 2, "p-old", 10 * SEC).await.unwrap();
        assert_eq!(q.await.unwrap().unwrap(), first);
        assert_eq!(proxy.held() - held_before, 1, "the arrival was held");
        let q = round(here.clone(), name.clone());
        let second = far.wait(&name, 2, "p-old", 10 * SEC).await.unwrap();
        assert_eq!(q.await.unwrap().unwrap(), second);
        assert!(second > first);
        if proxy.delivered() > delivered_before {
            eprintln!(
                "the held copy landed before the second round ended ({:?} after it was held): \
                 again on a fresh name",
                held_at.elapsed()
            );
            continue;
        }
        let settle = Duration::from_millis(300);
        until_delivered(proxy, delivered_before, held_at + 6 * SEC, settle).await;
        let alone = here.wait(&name, 2, "q", SEC).await;
        assert!(
            matches!(alone, Err(coord_core::Error::Timeout { .. })),
            "a barrier of 2 passed with 1 participant (the late copy of an arrival that had \
             passed counted again): {alone:?}"
        );
        return;
    }
    panic!("{ROUNDS} rounds, each with the held copy landing before its second generation passed");
}
