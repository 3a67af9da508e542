//! Steps on a group whose other consumers keep changing it. A step that
//! relies on what they change next loses its transaction to them, tries
//! again on fresh reads and loses again, for as long as they keep going:
//!
//! - the ack of a group's oldest message (its head) names the next
//!   message as the head, and the messages right behind it are the ones
//!   acked next;
//! - a nack without delay made the message its group's lowest ready one
//!   at once, comparing the group's record, which every delivery from the
//!   group changes;
//! - a push that lost its transaction waited before it tried again on the
//!   reads that transaction made, by then out of date.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use conformance::testkit::etcd;
use conformance::testkit::proxy::FaultProxy;
use coord_core::{Delivery, MessageId, PushOptions, QueueConfig, Queues};
use late_support::{SEC, connect, direct, unique, until_seen};

use crate::late_support;

const VIS: Duration = Duration::from_secs(30);

/// A proxy in front of the shared etcd, a client through it (`slow`), one
/// direct (`near`), and `n` messages of group `g` pushed by `near`; the
/// first is delivered to `slow`.
struct Busy {
    proxy: FaultProxy,
    near: Queues,
    ids: Vec<MessageId>,
    first: Delivery,
}

async fn busy(tag: &str, n: usize) -> Busy {
    let prefix = unique(tag);
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let slow = connect(proxy.port(), &prefix, 20 * SEC).await.coord();
    let near = direct(&prefix).await.coord();
    let (slow, near) = (slow.queues().unwrap(), near.queues().unwrap());
    let g = PushOptions::new().group("g");
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(near.push_with("q", format!("m{i}"), &g).await.unwrap().id);
    }
    let first = slow.pop("q", VIS, SEC).await.unwrap().expect("the first");
    assert_eq!(first.id(), ids[0]);
    Busy {
        proxy,
        near,
        ids,
        first,
    }
}

/// The head's ack transaction is held on a slow link while another
/// client acks the two messages right behind it: it lands as sent, with
/// the third message as the group's head, which an ordered consumer then
/// gets (and nothing after it while it is in flight).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heads_ack_lands_although_the_messages_behind_it_were_acked_meanwhile() {
    let Busy {
        proxy,
        near,
        ids,
        first: head,
    } = busy("q-head-ack", 6).await;
    let mut held = Vec::new();
    for want in [ids[1], ids[2]] {
        let d = near
            .pop("q", VIS, SEC)
            .await
            .unwrap()
            .expect("a message behind");
        assert_eq!(d.id(), want);
        held.push(d);
    }
    // Only the head's ack transactions carry the delete of its payload.
    let needle = format!("p/M/{:020}", ids[0].get());
    proxy.watch(needle.as_bytes());
    proxy.slow_requests(needle.as_bytes(), Duration::from_millis(1500));
    let ack = tokio::spawn(async move { head.ack().await });
    // The first is the one-transaction ack of a delivery this client made,
    // which a head's ack cannot take; the second follows the read.
    until_seen(&proxy, 2, "the head's ack").await;
    for d in held {
        d.ack().await.unwrap();
    }
    ack.await.unwrap().expect("the head's ack");
    assert_eq!(
        proxy.seen(),
        2,
        "the head's ack lost its transaction to the acks behind it and sent another"
    );
    proxy.heal();
    let s = near.stats("q").await.unwrap();
    assert_eq!((s.ready, s.in_flight), (3, 0), "{s:?}");
    let ordered = near
        .clone()
        .with_config(QueueConfig::default().ordered_groups(true));
    let next = ordered.pop("q", VIS, SEC).await.unwrap();
    assert_eq!(
        next.as_ref().map(|d| d.id()),
        Some(ids[3]),
        "the group's new head is not delivered to an ordered consumer"
    );
    assert!(
        ordered
            .pop("q", VIS, Duration::ZERO)
            .await
            .unwrap()
            .is_none(),
        "an ordered group delivered a second message while its head is in flight"
    );
    near.purge("q").await.unwrap();
}

/// A nack without delay of a delivery this client made is one
/// transaction, which lands as sent although, while it was held on a slow
/// link, another client took a delivery from the group; the message is
/// then the group's next delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_lands_although_its_group_delivered_meanwhile() {
    let Busy {
        proxy,
        near,
        ids,
        first,
    } = busy("q-nack-busy", 4).await;
    // Every request of the nack names the message's record.
    let needle = format!("m/M/{:020}", ids[0].get());
    proxy.watch(needle.as_bytes());
    proxy.slow_requests(needle.as_bytes(), Duration::from_millis(1500));
    let nack = tokio::spawn(async move { first.nack(Duration::ZERO).await });
    until_seen(&proxy, 1, "the nack").await;
    let second = near.pop("q", VIS, SEC).await.unwrap().expect("the second");
    assert_eq!(second.id(), ids[1]);
    nack.await.unwrap().expect("the nack");
    assert_eq!(
        proxy.seen(),
        1,
        "the nack sent more than its one transaction: it read the group first, or lost to the \
         group's delivery and sent another"
    );
    proxy.heal();
    let again = near
        .pop("q", VIS, SEC)
        .await
        .unwrap()
        .expect("the nacked one");
    assert_eq!(
        (again.id(), again.attempts()),
        (ids[0], 2),
        "the nacked message is not its group's next delivery"
    );
    second.ack().await.unwrap();
    again.ack().await.unwrap();
    near.purge("q").await.unwrap();
}

/// Eight producers push into one group while 12 consumers pop and ack
/// its messages as fast as they come. Each push takes no more than a few
/// rounds of the others' work: a push that lost its transaction retries
/// on the reads that transaction made, and waiting first let the group
/// move on from them, so it lost again, for as long as the others kept
/// going.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_complete_while_others_push_and_work_their_group() {
    const PUSHERS: usize = 8;
    const EACH: usize = 40;
    const OTHERS: usize = 12;
    let prefix = unique("q-pushing");
    let done = Arc::new(AtomicUsize::new(0));
    let mut consumers = Vec::new();
    for _ in 0..OTHERS {
        let c = direct(&prefix).await.coord().queues().unwrap();
        let done = done.clone();
        consumers.push(tokio::spawn(async move {
            while let Some(d) = c
                .pop("q", VIS, Duration::from_millis(500))
                .await
                .expect("pop beside the producers")
            {
                d.ack().await.expect("ack beside the producers");
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    let mut pushers = Vec::new();
    for p in 0..PUSHERS {
        let c = direct(&prefix).await.coord().queues().unwrap();
        let done = done.clone();
        pushers.push(tokio::spawn(async move {
            let mut worst = 0;
            for i in 0..EACH {
                let before = done.load(Ordering::SeqCst);
                let group = PushOptions::new().group("one");
                c.push_with("q", format!("p{p}-{i}"), &group)
                    .await
                    .expect("push beside other producers and consumers");
                worst = worst.max(done.load(Ordering::SeqCst) - before);
                done.fetch_add(1, Ordering::SeqCst);
            }
            worst
        }));
    }
    let mut worst = 0;
    for p in pushers {
        worst = worst.max(p.await.unwrap());
    }
    for c in consumers {
        c.await.unwrap();
    }
    assert!(
        worst <= (OTHERS + PUSHERS) * 8,
        "the others made {worst} pushes and acks during one push: it waited for them to slow down"
    );
    let s = direct(&prefix)
        .await
        .coord()
        .queues()
        .unwrap()
        .stats("q")
        .await
        .unwrap();
    assert_eq!((s.ready, s.delayed, s.in_flight), (0, 0, 0), "{s:?}");
}
