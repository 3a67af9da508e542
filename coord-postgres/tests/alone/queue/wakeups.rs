//! Pops blocked on an empty queue are woken by other clients' pushes.

use std::time::{Duration, Instant};

use conformance::testkit::postgres::cluster;
use coord_core::{PushOptions, QueueConfig};

use super::{LONG, backend, unique};

/// A pop blocked on an empty queue (polling every 60 s) is woken by a push
/// from another client; a redrive wakes every waiter of the main lane; an
/// ack of an ordered group's head wakes a waiter for its next message.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn blocked_pops_are_woken_by_other_clients() {
    let _alone = crate::ALONE.lock().await;
    let schema = unique("qwake");
    let waiter = backend(&cluster().url(), &schema, LONG).await;
    let other = backend(&cluster().url(), &schema, LONG).await;
    assert!(waiter.capabilities().notifications);
    let poll = Duration::from_secs(60);
    let qw = waiter.coord().with_poll_interval(poll).queues().unwrap();
    let qo = other.coord().queues().unwrap();
    // From the reply of the call that should wake: a poll (60 s, jittered:
    // 30 s at the soonest) comes after the pops' 20 s wait; a notification
    // within a few seconds however loaded the machine.
    let prompt = Duration::from_secs(3);

    let name = unique("push");
    let (q, n) = (qw.clone(), name.clone());
    let task = tokio::spawn(async move { q.pop(&n, LONG, Duration::from_secs(20)).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    qo.push(&name, b"wake").await.unwrap();
    let pushed = Instant::now();
    let d = task.await.unwrap().unwrap().expect("the pushed message");
    assert!(
        pushed.elapsed() <= prompt,
        "woken {:?} after the push's reply",
        pushed.elapsed()
    );
    d.ack().await.unwrap();

    // Two dead letters, two waiters on one client: a redrive wakes both.
    let name = unique("redrive");
    let dead = qo
        .clone()
        .with_config(QueueConfig::default().max_deliveries(1));
    for p in [b"x", b"y"] {
        dead.push(&name, p).await.unwrap();
        let d = dead
            .pop(&name, LONG, Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        d.nack(Duration::ZERO).await.unwrap();
    }
    assert!(
        dead.pop(&name, LONG, Duration::ZERO)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(qo.stats(&name).await.unwrap().dead, 2);
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (q, n) = (qw.clone(), name.clone());
        tasks.push(tokio::spawn(async move {
            let d = q.pop(&n, LONG, Duration::from_secs(20)).await;
            (d, Instant::now())
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(qo.redrive(&name, 10).await.unwrap(), 2);
    let redriven = Instant::now();
    for t in tasks {
        let (d, woken) = t.await.unwrap();
        let d = d.unwrap().expect("a redriven message");
        assert!(
            woken.saturating_duration_since(redriven) <= prompt,
            "woken {:?} after the redrive's reply",
            woken.saturating_duration_since(redriven)
        );
        d.ack().await.unwrap();
    }

    // Ordered: the group's second message waits for the first's ack.
    let name = unique("ordered");
    let cfg = QueueConfig::default().ordered_groups(true);
    let (ow, oo) = (qw.clone().with_config(cfg), qo.clone().with_config(cfg));
    let g = PushOptions::new().group("g");
    oo.push_with(&name, b"1", &g).await.unwrap();
    let second = oo.push_with(&name, b"2", &g).await.unwrap().id;
    let first = oo.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    let n = name.clone();
    let task = tokio::spawn(async move { ow.pop(&n, LONG, Duration::from_secs(20)).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    first.ack().await.unwrap();
    let acked = Instant::now();
    let d = task
        .await
        .unwrap()
        .unwrap()
        .expect("the group's next message");
    assert_eq!(d.id(), second);
    assert!(
        acked.elapsed() <= prompt,
        "woken {:?} after the ack's reply",
        acked.elapsed()
    );
    d.ack().await.unwrap();
}
