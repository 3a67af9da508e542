//! Ids rise in push order within a group, however slow a push's write:
//! an etcd push takes its id (a revision) in one transaction and writes
//! the message in the next, which may reach etcd after other steps of
//! the group. If the group's order moved on meanwhile (a later message of
//! the group delivered), the write must not land with the id taken
//! before: the message would come after that later one.

use std::time::Duration;

use conformance::testkit::etcd;
use conformance::testkit::proxy::FaultProxy;
use coord_core::PushOptions;
use late_support::{SEC, connect, direct, unique, until_seen};

use crate::late_support;

const VIS: Duration = Duration::from_secs(30);

/// A push whose write is held on a slow link while, on another client,
/// the group's ready message is delivered, a later message of the group
/// is pushed and delivered, and the first is given back (ready again, as
/// it was when the slow push read the group): the slow push's message
/// lands with an id above the later one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_push_lands_behind_the_messages_of_its_group_delivered_meanwhile() {
    let prefix = unique("q-push-order");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let slow = connect(proxy.port(), &prefix, 20 * SEC).await.coord();
    let near = direct(&prefix).await.coord();
    let (slow, near) = (slow.queues().unwrap(), near.queues().unwrap());
    let g = PushOptions::new().group("g");
    let first = near.push_with("q", b"first", &g).await.unwrap().id;
    // Only the slow push's write carries its payload.
    proxy.watch(b"slow-push-payload");
    proxy.slow_requests(b"slow-push-payload", Duration::from_millis(1500));
    let task = {
        let g = g.clone();
        tokio::spawn(async move { slow.push_with("q", b"slow-push-payload", &g).await })
    };
    until_seen(&proxy, 1, "the slow push's write").await;
    let d1 = near
        .pop("q", VIS, SEC)
        .await
        .unwrap()
        .expect("the first message");
    assert_eq!(d1.id(), first);
    let later = near.push_with("q", b"later", &g).await.unwrap().id;
    let d2 = near
        .pop("q", VIS, SEC)
        .await
        .unwrap()
        .expect("the later message");
    assert_eq!(
        d2.id(),
        later,
        "the slow push landed before its write was let through"
    );
    d1.nack(Duration::ZERO).await.unwrap();
    let pushed = task.await.unwrap().unwrap();
    assert!(
        pushed.id > later,
        "the slow push landed with id {} behind message {} of its group, delivered \
         before it landed",
        pushed.id.get(),
        later.get()
    );
    d2.ack().await.unwrap();
    near.purge("q").await.unwrap();
}
