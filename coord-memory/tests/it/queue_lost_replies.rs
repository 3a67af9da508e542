//! coord-core's queue steps when the store applied a step but its reply
//! was lost, on a backend with scripted faults (`support::faulty`).

use crate::support;
use std::time::Duration;

use support::faulty::{Fault, Faulty};

const S: Duration = Duration::from_secs(1);

/// A pop attempt that delivered on the store but whose reply was lost (a
/// retryable error) is abandoned at once: the message comes back
/// uncounted, so the same pop, still within its wait, gets it as its
/// first delivery, not after the 30 s visibility the lost attempt asked
/// for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pop_whose_reply_was_lost_gives_its_delivery_back_at_once() {
    let f = Faulty::new();
    let q = f.coord(Duration::from_millis(20)).queues().unwrap();
    let id = q.push("jobs", b"x").await.unwrap();
    f.next("queue.try_pop", Fault::LoseReply, 1);
    let d = q
        .pop("jobs", 30 * S, 5 * S)
        .await
        .unwrap()
        .expect("the delivery of the lost reply never came back within the wait");
    assert_eq!(d.id(), id);
    assert_eq!(d.attempts(), 1, "the delivery nobody saw was counted");
    assert_eq!(
        f.calls("queue.abandon"),
        1,
        "the lost attempt was not abandoned"
    );
    assert!(f.calls("queue.try_pop") >= 2);
    d.ack().await.unwrap();
}
