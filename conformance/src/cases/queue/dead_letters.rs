//! Dead letters: `max_deliveries`, the dead lane, peek, redrive and purge.

use std::time::Duration;

use coord_core::{Error, Lane, PopOptions, PushOptions, QueueConfig};
use tokio::time::timeout;

use super::{LONG, queues};
use crate::{Factory, PROMPT, unique};

/// With `max_deliveries = 2`, a message nacked twice goes to the dead lane
/// at its next delivery: peeked there with its attempts, popped from there,
/// and redriven to the main lane with its attempts reset.
pub async fn queue_dead_letters_after_max_deliveries_and_redrive(f: &Factory) {
    let c = f.client().await;
    let Some(q) = queues(&c) else {
        return;
    };
    let q = q.with_config(QueueConfig::default().max_deliveries(2));
    let name = unique("q-dead");
    let id = q.push(&name, b"poison").await.unwrap();
    let ok = q.push(&name, b"fine").await.unwrap();
    let mut enqueued = None;
    for attempt in 1..=2 {
        let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
        assert_eq!((d.id(), d.attempts()), (id, attempt));
        assert_eq!(
            *enqueued.get_or_insert(d.enqueued_at()),
            d.enqueued_at(),
            "a redelivery after a nack changed the message's enqueued_at"
        );
        d.nack(Duration::ZERO).await.unwrap();
    }
    let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(
        d.id(),
        ok,
        "a message delivered max_deliveries times was delivered again"
    );
    d.ack().await.unwrap();
    assert!(q.pop(&name, LONG, Duration::ZERO).await.unwrap().is_none());
    let s = q.stats(&name).await.unwrap();
    assert_eq!((s.ready, s.in_flight, s.dead), (0, 0, 1), "{s:?}");
    let dead = q.peek(&name, Lane::Dead, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].id, dead[0].attempts), (id, 2));
    assert_eq!(dead[0].payload, b"poison");
    assert_eq!(
        Some(dead[0].enqueued_at),
        enqueued,
        "a dead letter lost its enqueue time"
    );

    let opts = PopOptions::new(LONG).lane(Lane::Dead);
    let d = q
        .pop_with(&name, opts)
        .await
        .unwrap()
        .expect("the dead letter");
    assert_eq!(d.id(), id);
    assert_eq!(d.lane(), Lane::Dead);
    assert_eq!(
        q.redrive(&name, 10).await.unwrap(),
        0,
        "an in-flight dead letter was redriven"
    );
    d.nack(Duration::ZERO).await.unwrap();
    assert_eq!(q.redrive(&name, 10).await.unwrap(), 1);
    let s = q.stats(&name).await.unwrap();
    assert_eq!((s.ready, s.dead), (1, 0), "{s:?}");
    let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!((d.id(), d.attempts()), (id, 1), "redrive resets attempts");
    d.ack().await.unwrap();
    assert_eq!(q.stats(&name).await.unwrap(), Default::default());
}

/// Dead letters, peek, redrive and purge by lane and limit. With
/// `max_deliveries = 1`, three messages given back once each move to the
/// dead lane at their next delivery, keeping their group and attempts;
/// `peek` shows the lowest ids first, up to its limit, in flight or not,
/// without claiming them; a dead-lane delivery's token is above every
/// earlier token of the queue (one sequence for both lanes); `redrive`
/// moves at most its limit, lowest ids first; `purge` deletes both lanes,
/// in-flight messages included (their ack is then `NotHeld`); and ids keep
/// rising after a purge.
pub async fn queue_peek_redrive_and_purge_honour_lanes_and_limits(f: &Factory) {
    let Some(q) = queues(&f.client().await) else {
        return;
    };
    let q = q.with_config(QueueConfig::default().max_deliveries(1));
    let name = unique("q-lanes");
    let g = PushOptions::new().group("g");
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(q.push_with(&name, format!("p{i}"), &g).await.unwrap().id);
    }
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap());
    }
    let top = held.iter().map(|d| d.fencing_token()).max().unwrap();
    let peeked = q.peek(&name, Lane::Main, 2).await.unwrap();
    let shown: Vec<_> = peeked.iter().map(|m| (m.id, m.attempts)).collect();
    assert_eq!(
        shown,
        vec![(ids[0], 1), (ids[1], 1)],
        "peek of the main lane, limit 2, while all three are in flight"
    );
    for d in held {
        d.nack(Duration::ZERO).await.unwrap();
    }
    assert!(
        q.pop(&name, LONG, Duration::ZERO).await.unwrap().is_none(),
        "a message delivered max_deliveries times was delivered again"
    );
    let s = q.stats(&name).await.unwrap();
    assert_eq!((s.ready, s.in_flight, s.dead), (0, 0, 3), "{s:?}");
    let dead = q.peek(&name, Lane::Dead, 2).await.unwrap();
    let shown: Vec<_> = dead.iter().map(|m| (m.id, m.attempts)).collect();
    assert_eq!(
        shown,
        vec![(ids[0], 1), (ids[1], 1)],
        "peek of the dead lane, limit 2"
    );
    assert_eq!(
        dead[0].group.as_deref(),
        Some("g"),
        "a dead letter lost its group"
    );
    let d = q
        .pop_with(&name, PopOptions::new(LONG).lane(Lane::Dead))
        .await
        .unwrap()
        .expect("a dead letter (peek must not have claimed it)");
    assert_eq!((d.id(), d.group()), (ids[0], Some("g")));
    assert!(
        d.fencing_token() > top,
        "a dead-lane delivery's token {} is not above the main lane's {top}: \
         both lanes share one sequence",
        d.fencing_token()
    );
    d.nack(Duration::ZERO).await.unwrap();
    assert_eq!(
        q.redrive(&name, 2).await.unwrap(),
        2,
        "redrive with limit 2 of 3 dead letters"
    );
    let back: Vec<_> = q
        .peek(&name, Lane::Main, 10)
        .await
        .unwrap()
        .iter()
        .map(|m| (m.id, m.attempts, m.group.clone()))
        .collect();
    let g = Some("g".to_string());
    assert_eq!(
        back,
        vec![(ids[0], 0, g.clone()), (ids[1], 0, g)],
        "redrive moves the lowest ids first, attempts reset, group kept"
    );
    let s = q.stats(&name).await.unwrap();
    assert_eq!((s.ready, s.dead), (2, 1), "{s:?}");
    let inflight = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!((inflight.id(), inflight.attempts()), (ids[0], 1));
    assert_eq!(
        q.purge(&name).await.unwrap(),
        3,
        "purge counts both lanes, in-flight messages included"
    );
    assert_eq!(q.stats(&name).await.unwrap(), Default::default());
    assert!(q.peek(&name, Lane::Dead, 10).await.unwrap().is_empty());
    assert!(
        matches!(inflight.extend(LONG).await, Err(Error::NotHeld { .. })),
        "an extend of a purged message must be NotHeld"
    );
    timeout(PROMPT, inflight.lost())
        .await
        .expect("the lost signal of a delivery whose message was purged did not fire");
    assert!(!inflight.is_valid(), "a purged delivery is still valid");
    assert!(
        matches!(inflight.ack().await, Err(Error::NotHeld { .. })),
        "an ack of a purged message must be NotHeld"
    );
    let after = q.push(&name, b"after").await.unwrap();
    assert!(
        after > ids[2],
        "after a purge a push got id {after}, not above the earlier {}: ids rise in push order",
        ids[2]
    );
    assert_eq!(q.purge(&name).await.unwrap(), 1);
}
