//! Wake-ups: a blocked pop is woken by a push, a nack, a dropped delivery,
//! an ack of an ordered group's head, a redrive, and a delay ending.

use std::future::Future;
use std::time::Duration;

use coord_core::{Delivery, Lane, PopOptions, PushOptions, QueueConfig, Queues};
use tokio::time::{Instant, sleep, timeout};

use super::{LONG, queues};
use crate::{Factory, WOKEN, unique, wake_poll};

/// A pop blocked on an empty queue (polling at [`wake_poll`]) is woken by
/// a push from another client within [`WOKEN`] of the push's reply.
pub async fn queue_blocked_pop_is_woken_by_a_push(f: &Factory) {
    let waiter = f.client().await;
    let waiter = waiter.clone().with_poll_interval(wake_poll(&waiter));
    let pusher = f.client().await;
    let (Some(qw), Some(qp)) = (queues(&waiter), pusher.queues().ok()) else {
        return;
    };
    let name = unique("q-wake");
    let n2 = name.clone();
    let task = tokio::spawn(async move {
        let d = qw.pop(&n2, LONG, Duration::from_secs(8)).await;
        (Instant::now(), d)
    });
    sleep(Duration::from_millis(500)).await;
    qp.push(&name, b"wake").await.unwrap();
    // From the push's reply: its round trip is not the pop's delay.
    let pushed_at = Instant::now();
    let (got_at, d) = timeout(Duration::from_secs(9), task)
        .await
        .expect("the pop returned")
        .unwrap();
    let d = d.unwrap().expect("the pushed message");
    let took = got_at.saturating_duration_since(pushed_at);
    assert!(
        took <= WOKEN,
        "a blocked pop got the push after {took:?}: not woken by the store"
    );
    d.ack().await.unwrap();
}

/// Start a pop of `name` on `waiter` (waiting up to 8 s), let it settle
/// into its sleep, run `act`, and return the delivery the pop got. It must
/// come within [`WOKEN`] of `act` finishing (of `due` after it, for a
/// message that is not deliverable before `due`), and not before `due`.
async fn woken_by<Fut: Future<Output = ()>>(
    waiter: &Queues,
    name: &str,
    what: &str,
    due: Duration,
    act: Fut,
) -> Delivery {
    woken_on(waiter, name, Lane::Main, what, due, act).await
}

/// [`woken_by`], the pop on `lane`.
async fn woken_on<Fut: Future<Output = ()>>(
    waiter: &Queues,
    name: &str,
    lane: Lane,
    what: &str,
    due: Duration,
    act: Fut,
) -> Delivery {
    let (qw, n) = (waiter.clone(), name.to_string());
    let opts = PopOptions::new(LONG)
        .lane(lane)
        .wait(Duration::from_secs(8));
    let task = tokio::spawn(async move {
        let d = qw.pop_with(&n, opts).await;
        (Instant::now(), d)
    });
    sleep(Duration::from_millis(500)).await;
    let before = Instant::now();
    act.await;
    // `act`'s own round trips are not the pop's delay: timed from its end.
    let at = Instant::now();
    let (got_at, d) = timeout(Duration::from_secs(9), task)
        .await
        .expect("the pop returned")
        .unwrap();
    let d = d
        .unwrap()
        .unwrap_or_else(|| panic!("after {what}, a waiting pop got nothing"));
    let (since_before, took) = (
        got_at.saturating_duration_since(before),
        got_at.saturating_duration_since(at),
    );
    assert!(
        since_before + Duration::from_millis(50) >= due,
        "after {what}, a waiting pop got the message {since_before:?} later, before it was due ({due:?})"
    );
    assert!(
        took <= due + WOKEN,
        "after {what}, a waiting pop got the message only {took:?} later (due after {due:?}): \
         not woken by the store"
    );
    d
}

/// A pop blocked on a queue whose only message is in flight, held back or
/// dead (polling at [`wake_poll`]) is woken within [`WOKEN`] when the
/// message is given back with `nack`, when its delivery is dropped (given
/// back in the background), when the head of its ordered group is acked,
/// and when it is redriven; and gets a message pushed with a delay while
/// it waits when the delay is over (not at its next poll).
pub async fn queue_blocked_pop_is_woken_by_nack_drop_ack_and_redrive(f: &Factory) {
    let a = f.client().await;
    let b = f.client().await;
    let b = b.clone().with_poll_interval(wake_poll(&b));
    let (Some(qa), Some(qb)) = (queues(&a), b.queues().ok()) else {
        return;
    };
    let name = unique("q-wake-nack");
    qa.push(&name, b"job").await.unwrap();
    let held = qa.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    let d = woken_by(&qb, &name, "a nack", Duration::ZERO, async move {
        held.nack(Duration::ZERO).await.unwrap()
    })
    .await;
    assert_eq!(d.attempts(), 2);
    let d = woken_by(
        &qb,
        &name,
        "dropping the delivery",
        Duration::ZERO,
        async move { drop(d) },
    )
    .await;
    assert_eq!(d.attempts(), 3);
    d.ack().await.unwrap();

    let ordered = QueueConfig::default().ordered_groups(true);
    let (qa_o, qb_o) = (
        qa.clone().with_config(ordered),
        qb.clone().with_config(ordered),
    );
    let name = unique("q-wake-ordered");
    let g = PushOptions::new().group("g");
    qa_o.push_with(&name, b"g1", &g).await.unwrap();
    let g2 = qa_o.push_with(&name, b"g2", &g).await.unwrap().id;
    let head = qa_o
        .pop(&name, LONG, Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    let d = woken_by(
        &qb_o,
        &name,
        "the ack of its ordered group's head",
        Duration::ZERO,
        async move { head.ack().await.unwrap() },
    )
    .await;
    assert_eq!(d.id(), g2);
    d.ack().await.unwrap();

    let qa_dead = qa
        .clone()
        .with_config(QueueConfig::default().max_deliveries(1));
    let name = unique("q-wake-redrive");
    let id = qa_dead.push(&name, b"poison").await.unwrap();
    let d = qa_dead
        .pop(&name, LONG, Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    d.nack(Duration::ZERO).await.unwrap();
    assert!(
        qa_dead
            .pop(&name, LONG, Duration::ZERO)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(qa.stats(&name).await.unwrap().dead, 1);
    let (qa2, n2) = (qa.clone(), name.clone());
    let d = woken_by(&qb, &name, "a redrive", Duration::ZERO, async move {
        assert_eq!(qa2.redrive(&n2, 10).await.unwrap(), 1)
    })
    .await;
    assert_eq!((d.id(), d.attempts()), (id, 1));
    d.ack().await.unwrap();

    let name = unique("q-wake-delayed");
    let delay = Duration::from_millis(1200);
    let (qa2, n2) = (qa.clone(), name.clone());
    let d = woken_by(&qb, &name, "a delayed push", delay, async move {
        qa2.push_with(&n2, b"later", &PushOptions::new().delay(delay))
            .await
            .unwrap();
    })
    .await;
    assert_eq!(d.payload(), b"later");
    d.ack().await.unwrap();
}

/// A pop blocked on the dead lane of a queue (polling at [`wake_poll`])
/// is woken within [`WOKEN`] when a consumer's pop moves a message there
/// (delivered as often as the queue allows) and finds nothing else.
pub async fn queue_blocked_pop_of_the_dead_lane_is_woken_by_a_dead_lettering(f: &Factory) {
    let a = f.client().await;
    let b = f.client().await;
    let b = b.clone().with_poll_interval(wake_poll(&b));
    let (Some(qa), Some(qb)) = (queues(&a), b.queues().ok()) else {
        return;
    };
    let once = QueueConfig::default().max_deliveries(1);
    let qa = qa.with_config(once);
    let name = unique("q-wake-dead");
    let id = qa.push(&name, b"poison").await.unwrap();
    let d = qa.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    d.nack(Duration::ZERO).await.unwrap();
    let (qa2, n2) = (qa.clone(), name.clone());
    let d = woken_on(
        &qb,
        &name,
        Lane::Dead,
        "a dead-lettering",
        Duration::ZERO,
        async move {
            let none = qa2.pop(&n2, LONG, Duration::ZERO).await.unwrap();
            assert!(none.is_none(), "delivered past its max deliveries");
        },
    )
    .await;
    assert_eq!((d.id(), d.lane()), (id, Lane::Dead));
    d.ack().await.unwrap();
}
