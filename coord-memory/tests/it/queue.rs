//! Work queues on the in-memory backend held to the rule in
//! `coord_core::queue_backend` where `coord-memory/src/queue.rs` (and the
//! `coord_core::queue_state` it runs) could stray from it (ids after a purge, wake-ups for delayed messages, the
//! order of ordered groups), on paused time where timing matters.

use std::time::Duration;

use coord_core::{PushOptions, QueueConfig};
use coord_memory::MemoryBackend;
use tokio::time::Instant;

const S: Duration = Duration::from_secs(1);

/// "Message ids are unique per queue name and rise in push order": a purge
/// deletes the messages and dedup ids, not the id sequence. (Were the ids
/// to restart at 1, a consumer keying its idempotency on the message id
/// would drop the first messages pushed after a purge as already done.)
#[tokio::test(start_paused = true)]
async fn message_ids_keep_rising_after_a_purge() {
    let q = MemoryBackend::coord().queues().unwrap();
    let first = q.push("q", b"a").await.unwrap();
    let second = q.push("q", b"b").await.unwrap();
    assert_eq!(q.purge("q").await.unwrap(), 2);
    let third = q.push("q", b"c").await.unwrap();
    assert!(
        third > second && third > first,
        "after a purge a push got id {third}, not above the earlier {first} and {second}"
    );
}

/// The same after the store swept the idle queue's entry away (every 1024
/// new names a shard drops its idle entries).
#[tokio::test(start_paused = true)]
async fn message_ids_keep_rising_after_the_idle_queue_is_swept() {
    let coord = MemoryBackend::coord();
    let q = coord.queues().unwrap();
    let first = q.push("q", b"a").await.unwrap();
    let d = q.pop("q", 10 * S, Duration::ZERO).await.unwrap().unwrap();
    d.ack().await.unwrap();
    // 40,000 new names: every one of the 32 shards sees well over 1024
    // inserts, so the idle "q" is swept.
    for i in 0..40_000 {
        q.push(&format!("other-{i}"), b"x").await.unwrap();
    }
    let again = q.push("q", b"b").await.unwrap();
    assert!(
        again > first,
        "after its idle entry was swept, \"q\" gave id {again} again (first was {first})"
    );
}

/// A pop waiting on an empty queue (polling every 10 s) gets a message
/// pushed with a delay when the delay is over, not at its next poll: the
/// docs promise that waiting pops "retry when a delayed message ... comes
/// due". (A delayed push that wakes nobody leaves the waiter to learn of
/// it at its poll, 5 to 10 s later.)
#[tokio::test(start_paused = true)]
async fn a_waiting_pop_gets_a_delayed_push_when_it_comes_due() {
    let q = MemoryBackend::coord()
        .with_poll_interval(10 * S)
        .queues()
        .unwrap();
    let q2 = q.clone();
    let start = Instant::now();
    let waiter = tokio::spawn(async move { q2.pop("q", 60 * S, 60 * S).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    q.push_with("q", b"later", &PushOptions::new().delay(S))
        .await
        .unwrap();
    let d = waiter.await.unwrap().unwrap().expect("the delayed message");
    let at = start.elapsed();
    assert!(
        at >= Duration::from_millis(1500) && at <= Duration::from_millis(1600),
        "a message due at 1.5 s reached the waiting pop at {at:?}"
    );
    d.ack().await.unwrap();
}

/// The same for a message given back with a delay while a pop waits: the
/// waiter gets it when the delay is over, not at its next poll.
#[tokio::test(start_paused = true)]
async fn a_waiting_pop_gets_a_message_nacked_with_a_delay_when_it_comes_due() {
    let q = MemoryBackend::coord()
        .with_poll_interval(10 * S)
        .queues()
        .unwrap();
    q.push("q", b"job").await.unwrap();
    let held = q.pop("q", 60 * S, Duration::ZERO).await.unwrap().unwrap();
    let q2 = q.clone();
    let start = Instant::now();
    let waiter = tokio::spawn(async move { q2.pop("q", 60 * S, 60 * S).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    held.nack(S).await.unwrap();
    let d = waiter.await.unwrap().unwrap().expect("the nacked message");
    let at = start.elapsed();
    assert!(
        at >= Duration::from_millis(1500) && at <= Duration::from_millis(1600),
        "a message nacked until 1.5 s reached the waiting pop at {at:?}"
    );
    assert_eq!(d.attempts(), 2);
    d.ack().await.unwrap();
}

/// Ordered groups on paused time: the reference model's exact order for a
/// delayed head (it blocks its group, not the others).
#[tokio::test(start_paused = true)]
async fn ordered_group_waits_for_its_delayed_head() {
    let q = MemoryBackend::coord()
        .queues()
        .unwrap()
        .with_config(QueueConfig::default().ordered_groups(true));
    let a = PushOptions::new().group("a");
    let a1 = q
        .push_with("q", b"a1", &a.clone().delay(S))
        .await
        .unwrap()
        .id;
    let a2 = q.push_with("q", b"a2", &a).await.unwrap().id;
    let b1 = q.push("q", b"b1").await.unwrap();
    let d = q.pop("q", 60 * S, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(d.id(), b1);
    assert!(q.pop("q", 60 * S, Duration::ZERO).await.unwrap().is_none());
    let d1 = q.pop("q", 60 * S, 5 * S).await.unwrap().unwrap();
    assert_eq!(d1.id(), a1);
    assert!(q.pop("q", 60 * S, Duration::ZERO).await.unwrap().is_none());
    d1.ack().await.unwrap();
    let d2 = q.pop("q", 60 * S, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(d2.id(), a2);
    d2.ack().await.unwrap();
    d.ack().await.unwrap();
}

/// The memory store's queue against coord-core's state machine it adapts
/// (`conformance::queue_rule`): the adapter's locking, ids, tokens and
/// lanes add nothing to the rule and lose nothing of it.
#[tokio::test]
async fn deliveries_follow_the_rule_as_the_state_machine_does() {
    let raw = MemoryBackend::coord().raw_queue().unwrap();
    conformance::queue_rule::deliveries_follow_the_state_machine(
        raw,
        coord_core::queue_state::Turns::PerGroup,
        600,
        async |_| {},
    )
    .await;
}

/// Queues are listed while they hold a message, and not once it was acked
/// (the queue's state stays, for its ids; the listing does not show it).
#[tokio::test(start_paused = true)]
async fn a_queue_is_listed_while_it_holds_a_message() {
    use coord_core::Listed;
    let c = MemoryBackend::coord();
    let q = c.queues().unwrap();
    q.push("jobs", b"a").await.unwrap();
    assert_eq!(c.list(Listed::Queue, "", 10).await.unwrap(), ["jobs"]);
    let d = q.pop("jobs", S, Duration::ZERO).await.unwrap().unwrap();
    d.ack().await.unwrap();
    assert!(c.list(Listed::Queue, "", 10).await.unwrap().is_empty());
}

/// Listing a kind whose primitive the `Coord` lacks is `Unsupported`,
/// naming that primitive.
#[tokio::test(start_paused = true)]
async fn listing_a_missing_primitive_names_it() {
    use coord_core::{Error, Listed};
    let c = coord_core::Coord::from_backend(std::sync::Arc::new(MemoryBackend::new()));
    match c.list(Listed::Queue, "", 10).await {
        Err(Error::Unsupported { primitive, .. }) => assert_eq!(primitive, "queues"),
        other => panic!("listing queues without queues: {other:?}"),
    }
}

/// A push wakes a waiter of its own queue, not one of another queue that
/// began waiting first: with a 10 s poll, the pop of `b` gets its message
/// at once.
#[tokio::test(start_paused = true)]
async fn a_push_wakes_a_waiter_of_its_own_queue() {
    let q = MemoryBackend::coord()
        .with_poll_interval(10 * S)
        .queues()
        .unwrap();
    let on_a = tokio::spawn({
        let q = q.clone();
        async move { q.pop("a", S, 30 * S).await }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let on_b = tokio::spawn({
        let q = q.clone();
        async move { q.pop("b", S, 30 * S).await }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    q.push("b", b"m").await.unwrap();
    let got = tokio::time::timeout(S, on_b)
        .await
        .expect("the waiter of b was not woken by the push to b")
        .unwrap()
        .unwrap();
    assert!(got.is_some());
    on_a.abort();
}
