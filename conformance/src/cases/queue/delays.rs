//! Delays: a message nacked with a delay, or pushed with one, is not
//! delivered before it; an empty pop says when something comes due.

use std::time::Duration;

use coord_core::{Lane, NewMessage, OwnerToken, PopAttempt, PushOptions, QueueConfig};
use tokio::time::Instant;

use super::{CLOCK_SLACK, LONG, queues};
use crate::{Factory, unique};

/// `nack(delay)` gives the message back: not deliverable before the delay,
/// then delivered again (to a waiter polling only every 10 s) with its
/// attempt count kept and raised. A zero-delay nack is deliverable at once.
pub async fn queue_nack_with_delay_redelivers_after_the_delay(f: &Factory) {
    let c = f.client().await.with_poll_interval(Duration::from_secs(10));
    let Some(q) = queues(&c) else {
        return;
    };
    let name = unique("q-nack");
    q.push(&name, b"x").await.unwrap();
    let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    d.nack(Duration::ZERO).await.unwrap();
    let d = q
        .pop(&name, LONG, Duration::ZERO)
        .await
        .unwrap()
        .expect("a zero-delay nack is deliverable at once");
    assert_eq!(d.attempts(), 2);
    let delay = Duration::from_millis(1200);
    // The delay runs from when the store took the nack: after `start`,
    // before `nacked`. "Not yet" holds for checks answered before `start`
    // + delay; one answered later may rightly see the message back.
    let start = Instant::now();
    d.nack(delay).await.unwrap();
    let nacked = Instant::now();
    let early = q.pop(&name, LONG, Duration::ZERO).await.unwrap();
    let d = match early {
        Some(d) => {
            assert!(
                start.elapsed() >= delay,
                "delivered again {:?} after a nack delayed {delay:?}",
                start.elapsed()
            );
            d
        }
        None => {
            let s = q.stats(&name).await.unwrap();
            if start.elapsed() < delay {
                assert_eq!((s.ready, s.delayed, s.in_flight), (0, 1, 0), "{s:?}");
            } else {
                assert!(
                    [(0, 1, 0), (1, 0, 0)].contains(&(s.ready, s.delayed, s.in_flight)),
                    "{s:?}"
                );
            }
            q.pop(&name, LONG, Duration::from_secs(10))
                .await
                .unwrap()
                .expect("delivered again after the nack's delay")
        }
    };
    let (waited, since_nacked) = (start.elapsed(), nacked.elapsed());
    assert!(
        waited + Duration::from_millis(50) >= delay,
        "delivered {waited:?} after a nack delayed {delay:?}"
    );
    assert!(
        since_nacked <= delay + Duration::from_secs(2),
        "only after {since_nacked:?}"
    );
    assert_eq!(d.attempts(), 3);
    d.ack().await.unwrap();
}

/// A delayed push is not deliverable before its delay, is counted as
/// delayed, and is delivered then (to a waiter polling every 10 s); a
/// message pushed later without delay is delivered first.
pub async fn queue_delayed_push_is_not_visible_early(f: &Factory) {
    let c = f.client().await.with_poll_interval(Duration::from_secs(10));
    let Some(q) = queues(&c) else {
        return;
    };
    let name = unique("q-delay");
    let delay = Duration::from_millis(1200);
    // The delay runs from when the store took the push: after `start`,
    // before `pushed`. "Not yet" holds for checks answered before `start`
    // + delay; one answered later may rightly see the message ready.
    let start = Instant::now();
    let late = q
        .push_with(&name, b"late", &PushOptions::new().delay(delay))
        .await
        .unwrap();
    let pushed = Instant::now();
    let now = q.push(&name, b"now").await.unwrap();
    assert!(late.id < now, "ids rise in push order");
    let s = q.stats(&name).await.unwrap();
    if start.elapsed() < delay {
        assert_eq!((s.ready, s.delayed), (1, 1), "{s:?}");
    } else {
        assert!([(1, 1), (2, 0)].contains(&(s.ready, s.delayed)), "{s:?}");
    }
    let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    let d = if d.id() == now {
        d.ack().await.unwrap();
        q.pop(&name, LONG, Duration::from_secs(10))
            .await
            .unwrap()
            .expect("the delayed message after its delay")
    } else {
        // Once its delay is over the delayed message, pushed first, may
        // rightly come first.
        assert!(
            start.elapsed() >= delay,
            "the delayed message was delivered early ({:?} after its push was sent)",
            start.elapsed()
        );
        let n = q.pop(&name, LONG, Duration::ZERO).await.unwrap();
        let n = n.expect("the message pushed without delay");
        assert_eq!(n.id(), now);
        n.ack().await.unwrap();
        d
    };
    let (waited, since_pushed) = (start.elapsed(), pushed.elapsed());
    assert_eq!(d.id(), late.id);
    assert!(
        waited + Duration::from_millis(50) >= delay,
        "a message delayed {delay:?} was delivered after {waited:?}"
    );
    assert!(
        since_pushed <= delay + Duration::from_secs(2),
        "only after {since_pushed:?}"
    );
    d.ack().await.unwrap();
}

/// An empty pop tells its consumer when to look again (raw trait): on a
/// queue with nothing in it, `next_in` is `None` (nothing comes due: a
/// waiter sleeps until it is woken or polls), never zero, which would
/// send a waiter back at once, round trip after round trip, for as long
/// as the queue stays empty. With only a message delayed 5 s, or only one
/// in flight for 5 s, `next_in` is about that long (within the clock
/// slack, and never after it).
pub async fn queue_an_empty_pop_says_when_to_look_again(f: &Factory) {
    let c = f.client().await;
    if queues(&c).is_none() {
        return;
    }
    let raw = c.raw_queue().unwrap();
    let cfg = QueueConfig::default();
    let main = Lane::Main;
    let five = Duration::from_secs(5);
    let empty = |what: &str, a: PopAttempt| match a {
        PopAttempt::Empty { next_in } => next_in,
        other => panic!("{what}: expected an empty pop, got {other:?}"),
    };
    let name = unique("q-next-none");
    let next = empty(
        "an empty queue",
        raw.try_pop(&name, main, &OwnerToken::random(), LONG, &cfg)
            .await
            .unwrap(),
    );
    assert_eq!(next, None, "an empty queue said to look again in {next:?}");

    let near = |what: &str, next: Option<Duration>| {
        let next = next.unwrap_or_else(|| panic!("{what}: no time to look again"));
        assert!(
            next <= five && next + CLOCK_SLACK >= five,
            "{what}: look again in {next:?}, for something 5 s away"
        );
    };
    let name = unique("q-next-delayed");
    raw.push(&name, &NewMessage::new(b"later").delayed(five))
        .await
        .unwrap();
    let next = empty(
        "a queue with a delayed message",
        raw.try_pop(&name, main, &OwnerToken::random(), LONG, &cfg)
            .await
            .unwrap(),
    );
    near("a queue with a message delayed 5 s", next);
    raw.purge(&name).await.unwrap();

    let name = unique("q-next-flight");
    raw.push(&name, &NewMessage::new(b"held")).await.unwrap();
    let held = raw
        .try_pop(&name, main, &OwnerToken::random(), five, &cfg)
        .await
        .unwrap();
    assert!(matches!(held, PopAttempt::Delivered { .. }), "{held:?}");
    let next = empty(
        "a queue with a message in flight",
        raw.try_pop(&name, main, &OwnerToken::random(), LONG, &cfg)
            .await
            .unwrap(),
    );
    near("a queue with a message in flight for 5 s", next);
    raw.purge(&name).await.unwrap();
}
