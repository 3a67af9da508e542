//! Observing an election: `observe` polls without a subscription, retries
//! unavailable reads and yields broken ones, yields only changes, and
//! never goes back on stale reads.

use crate::support;

use coord_core::{Error, FencingToken, LeaderInfo};
use futures::StreamExt;
use support::faulty::{Fault, Faulty};
use tokio::time::Instant;

use super::{MS, S};

// ---- observing an election ----

fn info(candidate: &str, term: u64) -> Option<LeaderInfo> {
    Some(LeaderInfo {
        candidate: candidate.into(),
        term: FencingToken(term),
    })
}

/// `observe` polls when subscribing is unavailable, and a broken
/// subscription is yielded as an error.
#[tokio::test(start_paused = true)]
async fn observe_polls_without_a_subscription_and_yields_a_broken_one() {
    let f = Faulty::new();
    f.always("election.subscribe", Fault::Unavailable);
    let el = f.coord(100 * MS).elections().unwrap();
    let mut seen = Box::pin(el.observe("obs-poll").unwrap());
    assert_eq!(seen.next().await.unwrap().unwrap(), None);
    let lead = el.campaign("obs-poll", "a", 10 * S, 10 * S).await.unwrap();
    let got = tokio::time::timeout(S, seen.next())
        .await
        .expect("polling saw the leader");
    assert_eq!(got.unwrap().unwrap().unwrap().candidate, "a");
    lead.resign().await.unwrap();

    f.always("election.subscribe", Fault::Broken);
    let mut broken = Box::pin(el.observe("obs-broken").unwrap());
    let e = broken.next().await.unwrap().unwrap_err();
    assert!(matches!(e, Error::Store { .. }), "got {e:?}");
}

/// A retryable leader read is retried quietly (10 ms later); a broken one
/// is yielded as an error and the stream goes on.
#[tokio::test(start_paused = true)]
async fn observe_retries_unavailable_reads_and_yields_broken_ones() {
    let f = Faulty::new();
    let el = f.coord(10 * S).elections().unwrap();
    let lead = el.campaign("obs-read", "a", 60 * S, 10 * S).await.unwrap();
    let mut seen = Box::pin(el.observe("obs-read").unwrap());
    f.next("election.leader", Fault::Unavailable, 2);
    let started = Instant::now();
    let got = seen
        .next()
        .await
        .unwrap()
        .expect("an unavailable read was yielded");
    assert_eq!(got.unwrap().term, lead.term());
    assert_eq!(started.elapsed(), 30 * MS, "retried after 10 then 20 ms");
    f.next("election.leader", Fault::Broken, 1);
    // Nothing changes: the next item is the broken read, at the next poll.
    let e = seen.next().await.unwrap().unwrap_err();
    assert!(matches!(e, Error::Store { .. }), "got {e:?}");
    lead.resign().await.unwrap();
    assert_eq!(seen.next().await.unwrap().unwrap(), None);
}

/// `observe` yields changes only: an unchanged leader is not yielded again
/// at every poll.
#[tokio::test(start_paused = true)]
async fn observe_yields_nothing_while_nothing_changes() {
    let f = Faulty::new();
    let el = f.coord(100 * MS).elections().unwrap();
    let lead = el.campaign("obs-same", "a", 60 * S, 10 * S).await.unwrap();
    let mut seen = Box::pin(el.observe("obs-same").unwrap());
    assert!(seen.next().await.unwrap().unwrap().is_some());
    assert!(
        tokio::time::timeout(5 * S, seen.next()).await.is_err(),
        "an unchanged leader was yielded again"
    );
    assert!(f.calls("election.leader") >= 40, "it did not poll");
    lead.resign().await.unwrap();
}

/// Stale reads (a lagging replica) never make `observe` go back: a lower
/// term is skipped, and so is a term already left (the office fell vacant
/// after it, so it ended for good).
#[tokio::test(start_paused = true)]
async fn observe_never_goes_back_on_stale_reads() {
    let f = Faulty::new();
    let el = f.coord(100 * MS).elections().unwrap();
    let mut seen = Box::pin(el.observe("obs-stale").unwrap());
    f.answer_leader([info("a", 5), info("b", 3), None, info("a", 5), info("c", 7)]);
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(seen.next().await.unwrap().unwrap());
    }
    assert_eq!(got, vec![info("a", 5), None, info("c", 7)]);
}
