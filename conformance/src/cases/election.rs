//! Election cases.

use std::time::Duration;

use coord_core::LeaderInfo;
use futures::StreamExt;
use tokio::time::{Instant, sleep, timeout};

use crate::{Factory, PROMPT, WOKEN, expiry_slack, ttl, unique, wake_poll};

const LONG: Duration = Duration::from_secs(30);

/// Of 8 candidates campaigning at once exactly one wins, and `leader()`
/// names it with its term.
pub async fn election_one_winner_among_eight(f: &Factory) {
    if crate::cases::offered(f.client().await.elections()).is_none() {
        return;
    }
    let name = unique("elect");
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(8));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let c = f.client().await;
        let (n, b) = (name.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            b.wait().await;
            let l = c
                .elections()
                .unwrap()
                .try_campaign(&n, &format!("node-{i}"), LONG)
                .await
                .unwrap();
            (i, l)
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        let (i, l) = t.await.unwrap();
        if let Some(l) = l {
            winners.push((i, l));
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "expected exactly one winner, got {}",
        winners.len()
    );
    let (i, l) = winners.pop().unwrap();
    assert_eq!(l.candidate(), format!("node-{i}"));
    let seen = f
        .client()
        .await
        .elections()
        .unwrap()
        .leader(&name)
        .await
        .unwrap();
    assert_eq!(
        seen,
        Some(LeaderInfo {
            candidate: format!("node-{i}"),
            term: l.term()
        }),
        "leader() must name the winner"
    );
    l.resign().await.unwrap();
}

/// Resigning elects a waiting candidate promptly (within [`WOKEN`] of the
/// resign's reply, polling at [`wake_poll`]), with a higher term.
pub async fn election_resign_elects_another_with_higher_term(f: &Factory) {
    if crate::cases::offered(f.client().await.elections()).is_none() {
        return;
    }
    let a = f.client().await;
    let b = f.client().await;
    let poll = wake_poll(&b);
    let b = b.with_poll_interval(poll);
    let name = unique("resign");
    let la = a
        .elections()
        .unwrap()
        .campaign(&name, "a", LONG, Duration::ZERO)
        .await
        .unwrap();
    let n2 = name.clone();
    let tb = tokio::spawn(async move {
        let l = b
            .elections()
            .unwrap()
            .campaign(&n2, "b", LONG, Duration::from_secs(20))
            .await;
        (Instant::now(), l)
    });
    sleep(Duration::from_millis(1500)).await;
    let term_a = la.term();
    la.resign().await.unwrap();
    // From the resign's reply: its round trip is not b's delay.
    let resigned_at = Instant::now();
    let (at, lb) = tb.await.unwrap();
    let lb = lb.expect("b must be elected after a resigns");
    let lag = at.saturating_duration_since(resigned_at);
    assert!(
        lag <= WOKEN,
        "b elected {lag:?} after resign (poll {poll:?}): not woken by the store"
    );
    assert!(lb.term() > term_a, "term must rise");
    let seen = a.elections().unwrap().leader(&name).await.unwrap().unwrap();
    assert_eq!(seen.candidate, "b");
    lb.resign().await.unwrap();
}

/// A leader that stops renewing is replaced within TTL + 1 s of its
/// campaign's reply (plus the store's expiry slack).
pub async fn election_dead_leader_is_replaced_within_ttl(f: &Factory) {
    if crate::cases::offered(f.client().await.elections()).is_none() {
        return;
    }
    let (a, b) = (f.client().await, f.client().await);
    let name = unique("dead-leader");
    let t = ttl(&a, Duration::from_secs(1));
    // a's term runs from when the store granted it, before the reply: the
    // bound is timed from the reply (later than the grant, never earlier).
    let la = a
        .elections()
        .unwrap()
        .campaign(&name, "a", t, Duration::ZERO)
        .await
        .unwrap();
    let start = Instant::now();
    let lb = b
        .elections()
        .unwrap()
        .campaign(&name, "b", LONG, t + Duration::from_secs(5))
        .await
        .expect("dead leader never replaced");
    let took = start.elapsed();
    // etcd frees an expired lease up to `expiry_slack` after its TTL.
    let slack = expiry_slack(&a);
    assert!(
        took <= t + slack + PROMPT,
        "replaced after {took:?}, TTL {t:?}, expiry slack {slack:?}"
    );
    assert!(lb.term() > la.term());
    drop(la);
    lb.resign().await.unwrap();
}

/// `observe` sees every change, in order, terms never going back.
pub async fn election_observe_sees_every_change_in_order(f: &Factory) {
    if crate::cases::offered(f.client().await.elections()).is_none() {
        return;
    }
    let watcher = f.client().await;
    let name = unique("observe");
    let mut stream = Box::pin(watcher.elections().unwrap().observe(&name).unwrap());
    let first = timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("observe yields the current state")
        .unwrap()
        .unwrap();
    assert_eq!(first, None, "nobody leads yet");
    let mut last_term = None;
    for who in ["a", "b", "c"] {
        let c = f.client().await;
        let l = c
            .elections()
            .unwrap()
            .campaign(&name, who, LONG, Duration::from_secs(10))
            .await
            .unwrap();
        // Wait until the observer reports this leader; anything before it
        // must be a vacancy (never an older term).
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let item = timeout(deadline - Instant::now(), stream.next())
                .await
                .unwrap_or_else(|_| panic!("observer never saw leader {who}"))
                .unwrap()
                .unwrap();
            match item {
                None => continue,
                Some(info) => {
                    if let Some(prev) = last_term {
                        assert!(
                            info.term > prev,
                            "term went back: {} after {prev}",
                            info.term
                        );
                    }
                    last_term = Some(info.term);
                    if info.candidate == who {
                        assert_eq!(info.term, l.term());
                        break;
                    }
                    panic!("observer saw {info:?} while {who} leads");
                }
            }
        }
        l.resign().await.unwrap();
    }
}

/// `with_leadership` keeps the leadership alive by default: work that runs
/// three TTLs stays leader throughout (the others see it, with the term
/// the work was given), and it resigns when the work returns, so another
/// candidate is elected at once with a higher term.
pub async fn election_with_leadership_renews_while_work_runs_then_resigns(f: &Factory) {
    if crate::cases::offered(f.client().await.elections()).is_none() {
        return;
    }
    let (a, b) = (f.client().await, f.client().await);
    let name = unique("with-leadership");
    // Renewed every third of t, an unresigned leadership would last 2/3 of
    // t past the work's end: with t = 4 s, a next candidate elected within
    // 2 s of asking was let in by the resign, and a loaded machine has 2 s
    // for the resign and the campaign (with 1.5 s, 1 s for both).
    let t = ttl(&a, Duration::from_secs(4));
    let elected_within = Duration::from_secs(2);
    let observer = b.elections().unwrap();
    let term = a
        .elections()
        .unwrap()
        .with_leadership(&name, "worker-a", t, Duration::ZERO, |leader| {
            let (observer, name) = (observer.clone(), name.clone());
            async move {
                let end = Instant::now() + t * 3;
                while Instant::now() < end {
                    let seen = observer.leader(&name).await.unwrap();
                    assert_eq!(
                        seen.as_ref().map(|l| (l.candidate.as_str(), l.term)),
                        Some(("worker-a", leader.fencing_token())),
                        "the leadership lapsed while its work ran"
                    );
                    sleep(t / 4).await;
                }
                leader.fencing_token()
            }
        })
        .await
        .expect("the work ran as leader to its end");
    let next = timeout(
        elected_within,
        b.elections()
            .unwrap()
            .campaign(&name, "worker-b", t, Duration::from_secs(30)),
    )
    .await
    .expect("the next candidate is elected at once: the leadership was resigned")
    .unwrap();
    assert!(next.term() > term, "{:?} after {term:?}", next.term());
    next.resign().await.unwrap();
}

/// `force_resign` ends a leadership whoever holds it: a waiting candidate
/// is elected promptly with a higher term, the old leader's renewal is
/// refused, and forcing a vacant office ends nothing.
pub async fn election_force_resign_elects_the_next_candidate(f: &Factory) {
    let (a, b, op) = (f.client().await, f.client().await, f.client().await);
    let Some(ops) = crate::cases::offered(op.elections()) else {
        return;
    };
    let name = unique("force-resign");
    let t = ttl(&a, Duration::from_secs(30));
    let leader = a
        .elections()
        .unwrap()
        .campaign(&name, "a", t, Duration::ZERO)
        .await
        .unwrap();
    let waiting = {
        let (e, name) = (b.elections().unwrap(), name.clone());
        tokio::spawn(async move { e.campaign(&name, "b", t, Duration::from_secs(30)).await })
    };
    sleep(Duration::from_millis(100)).await;
    match ops.force_resign(&name).await {
        Ok(ended) => assert!(ended, "a live leadership was there"),
        Err(e @ coord_core::Error::Unsupported { .. }) => {
            eprintln!("skipped: {e}");
            waiting.abort();
            return;
        }
        Err(e) => panic!("force_resign: {e:?}"),
    }
    let started = Instant::now();
    let next = timeout(PROMPT * 5, waiting)
        .await
        .expect("the waiting candidate is elected after the force")
        .unwrap()
        .unwrap();
    println!("force_resign: the next leader in {:?}", started.elapsed());
    assert!(next.term() > leader.term());
    assert!(
        leader.renew(t).await.is_err(),
        "the old leader still renews"
    );
    next.resign().await.unwrap();
    assert!(!ops.force_resign(&name).await.unwrap(), "a vacant office");
}
