//! Late and dropped pops of a queue that delivers a message once, a late
//! push, and late copies of a delivery's extends.

use std::time::{Duration, Instant};

use super::{DELAY, before_the_copy, hold_next_naming, until_answered, until_reconnected};
use crate::testkit::proxy::FaultProxy;

/// A queue whose messages may be delivered once (`max_deliveries(1)`): a
/// pop through `via` (call timeout well under a second) is held in the
/// network 2.5 s, so it fails; then its copy lands. The message must not
/// go to that attempt's consumer, whom nobody holds (where it would stay
/// for the 30 s visibility and then be dead-lettered, never seen): a
/// consumer through `direct` gets it within 10 s (the abandoned attempt's
/// give-back runs in the background), well before the visibility would
/// give it back, as its first delivery. `name` must not contain
/// `pop-late`.
pub async fn late_pop_with_one_delivery_allowed(
    via: &coord_core::Coord,
    direct: &coord_core::Coord,
    proxy: &FaultProxy,
    name: &str,
) {
    use coord_core::{Lane, QueueConfig};
    const SEC: Duration = Duration::from_secs(1);
    let once = QueueConfig::default().max_deliveries(1);
    let far = via.queues().unwrap().with_config(once);
    let here = direct.queues().unwrap().with_config(once);
    let queue = format!("{name}-pop-late");
    // Warm the slow client's connection, so the held pop is one request:
    // a read, tried again until answered (one may miss a short call
    // timeout on a loaded machine; a read changes nothing).
    let warm = format!("{name}-warm");
    until_answered(Instant::now() + 10 * SEC, "the warm-up read", || {
        far.stats(&warm)
    })
    .await;
    let id = here.push(&queue, b"once").await.unwrap();
    proxy.deliver_late(
        |chunk| chunk.windows(8).any(|w| w == b"pop-late"),
        Duration::from_millis(2500),
        Duration::from_millis(300),
    );
    let held_at = Instant::now();
    let first = tokio::time::timeout(2 * SEC, far.pop(&queue, 30 * SEC, Duration::ZERO)).await;
    assert!(
        !matches!(first, Ok(Ok(Some(_)))),
        "the held pop was answered: {first:?}"
    );
    assert_eq!(proxy.held(), 1, "the pop was held");
    while proxy.delivered() < 1 {
        assert!(held_at.elapsed() < 5 * SEC, "never delivered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let the store apply it, so the pop below does not overtake it. The
    // abandon (if it came second) runs in the background: the pop waits
    // for it, far less than the 30 s a delivery to the abandoned attempt
    // would keep the message.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let d = here
        .pop(&queue, 30 * SEC, 10 * SEC)
        .await
        .unwrap()
        .expect("the message went to a consumer nobody holds (a late pop's copy)");
    assert_eq!(d.id(), id);
    assert_eq!(d.attempts(), 1, "a delivery nobody saw was counted");
    d.ack().await.unwrap();
    assert!(
        here.peek(&queue, Lane::Dead, 10).await.unwrap().is_empty(),
        "dead-lettered"
    );
}

/// A push through `via` (call timeout under 2 s) is held in the
/// network 2.5 s and its connection cut after 300 ms, so its caller sees
/// no answer; then the held copy lands. The queue must hold at most one
/// message (one if the push was answered): the push was sent once, and a client that sent it again on a new
/// connection (a cluster client following a dropped connection, say)
/// would have a second copy land beside the held one. Counted through
/// `direct`. `name` must not contain `push-late`.
pub async fn late_push_lands_once(
    via: &coord_core::Coord,
    direct: &coord_core::Coord,
    proxy: &FaultProxy,
    name: &str,
) {
    use coord_core::Lane;
    const SEC: Duration = Duration::from_secs(1);
    let far = via.queues().unwrap();
    let here = direct.queues().unwrap();
    let queue = format!("{name}-push-late");
    let warm = format!("{name}-warm");
    until_answered(Instant::now() + 10 * SEC, "the warm-up read", || {
        far.stats(&warm)
    })
    .await;
    proxy.deliver_late(
        |chunk| chunk.windows(9).any(|w| w == b"push-late"),
        Duration::from_millis(2500),
        Duration::from_millis(300),
    );
    let held_at = Instant::now();
    let first = tokio::time::timeout(2 * SEC, far.push(&queue, b"once")).await;
    assert_eq!(proxy.held(), 1, "the push was held");
    while proxy.delivered() < 1 {
        assert!(held_at.elapsed() < 5 * SEC, "never delivered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let the store apply the copy.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let messages = here.peek(&queue, Lane::Main, 10).await.unwrap();
    assert!(
        messages.len() <= 1,
        "one push, sent once, left {} messages (its call: {first:?}): the client sent the \
         push again after its connection dropped, and both copies landed",
        messages.len()
    );
    if matches!(first, Ok(Ok(_))) {
        assert_eq!(messages.len(), 1, "an answered push left no message");
    }
    here.purge(&queue).await.unwrap();
}

/// A queue whose messages may be delivered once (`max_deliveries(1)`): a
/// pop dropped while its attempt is on its way gives back what the attempt
/// delivered without counting it (nobody saw it), so the next consumer
/// still gets the message, not the dead lane.
pub async fn dropped_pop_with_one_delivery_allowed(c: &coord_core::Coord, name: &str) {
    const SEC: Duration = Duration::from_secs(1);
    let here = c
        .queues()
        .unwrap()
        .with_config(coord_core::QueueConfig::default().max_deliveries(1));
    // A reply can be in by the end of the first poll (the attempt's task
    // ran on another worker at once): then the delivery was the caller's,
    // and dropping it gives it back counted. Such a round is tried again
    // on another queue.
    let mut tries = 0;
    loop {
        tries += 1;
        assert!(tries <= 20, "every pop was answered within its first poll");
        let q = format!("{name}-pop-dropped-{tries}");
        let id = here.push(&q, b"once").await.unwrap();
        let mut pop = Box::pin(here.pop(&q, 30 * SEC, Duration::ZERO));
        // One poll sends the attempt (in a task of its own); the pop is
        // never polled again, so whatever the attempt delivered, its
        // caller never saw. Dropped once the store shows the message in
        // flight.
        if futures::poll!(pop.as_mut()).is_ready() {
            continue;
        }
        let shown = Instant::now() + 5 * SEC;
        let mut delivered = false;
        while Instant::now() < shown {
            if here.stats(&q).await.unwrap().in_flight == 1 {
                delivered = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(delivered, "the attempt never delivered the message");
        drop(pop);
        let deadline = Instant::now() + 5 * SEC;
        let d = loop {
            if let Some(d) = here.pop(&q, 30 * SEC, SEC).await.unwrap() {
                break d;
            }
            assert!(
                Instant::now() < deadline,
                "the dropped pop's delivery never came back"
            );
        };
        assert_eq!(d.id(), id);
        assert_eq!(d.attempts(), 1, "the dropped pop's delivery was counted");
        d.ack().await.unwrap();
        break;
    }
}

/// A consumer (through `via`, behind `proxy`) holds a message for 30 s;
/// its extend of the visibility to 2 s is held in the network past its
/// call (the caller gives up after 10 ms); it extends again, to 30 s, and
/// is answered; then the 2 s extend's copy lands. The store must refuse
/// the copy, as any step of a consumer stamped before one the store
/// already applied: applied, it would end the delivery 2 s after it landed,
/// and another consumer (through `direct`) would get the message while its
/// holder was answered with 30 s. `name` must not contain `ext-late`.
pub async fn late_copy_of_a_delivery_extend_after_a_later_one(
    via: &coord_core::Coord,
    direct: &coord_core::Coord,
    proxy: &FaultProxy,
    name: &str,
) {
    const LONG: Duration = Duration::from_secs(30);
    const SHORT: Duration = Duration::from_secs(2);
    let far = via.queues().unwrap();
    let here = direct.queues().unwrap();
    let queue = format!("{name}-ext-late");
    let id = here.push(&queue, b"held").await.unwrap();
    // `via`'s call timeout is short: on a loaded machine the pop may go
    // unanswered (its delivery is given back), so it is tried again.
    let until = Instant::now() + Duration::from_secs(10);
    let d = until_answered(until, "the pop", || async {
        match far.pop(&queue, LONG, Duration::ZERO).await {
            Ok(Some(d)) => Ok(d),
            Ok(None) => Err("nothing delivered".to_string()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    assert_eq!(d.id(), id);
    hold_next_naming(proxy, &queue);
    let held_at = Instant::now();
    let short = tokio::time::timeout(Duration::from_millis(10), d.extend(SHORT)).await;
    assert!(short.is_err(), "the short extend was answered: {short:?}");
    until_reconnected(held_at).await;
    let deadline = before_the_copy(held_at);
    until_answered(deadline, "the long extend", || async {
        match d.extend(LONG).await {
            Err(e @ coord_core::Error::NotHeld { .. }) => panic!("the consumer lost it: {e}"),
            r => r,
        }
    })
    .await;
    assert!(
        held_at.elapsed() < DELAY,
        "the long extend ended after the short one's copy landed: the round proves nothing"
    );
    // The copy lands at DELAY; applied, the delivery would end SHORT later.
    tokio::time::sleep_until((held_at + DELAY + SHORT + Duration::from_millis(500)).into()).await;
    assert_eq!(proxy.held(), 1, "the short extend was held by the proxy");
    assert_eq!(
        proxy.delivered(),
        1,
        "the short extend's copy was delivered"
    );
    let other = here.pop(&queue, LONG, Duration::ZERO).await.unwrap();
    assert!(
        other.is_none(),
        "another consumer got the message while its holder's extend to 30 s had more than 20 s \
         to run: the late copy of the holder's earlier extend, to 2 s, was applied after it"
    );
    assert_eq!(here.stats(&queue).await.unwrap().in_flight, 1);
    drop(d);
    here.purge(&queue).await.unwrap();
}
