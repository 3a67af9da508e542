//! Delays: a message nacked with a delay, or pushed with one, is not
//! delivered before it.

use std::time::Duration;

use coord_core::PushOptions;
use tokio::time::Instant;

use super::{LONG, queues};
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
    let start = Instant::now();
    d.nack(delay).await.unwrap();
    assert!(q.pop(&name, LONG, Duration::ZERO).await.unwrap().is_none());
    let s = q.stats(&name).await.unwrap();
    assert_eq!((s.ready, s.delayed, s.in_flight), (0, 1, 0), "{s:?}");
    let d = q
        .pop(&name, LONG, Duration::from_secs(10))
        .await
        .unwrap()
        .expect("delivered again after the nack's delay");
    let waited = start.elapsed();
    assert!(
        waited + Duration::from_millis(50) >= delay,
        "delivered {waited:?} after a nack delayed {delay:?}"
    );
    assert!(
        waited <= delay + Duration::from_secs(2),
        "only after {waited:?}"
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
    let start = Instant::now();
    let late = q
        .push_with(&name, b"late", &PushOptions::new().delay(delay))
        .await
        .unwrap();
    let now = q.push(&name, b"now").await.unwrap();
    assert!(late.id < now, "ids rise in push order");
    let s = q.stats(&name).await.unwrap();
    assert_eq!((s.ready, s.delayed), (1, 1), "{s:?}");
    let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(d.id(), now, "the delayed message was delivered early");
    d.ack().await.unwrap();
    let d = q
        .pop(&name, LONG, Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the delayed message after its delay");
    let waited = start.elapsed();
    assert_eq!(d.id(), late.id);
    assert!(
        waited + Duration::from_millis(50) >= delay,
        "a message delayed {delay:?} was delivered after {waited:?}"
    );
    assert!(
        waited <= delay + Duration::from_secs(2),
        "only after {waited:?}"
    );
    d.ack().await.unwrap();
}
