//! Barrier cases.

use std::time::Duration;

use coord_core::{Error, OwnerToken};
use tokio::time::{sleep, timeout};

use crate::{Factory, WOKEN, unique, wake_poll};

const WAIT: Duration = Duration::from_secs(30);

async fn spawn_waiters(
    f: &Factory,
    name: &str,
    parties: u32,
    who: &[&str],
) -> Vec<tokio::task::JoinHandle<coord_core::Result<u64>>> {
    let mut tasks = Vec::new();
    for p in who {
        let c = f.client().await;
        let (n, p) = (name.to_string(), p.to_string());
        tasks.push(tokio::spawn(async move {
            c.barriers().unwrap().wait(&n, parties, &p, WAIT).await
        }));
    }
    tasks
}

/// Nobody passes before the last of N arrives; all pass after.
pub async fn barrier_nobody_passes_before_the_last_arrives(f: &Factory) {
    if crate::cases::offered(f.client().await.barriers()).is_none() {
        return;
    }
    let name = unique("barrier");
    let tasks = spawn_waiters(f, &name, 4, &["w1", "w2", "w3"]).await;
    sleep(Duration::from_millis(800)).await;
    for t in &tasks {
        assert!(
            !t.is_finished(),
            "a participant passed before the last arrived"
        );
    }
    let last = f
        .client()
        .await
        .barriers()
        .unwrap()
        .wait(&name, 4, "w4", WAIT)
        .await
        .unwrap();
    for t in tasks {
        let g = timeout(Duration::from_secs(5), t)
            .await
            .expect("participant not released")
            .unwrap()
            .unwrap();
        assert_eq!(g, last, "all pass in the same generation");
    }
}

/// Arriving twice counts once.
pub async fn barrier_duplicate_arrival_counts_once(f: &Factory) {
    if crate::cases::offered(f.client().await.barriers()).is_none() {
        return;
    }
    let name = unique("barrier-dup");
    let tasks = spawn_waiters(f, &name, 2, &["same", "same"]).await;
    sleep(Duration::from_millis(800)).await;
    for t in &tasks {
        assert!(
            !t.is_finished(),
            "a duplicate arrival completed a 2-party barrier"
        );
    }
    f.client()
        .await
        .barriers()
        .unwrap()
        .wait(&name, 2, "other", WAIT)
        .await
        .unwrap();
    for t in tasks {
        timeout(Duration::from_secs(5), t)
            .await
            .expect("not released")
            .unwrap()
            .unwrap();
    }
}

/// The barrier is reusable: each round is a new generation.
pub async fn barrier_is_reusable_across_generations(f: &Factory) {
    if crate::cases::offered(f.client().await.barriers()).is_none() {
        return;
    }
    let name = unique("barrier-gen");
    let mut last = None;
    for _round in 0..3 {
        let tasks = spawn_waiters(f, &name, 3, &["a", "b", "c"]).await;
        let mut gens = Vec::new();
        for t in tasks {
            gens.push(
                timeout(Duration::from_secs(10), t)
                    .await
                    .expect("round stuck")
                    .unwrap()
                    .unwrap(),
            );
        }
        assert!(
            gens.iter().all(|g| *g == gens[0]),
            "one round, one generation: {gens:?}"
        );
        if let Some(prev) = last {
            assert!(
                gens[0] > prev,
                "generation must advance: {} after {prev}",
                gens[0]
            );
        }
        last = Some(gens[0]);
    }
}

/// A participant that times out is withdrawn: it does not count.
pub async fn barrier_timed_out_participant_is_withdrawn(f: &Factory) {
    if crate::cases::offered(f.client().await.barriers()).is_none() {
        return;
    }
    let name = unique("barrier-timeout");
    let c = f.client().await;
    let e = c
        .barriers()
        .unwrap()
        .wait(&name, 2, "quitter", Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Timeout { .. }),
        "expected Timeout, got {e:?}"
    );
    let e = c
        .barriers()
        .unwrap()
        .wait(&name, 2, "second", Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Timeout { .. }),
        "the timed-out participant still counted: {e:?}"
    );
    let tasks = spawn_waiters(f, &name, 2, &["x"]).await;
    c.barriers()
        .unwrap()
        .wait(&name, 2, "y", WAIT)
        .await
        .unwrap();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
}

/// A different party count for the same name is an error and changes
/// nothing. `p1` (3 parties) arrives first as a rule, `p2` (2 parties)
/// 500 ms later; on a loaded machine `p2`'s arrival may still be recorded
/// first, so the case judges whichever came later: that one is refused
/// at once, the other keeps waiting for its own party count, which the
/// refused arrival did not change.
pub async fn barrier_different_party_count_is_an_error(f: &Factory) {
    if crate::cases::offered(f.client().await.barriers()).is_none() {
        return;
    }
    let name = unique("barrier-parties");
    let first = spawn_waiters(f, &name, 3, &["p1"]).await.remove(0);
    sleep(Duration::from_millis(500)).await;
    let second = spawn_waiters(f, &name, 2, &["p2"]).await.remove(0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !first.is_finished() && !second.is_finished() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "neither of two arrivals with different party counts was refused within 20 s"
        );
        sleep(Duration::from_millis(20)).await;
    }
    // (refused, its participant, still waiting, the waiting one's parties)
    let (refused, who, waiting, parties) = if second.is_finished() {
        (second, "p2", first, 3)
    } else {
        (first, "p1", second, 2)
    };
    let e = refused.await.unwrap().unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument {
                field: "parties",
                ..
            }
        ),
        "expected InvalidArgument(parties) for the later arrival ({who}), got {e:?}"
    );
    // Nothing changed: the barrier still needs its own count (with 2
    // parties, a counted refusal would have let the waiting one pass),
    // and the refused participant arriving again with it counts once.
    sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the rejected arrival counted");
    let again = spawn_waiters(f, &name, parties, &[who]).await;
    sleep(Duration::from_millis(500)).await;
    if parties == 3 {
        assert!(
            !waiting.is_finished() && !again[0].is_finished(),
            "the rejected arrival counted"
        );
        let c = f.client().await;
        c.barriers()
            .unwrap()
            .wait(&name, 3, "p3", WAIT)
            .await
            .unwrap();
    }
    for t in std::iter::once(waiting).chain(again) {
        t.await.unwrap().unwrap();
    }
}

/// Completing a generation wakes its waiters through the store's
/// notification: with polling at [`wake_poll`], every waiter passes
/// within [`WOKEN`] of the last arrival's reply. A store without
/// notifications (`Capabilities::notifications == false`, e.g. PostgreSQL
/// behind PgBouncer without a direct listen URL) polls every 200 ms
/// instead.
pub async fn barrier_completion_wakes_waiters_promptly(f: &Factory) {
    if crate::cases::offered(f.client().await.barriers()).is_none() {
        return;
    }
    let name = unique("barrier-wake");
    let probe = f.client().await;
    let poll = wake_poll(&probe);
    let mut tasks = Vec::new();
    for p in ["w1", "w2"] {
        let c = f.client().await.with_poll_interval(poll);
        let n = name.clone();
        tasks.push(tokio::spawn(async move {
            c.barriers().unwrap().wait(&n, 3, p, WAIT).await
        }));
    }
    // Let both arrive and settle into waiting on the notification.
    sleep(Duration::from_millis(1500)).await;
    let last = f.client().await;
    let g = last
        .barriers()
        .unwrap()
        .wait(&name, 3, "w3", WAIT)
        .await
        .unwrap();
    // From the completing arrival's reply: its own round trip (and, on a
    // loaded machine, its wait to be scheduled) is not the waiters' delay.
    let completed = tokio::time::Instant::now();
    for t in tasks {
        let left = WOKEN.saturating_sub(completed.elapsed());
        let got = timeout(left, t)
            .await
            .unwrap_or_else(|_| {
                panic!("a waiter was not woken within {WOKEN:?} of completion (polling {poll:?})")
            })
            .unwrap()
            .unwrap();
        assert_eq!(got, g);
    }
}

/// An arrival that completed a generation, retried with the same arrival
/// id because its reply was lost, is told that generation completed; it
/// never joins the next generation as a phantom member.
pub async fn barrier_retried_completing_arrival_joins_no_later_generation(f: &Factory) {
    if crate::cases::offered(f.client().await.barriers()).is_none() {
        return;
    }
    let name = unique("barrier-retry");
    let raw = f.client().await.raw_barrier().unwrap();
    let (a1, a2) = (OwnerToken::random(), OwnerToken::random());
    let first = raw.arrive(&name, 2, "p1", &a1).await.unwrap();
    assert!(!first.complete);
    let done = raw.arrive(&name, 2, "p2", &a2).await.unwrap();
    assert!(done.complete && done.generation == first.generation);
    // p2's reply was lost: the core retries with the same arrival id.
    let retry = raw.arrive(&name, 2, "p2", &a2).await.unwrap();
    assert_eq!(
        retry, done,
        "a retried completing arrival was not recognised"
    );
    // The next generation starts empty: one arrival does not complete it.
    let p3 = OwnerToken::random();
    let next = raw.arrive(&name, 2, "p3", &p3).await.unwrap();
    assert!(
        !next.complete,
        "the retry joined the next generation as a phantom member"
    );
    assert!(next.generation > done.generation);
    assert!(
        raw.withdraw(&name, next.generation, "p3", &p3)
            .await
            .unwrap()
    );
    // And through the handle: the same participant's next wait is a new
    // arrival in the new generation.
    let c = f.client().await;
    let tasks = spawn_waiters(f, &name, 2, &["p2"]).await;
    let g = c
        .barriers()
        .unwrap()
        .wait(&name, 2, "p4", WAIT)
        .await
        .unwrap();
    assert!(g > done.generation);
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), g);
    }
}
