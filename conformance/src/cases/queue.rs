//! Work queue cases: at-least-once delivery with visibility timeouts,
//! fenced deliveries, dead letters, dedup, delays and fairness across
//! groups (the rule is in `coord_core::queue_backend`).
//!
//! A store without queues (yet) skips every case here with the reason
//! [`QUEUE_GATE`] on stderr, never a silent pass.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use coord_core::wake::Waiter;
use coord_core::{
    Capabilities, Coord, Delivery, Error, FencedRegister, FencingToken, Lane, Message, MessageId,
    NewMessage, OwnerToken, PopAttempt, PopOptions, PushOptions, Pushed, Queue, QueueConfig,
    QueueStats, Queues, Result, async_trait,
};
use tokio::time::{Instant, sleep, timeout};

use crate::{Factory, PROMPT, ttl, unique};

const LONG: Duration = Duration::from_secs(30);

/// How far a store's clock (which stamps `enqueued_at`) may be from this
/// process's wall clock.
pub const CLOCK_SLACK: Duration = Duration::from_secs(2);

/// Why every queue case skips on a store without work queues.
pub const QUEUE_GATE: &str = "work queue not implemented on this store yet";

/// The client's queues, or `None` (with the reason on stderr) if the store
/// has none yet. Any other error fails the case.
fn queues(c: &Coord) -> Option<Queues> {
    match c.queues() {
        Ok(q) => Some(q),
        Err(Error::Unsupported { backend, .. }) => {
            eprintln!("skipped: {QUEUE_GATE} ({backend})");
            None
        }
        Err(e) => panic!("queues(): expected a handle or Unsupported, got {e:?}"),
    }
}

fn field_of<T: std::fmt::Debug>(r: coord_core::Result<T>, what: &str) -> &'static str {
    match r {
        Err(Error::InvalidArgument { field, .. }) => field,
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    }
}

/// The polling fallback for a case that proves a wake-up: 10 s, or 200 ms
/// on a store without notifications (which then passes on polling).
fn wake_poll(c: &Coord) -> Duration {
    if c.capabilities().notifications {
        Duration::from_secs(10)
    } else {
        Duration::from_millis(200)
    }
}

/// A message for the raw trait: no delay, group or dedup id.
fn raw_message(payload: &[u8]) -> NewMessage<'_> {
    NewMessage {
        payload,
        delay: Duration::ZERO,
        group: None,
        dedup_id: None,
        dedup_window: Duration::ZERO,
    }
}

/// The delivery of a raw `try_pop`, or a panic saying `what` expected one.
fn delivered(attempt: PopAttempt, what: &str) -> (Message, FencingToken) {
    match attempt {
        PopAttempt::Delivered { message, token } => (message, token),
        other => panic!("{what}: expected a delivery, got {other:?}"),
    }
}

/// 300 messages, 16 consumers on their own clients: every message is
/// delivered exactly once (visibility far longer than the work, every
/// delivery acked), every ack succeeds, and the deliveries' fencing tokens
/// are unique. Afterwards the queue holds nothing.
pub async fn queue_each_message_is_delivered_once_among_16_consumers(f: &Factory) {
    const MESSAGES: usize = 300;
    const CONSUMERS: usize = 16;
    let Some(q) = queues(&f.client().await) else {
        return;
    };
    let name = unique("q-once");
    for i in 0..MESSAGES {
        q.push(&name, format!("m{i}")).await.unwrap();
    }
    let mut consumers = Vec::new();
    for _ in 0..CONSUMERS {
        consumers.push(f.client().await.queues().unwrap());
    }
    let seen = Arc::new(Mutex::new(Vec::<(String, FencingToken)>::new()));
    let mut tasks = Vec::new();
    for c in consumers {
        let (name, seen) = (name.clone(), seen.clone());
        tasks.push(tokio::spawn(async move {
            while let Some(d) = c
                .pop(&name, LONG, Duration::from_millis(300))
                .await
                .expect("pop under load")
            {
                assert_eq!(d.attempts(), 1, "a message was delivered a second time");
                let body = String::from_utf8(d.payload().to_vec()).unwrap();
                seen.lock().unwrap().push((body, d.fencing_token()));
                d.ack().await.expect("ack of a live delivery");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    let bodies: HashSet<&String> = seen.iter().map(|(b, _)| b).collect();
    assert_eq!(
        seen.len(),
        MESSAGES,
        "{} deliveries of {MESSAGES} messages",
        seen.len()
    );
    assert_eq!(bodies.len(), MESSAGES, "a message was delivered twice");
    let tokens: HashSet<FencingToken> = seen.iter().map(|(_, t)| *t).collect();
    assert_eq!(
        tokens.len(),
        MESSAGES,
        "two deliveries shared a fencing token"
    );
    let s = q.stats(&name).await.unwrap();
    assert_eq!(
        (s.ready, s.delayed, s.in_flight, s.dead),
        (0, 0, 0, 0),
        "acked messages were left: {s:?}"
    );
}

/// A consumer that crashes mid-task (no ack, no nack): its message is
/// invisible until the visibility lapses, then delivered again to another
/// consumer (waiting, polling only every 10 s) with attempts 2, a higher
/// fencing token and the same `enqueued_at`, which is within the push
/// call's wall-clock window (give or take [`CLOCK_SLACK`] for the store's
/// clock).
pub async fn queue_crashed_consumers_message_is_redelivered_after_visibility(f: &Factory) {
    let a = f.client().await;
    let b = f.client().await.with_poll_interval(Duration::from_secs(10));
    let (Some(qa), Some(qb)) = (queues(&a), b.queues().ok()) else {
        return;
    };
    let name = unique("q-crash");
    let before_push = SystemTime::now();
    qa.push(&name, b"work").await.unwrap();
    let after_push = SystemTime::now();
    let vis = ttl(&a, Duration::from_millis(1500));
    // Before the pop is sent: the visibility runs from when the store
    // made the delivery, which its reply reaches us after (a loaded
    // machine took 125 ms, and the redelivery looked 75 ms early).
    let start = Instant::now();
    let d = qa
        .pop(&name, vis, Duration::ZERO)
        .await
        .unwrap()
        .expect("a message");
    let first_token = d.fencing_token();
    assert_eq!((d.queue(), d.attempts()), (name.as_str(), 1));
    let enqueued = d.enqueued_at();
    assert!(
        enqueued + CLOCK_SLACK >= before_push && enqueued <= after_push + CLOCK_SLACK,
        "enqueued_at {enqueued:?} is not within {CLOCK_SLACK:?} of the push, sent at \
         {before_push:?} and answered at {after_push:?}"
    );
    std::mem::forget(d); // crashed: nothing is sent
    assert!(
        qb.pop(&name, LONG, Duration::ZERO).await.unwrap().is_none(),
        "a message in flight was delivered to a second consumer"
    );
    let again = qb
        .pop(&name, LONG, Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the crashed consumer's message must be delivered again");
    let waited = start.elapsed();
    assert!(
        waited + Duration::from_millis(50) >= vis,
        "redelivered after {waited:?}, before the visibility {vis:?} lapsed"
    );
    assert!(
        waited <= vis + Duration::from_secs(2),
        "redelivered only after {waited:?} (visibility {vis:?})"
    );
    assert_eq!(again.attempts(), 2, "the attempt count must rise");
    assert!(again.fencing_token() > first_token);
    assert_eq!(again.payload(), b"work");
    assert_eq!(
        again.enqueued_at(),
        enqueued,
        "a redelivery changed the message's enqueued_at"
    );
    again.ack().await.unwrap();
}

/// A pop dropped while its attempt is on its way, on a queue that delivers
/// each message once: the next consumer still gets the message (see
/// `late_copy::dropped_pop_with_one_delivery_allowed`).
pub async fn queue_dropped_pop_gives_back_its_delivery_uncounted(f: &Factory) {
    let c = f.client().await;
    if queues(&c).is_none() {
        return;
    }
    crate::late_copy::dropped_pop_with_one_delivery_allowed(&c, &unique("q-dropped")).await;
}

/// A stale consumer (paused past its visibility while the message went to
/// another): its delivery (no watchdog) fires its lost signal by its
/// visibility deadline, never before, and is not valid after; its ack,
/// extend and nack are refused with `NotHeld` and change nothing, and its
/// fenced write is rejected after the new consumer's.
pub async fn queue_stale_consumer_is_refused_and_fenced_out(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let (Some(qa), Some(qb)) = (queues(&a), b.queues().ok()) else {
        return;
    };
    let name = unique("q-stale");
    qa.push(&name, b"job").await.unwrap();
    // Long enough that the pop is answered well within it on a loaded
    // machine (a fresh delivery must be valid).
    let vis = ttl(&a, Duration::from_millis(1500));
    // Before the pop is sent: the store's deadline is at most `vis` after.
    let start = Instant::now();
    let stale = qa.pop(&name, vis, Duration::ZERO).await.unwrap().unwrap();
    let lost = stale.lost_token();
    assert!(
        stale.is_valid() && !lost.is_cancelled(),
        "a fresh delivery is not valid"
    );
    assert!(
        stale.valid_until() <= start + vis,
        "the delivery's local validity ends {:?} after the pop was sent, past its visibility {vis:?}",
        stale.valid_until() - start
    );
    tokio::time::timeout_at(start + vis + PROMPT, stale.lost())
        .await
        .unwrap_or_else(|_| {
            panic!("the lost signal of a delivery whose visibility {vis:?} lapsed did not fire")
        });
    assert!(
        Instant::now() >= stale.valid_until(),
        "the lost signal fired before the delivery's deadline"
    );
    assert!(lost.is_cancelled(), "the lost token was not cancelled");
    assert!(!stale.is_valid(), "a lapsed delivery is still valid");
    let register = FencedRegister::new(0u32);
    assert!(register.write(stale.fencing_token(), 1), "first write");
    let fresh = qb
        .pop(&name, LONG, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("redelivery after the visibility lapsed");
    assert_eq!(fresh.id(), stale.id());
    assert!(fresh.fencing_token() > stale.fencing_token());
    assert!(register.write(fresh.fencing_token(), 2));
    assert!(
        !register.write(stale.fencing_token(), 3),
        "the stale delivery's write was accepted after the fresh one's"
    );
    assert!(
        matches!(stale.extend(LONG).await, Err(Error::NotHeld { .. })),
        "a stale extend must be NotHeld"
    );
    let stale2 = qa.pop(&name, LONG, Duration::ZERO).await.unwrap();
    assert!(
        stale2.is_none(),
        "the fresh delivery's message was delivered again"
    );
    assert!(
        matches!(stale.ack().await, Err(Error::NotHeld { .. })),
        "a stale ack must be NotHeld"
    );
    // The stale ack changed nothing: the message is still in flight to
    // `fresh`, which can extend and ack it.
    let s = qa.stats(&name).await.unwrap();
    assert_eq!(s.in_flight, 1, "a stale ack removed the message: {s:?}");
    fresh
        .extend(LONG)
        .await
        .expect("the fresh delivery extends");
    fresh.ack().await.expect("the fresh delivery acks");
    assert_eq!(qa.stats(&name).await.unwrap().in_flight, 0);
}

/// Deliveries whose visibility lapsed (their consumer paused; nothing was
/// sent), on the raw trait. `stats`, `ack`, `extend` and `nack` are each
/// tried first thing after the lapse, on a queue of their own (a store that
/// notices lapses only when something touches the queue must still get
/// them right): `stats` counts the lapsed delivery ready, not in flight;
/// the others return false and change nothing (the extend resurrects
/// nothing). Each lapsed message is delivered again in its place, before
/// one pushed after it, with attempts 2 and a higher token. While it is in
/// flight to the new consumer, the old owner's calls still change nothing,
/// nor does the new owner's ack on the other lane; the new owner's extend
/// keeps the attempt count (given back, the next delivery has attempts 3).
pub async fn queue_lapsed_delivery_is_refused_and_redelivered_in_place(f: &Factory) {
    let c = f.client().await;
    if queues(&c).is_none() {
        return;
    }
    let raw = c.raw_queue().unwrap();
    let cfg = QueueConfig::default();
    let main = Lane::Main;
    let vis = ttl(&c, Duration::from_millis(800));
    let (a, b, c2) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let names: Vec<String> = ["stats", "ack", "extend", "nack"]
        .iter()
        .map(|op| unique(&format!("q-lapse-{op}")))
        .collect();
    let mut lapsing = Vec::new();
    for name in &names {
        let id = raw.push(name, &raw_message(b"lapsing")).await.unwrap().id;
        raw.push(name, &raw_message(b"later")).await.unwrap();
        let (m, t) = delivered(
            raw.try_pop(name, main, &a, vis, &cfg).await.unwrap(),
            "a first delivery",
        );
        assert_eq!((m.id, m.attempts), (id, 1));
        lapsing.push((id, t));
    }
    sleep(vis + Duration::from_millis(500)).await;
    let s = raw.stats(&names[0]).await.unwrap();
    assert_eq!(
        (s.ready, s.in_flight),
        (2, 0),
        "a delivery whose visibility lapsed still counted as in flight: {s:?}"
    );
    assert!(
        !raw.ack(&names[1], main, lapsing[1].0, &a).await.unwrap(),
        "an ack after the visibility lapsed was accepted"
    );
    assert!(
        !raw.extend(&names[2], main, lapsing[2].0, &a, LONG)
            .await
            .unwrap(),
        "an extend after the visibility lapsed was accepted (it must never resurrect a delivery)"
    );
    assert!(
        !raw.nack(&names[3], main, lapsing[3].0, &a, Duration::from_secs(60))
            .await
            .unwrap(),
        "a nack after the visibility lapsed was accepted"
    );
    let mut again = Vec::new();
    for (name, &(id, t1)) in names.iter().zip(&lapsing) {
        let s = raw.stats(name).await.unwrap();
        assert_eq!(
            (s.ready, s.delayed, s.in_flight),
            (2, 0, 0),
            "after a refused call on a lapsed delivery: {s:?}"
        );
        let (m, t2) = delivered(
            raw.try_pop(name, main, &b, LONG, &cfg).await.unwrap(),
            "the pop after the lapse",
        );
        assert_eq!(
            m.id, id,
            "a lapsed delivery must be delivered again in its place, before later messages"
        );
        assert_eq!(m.attempts, 2, "the lapsed delivery counts as an attempt");
        assert!(t2 > t1, "redelivery token {t2} not above {t1}");
        again.push(t2);
    }
    let (name, first, t2) = (&names[0], lapsing[0].0, again[0]);
    assert!(
        !raw.ack(name, main, first, &a).await.unwrap(),
        "the old owner acked a message in flight to another"
    );
    assert!(
        !raw.nack(name, main, first, &a, Duration::ZERO)
            .await
            .unwrap(),
        "the old owner gave back a message in flight to another"
    );
    assert!(
        !raw.extend(name, main, first, &a, LONG).await.unwrap(),
        "the old owner extended a message in flight to another"
    );
    assert!(
        !raw.ack(name, Lane::Dead, first, &b).await.unwrap(),
        "an ack on the dead lane took a message of the main lane"
    );
    let s = raw.stats(name).await.unwrap();
    assert_eq!(
        (s.ready, s.in_flight),
        (1, 1),
        "refused calls changed the queue: {s:?}"
    );
    assert!(raw.extend(name, main, first, &b, LONG).await.unwrap());
    assert!(
        raw.nack(name, main, first, &b, Duration::ZERO)
            .await
            .unwrap()
    );
    let (m, t3) = delivered(
        raw.try_pop(name, main, &c2, LONG, &cfg).await.unwrap(),
        "the pop after the nack",
    );
    assert_eq!(
        (m.id, m.attempts),
        (first, 3),
        "an extend must not change the attempt count"
    );
    assert!(t3 > t2);
    assert!(raw.ack(name, main, first, &c2).await.unwrap());
    for name in &names {
        assert!(raw.purge(name).await.unwrap() >= 1);
    }
}

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

/// FIFO within a group: one consumer gets a group's messages in push
/// order, each delivery's fencing token above the one before; a message
/// given back keeps its place (delivered again before the group's later
/// messages) and its new token is above every earlier delivery's, other
/// messages' included. With ordered groups, a group's next message is not
/// delivered while its previous one is in flight, nacked with a delay, or
/// pushed with a delay, while another group's is.
pub async fn queue_fifo_within_a_group_and_ordered_groups_one_at_a_time(f: &Factory) {
    let c = f.client().await;
    let Some(q) = queues(&c) else {
        return;
    };
    let name = unique("q-fifo");
    let a = PushOptions::new().group("a");
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(q.push_with(&name, format!("a{i}"), &a).await.unwrap().id);
    }
    let mut got = Vec::new();
    let mut held = Vec::new();
    while let Some(d) = q.pop(&name, LONG, Duration::ZERO).await.unwrap() {
        got.push(d.id());
        held.push(d);
    }
    assert_eq!(got, ids, "a group's messages out of push order");
    let tokens: Vec<FencingToken> = held.iter().map(|d| d.fencing_token()).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens of successive deliveries did not rise: {tokens:?}"
    );
    for d in held {
        d.ack().await.unwrap();
    }

    let name = unique("q-retry");
    let x1 = q.push(&name, b"x1").await.unwrap();
    let x2 = q.push(&name, b"x2").await.unwrap();
    let x3 = q.push(&name, b"x3").await.unwrap();
    let d1 = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    let d2 = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!((d1.id(), d2.id()), (x1, x2));
    let t2 = d2.fencing_token();
    d1.nack(Duration::ZERO).await.unwrap();
    let again = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(
        again.id(),
        x1,
        "a message given back must keep its place, before the group's later messages"
    );
    assert_eq!(again.attempts(), 2);
    assert!(
        again.fencing_token() > t2,
        "a redelivery's token {} is not above the token {t2} of a delivery before it",
        again.fencing_token()
    );
    let d3 = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(d3.id(), x3);
    assert!(d3.fencing_token() > again.fencing_token());
    for d in [again, d2, d3] {
        d.ack().await.unwrap();
    }

    let q = q.with_config(QueueConfig::default().ordered_groups(true));
    let name = unique("q-ordered");
    let a1 = q.push_with(&name, b"a1", &a).await.unwrap().id;
    let a2 = q.push_with(&name, b"a2", &a).await.unwrap().id;
    let b1 = q
        .push_with(&name, b"b1", &PushOptions::new().group("b"))
        .await
        .unwrap()
        .id;
    let first = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(first.id(), a1);
    let second = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(
        second.id(),
        b1,
        "with ordered groups, group a's second message came while its first was in flight"
    );
    assert!(
        q.pop(&name, LONG, Duration::ZERO).await.unwrap().is_none(),
        "group a's second message came while its first was in flight"
    );
    first.nack(Duration::from_millis(600)).await.unwrap();
    assert!(
        q.pop(&name, LONG, Duration::ZERO).await.unwrap().is_none(),
        "group a's second message overtook its first, nacked with a delay"
    );
    let again = q
        .pop(&name, LONG, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the nacked message after its delay");
    assert_eq!(
        again.id(),
        a1,
        "strict FIFO: the nacked message comes first"
    );
    again.ack().await.unwrap();
    let next = q
        .pop(&name, LONG, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("group a's second message after its first was acked");
    assert_eq!(next.id(), a2);
    next.ack().await.unwrap();
    second.ack().await.unwrap();

    // A head pushed with a delay holds its group back too.
    let name = unique("q-ordered-delay");
    let a1 = q
        .push_with(&name, b"a1", &a.clone().delay(Duration::from_millis(1200)))
        .await
        .unwrap()
        .id;
    let a2 = q.push_with(&name, b"a2", &a).await.unwrap().id;
    let b1 = q
        .push_with(&name, b"b1", &PushOptions::new().group("b"))
        .await
        .unwrap()
        .id;
    // b1 now, a1 after its delay, in whichever order they come: never a2
    // before a1 is acked.
    let x = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    let y = q
        .pop(&name, LONG, Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the delayed head after its delay");
    let mut both = [x.id(), y.id()];
    both.sort();
    assert_eq!(
        both,
        [a1, b1],
        "with ordered groups, group a's second message came while its first was still delayed"
    );
    assert!(
        q.pop(&name, LONG, Duration::ZERO).await.unwrap().is_none(),
        "group a's second message came while its delayed head was in flight"
    );
    let (head, other) = if x.id() == a1 { (x, y) } else { (y, x) };
    head.ack().await.unwrap();
    let next = q
        .pop(&name, LONG, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("group a's second message after its head was acked");
    assert_eq!(next.id(), a2);
    next.ack().await.unwrap();
    other.ack().await.unwrap();
}

/// A group that gets its first message after another group has been served
/// for a while joins the round at once, not at turn zero: from then on the
/// two alternate, one message each, instead of the newcomer being served
/// for as long as the other was before it came.
pub async fn queue_a_group_arriving_late_takes_turns_at_once(f: &Factory) {
    let Some(q) = queues(&f.client().await) else {
        return;
    };
    let name = unique("q-late-group");
    let old = PushOptions::new().group("old");
    for i in 0..40 {
        q.push_with(&name, format!("old{i}"), &old).await.unwrap();
    }
    for _ in 0..20 {
        let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
        assert_eq!(d.group(), Some("old"));
        d.ack().await.unwrap();
    }
    let new = PushOptions::new().group("new");
    for i in 0..20 {
        q.push_with(&name, format!("new{i}"), &new).await.unwrap();
    }
    let mut order = Vec::new();
    for _ in 0..20 {
        let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
        order.push(d.group().unwrap_or("").to_string());
        d.ack().await.unwrap();
    }
    assert!(
        order.windows(2).all(|w| w[0] != w[1]),
        "two groups with ready messages were not served one message each: {order:?}"
    );
    assert_eq!(q.purge(&name).await.unwrap(), 20);
}

/// A group that waited on its one in-flight message while another was
/// served many times has no stored-up credit: when it then pushes a
/// backlog, the two alternate (the waiting group gets one delivery first),
/// so the other group's new messages are not held behind a burst as long
/// as the wait.
pub async fn queue_a_group_that_waited_gets_no_burst_of_credit(f: &Factory) {
    const SERVED: usize = 60;
    const SMALL: usize = 10;
    let Some(q) = queues(&f.client().await) else {
        return;
    };
    let name = unique("q-credit");
    let (a, b) = (PushOptions::new().group("a"), PushOptions::new().group("b"));
    q.push_with(&name, b"a-long", &a).await.unwrap();
    // Kept in flight by the watchdog for as long as the case takes (on a
    // loaded 3-node etcd cluster its ~400 steps took longer than 30 s).
    let held = q
        .pop_with(&name, PopOptions::new(LONG).watchdog(true))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(held.group(), Some("a"));
    for i in 0..SERVED {
        q.push_with(&name, format!("b{i}"), &b).await.unwrap();
    }
    for _ in 0..SERVED {
        let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
        d.ack().await.unwrap();
    }
    // Group a (its one message still in flight) now pushes a backlog, then
    // group b a few more.
    for i in 0..SERVED {
        q.push_with(&name, format!("a{i}"), &a).await.unwrap();
    }
    for i in 0..SMALL {
        q.push_with(&name, format!("b-late{i}"), &b).await.unwrap();
    }
    let mut order = Vec::new();
    let mut b_done = 0;
    while b_done < SMALL {
        let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
        if d.group() == Some("b") {
            b_done += 1;
        }
        order.push(d.group().unwrap_or("").to_string());
        d.ack().await.unwrap();
        assert!(
            order.len() <= 2 * SMALL + 1,
            "group b's {SMALL} late messages waited behind a burst of group a \
             (after {} deliveries only {b_done} of them): {order:?}",
            order.len()
        );
    }
    held.ack().await.unwrap();
    q.purge(&name).await.unwrap();
}

/// A group whose one message is acked and replaced before the next pop
/// (a chain of jobs, each pushing the next) leaves the lane and joins it
/// again each time; it must not be served every time while another
/// group waits: the two alternate.
pub async fn queue_a_group_that_empties_and_refills_takes_turns(f: &Factory) {
    let Some(q) = queues(&f.client().await) else {
        return;
    };
    let name = unique("q-chain");
    let (a, b) = (PushOptions::new().group("a"), PushOptions::new().group("b"));
    for i in 0..10 {
        q.push_with(&name, format!("b{i}"), &b).await.unwrap();
    }
    q.push_with(&name, b"a0", &a).await.unwrap();
    let mut order = Vec::new();
    for i in 1..=10 {
        let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
        let g = d.group().unwrap_or("").to_string();
        d.ack().await.unwrap();
        if g == "a" {
            // The next job of the chain, pushed before the next pop.
            q.push_with(&name, format!("a{i}"), &a).await.unwrap();
        }
        order.push(g);
    }
    assert!(
        order.windows(2).all(|w| w[0] != w[1]),
        "a group that emptied and refilled was served twice in a row while \
         another waited: {order:?}"
    );
    q.purge(&name).await.unwrap();
}

/// Fairness across groups: a group of 10 messages pushed after a group of
/// 10,000 finishes while the big one is still draining: one consumer needs
/// at most 2 deliveries per small message (round-robin, one each), and the
/// big group still holds at least 9,980 then.
pub async fn queue_small_group_is_not_starved_by_a_big_backlog(f: &Factory) {
    const BIG: usize = 10_000;
    const SMALL: usize = 10;
    let Some(q) = queues(&f.client().await) else {
        return;
    };
    let name = unique("q-fair");
    // Push the backlog from 16 clients at once.
    let mut pushers = Vec::new();
    for p in 0..16 {
        let c = f.client().await.queues().unwrap();
        let name = name.clone();
        pushers.push(tokio::spawn(async move {
            let opts = PushOptions::new().group("big");
            for i in (p..BIG).step_by(16) {
                c.push_with(&name, format!("big{i}"), &opts).await.unwrap();
            }
        }));
    }
    for p in pushers {
        p.await.unwrap();
    }
    for i in 0..SMALL {
        q.push_with(
            &name,
            format!("small{i}"),
            &PushOptions::new().group("small"),
        )
        .await
        .unwrap();
    }
    let mut deliveries = 0usize;
    let mut small_done = 0usize;
    let mut per_group: HashMap<String, usize> = HashMap::new();
    while small_done < SMALL {
        let d = q
            .pop(&name, LONG, Duration::ZERO)
            .await
            .unwrap()
            .expect("messages are left");
        deliveries += 1;
        let g = d.group().unwrap_or("").to_string();
        if g == "small" {
            small_done += 1;
        }
        *per_group.entry(g).or_default() += 1;
        d.ack().await.unwrap();
        assert!(
            deliveries <= 2 * SMALL,
            "after {deliveries} deliveries only {small_done} of the small group's \
             {SMALL} were delivered ({per_group:?}): the big backlog starves it"
        );
    }
    let s = q.stats(&name).await.unwrap();
    assert!(
        s.ready as usize >= BIG - 2 * SMALL,
        "the big group holds {} when the small one finished",
        s.ready
    );
    assert_eq!(q.purge(&name).await.unwrap() as usize, s.ready as usize);
    assert_eq!(q.stats(&name).await.unwrap(), Default::default());
}

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

/// A push repeating a dedup id within the window is a no-op returning the
/// first id (even after the first was acked); another id is a new message;
/// the same id after the window is a new message.
pub async fn queue_dedup_id_makes_a_repeated_push_a_no_op(f: &Factory) {
    let c = f.client().await;
    let Some(q) = queues(&c) else {
        return;
    };
    let name = unique("q-dedup");
    let window = ttl(&c, Duration::from_millis(1500));
    let opts = PushOptions::new().dedup_id("order-1").dedup_window(window);
    let first = q.push_with(&name, b"1", &opts).await.unwrap();
    assert!(!first.duplicate);
    let again = q.push_with(&name, b"1 again", &opts).await.unwrap();
    assert_eq!((again.id, again.duplicate), (first.id, true));
    let other = q
        .push_with(&name, b"2", &PushOptions::new().dedup_id("order-2"))
        .await
        .unwrap();
    assert!(!other.duplicate && other.id != first.id);
    assert_eq!(q.stats(&name).await.unwrap().ready, 2);
    let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!((d.id(), d.payload()), (first.id, &b"1"[..]));
    d.ack().await.unwrap();
    let after_ack = q.push_with(&name, b"1 late", &opts).await.unwrap();
    assert_eq!(
        (after_ack.id, after_ack.duplicate),
        (first.id, true),
        "a dedup id is remembered for its window, not while the message lives"
    );
    let elsewhere = unique("q-dedup-other");
    let there = q.push_with(&elsewhere, b"1", &opts).await.unwrap();
    assert!(
        !there.duplicate,
        "a dedup id of one queue made a push to another queue a duplicate"
    );
    q.purge(&elsewhere).await.unwrap();
    sleep(window + Duration::from_millis(300)).await;
    let later = q.push_with(&name, b"1 next", &opts).await.unwrap();
    assert!(!later.duplicate, "a dedup id is forgotten after its window");
    assert!(later.id > other.id);
    let kept = PushOptions::new().dedup_id("order-3");
    assert!(!q.push_with(&name, b"3", &kept).await.unwrap().duplicate);
    q.purge(&name).await.unwrap();
    assert!(
        !q.push_with(&name, b"3", &kept).await.unwrap().duplicate,
        "purge must delete the queue's dedup ids"
    );
    q.purge(&name).await.unwrap();
}

/// A dedup id's window runs from its first push: duplicates pushed within
/// it are no-ops and do not restart it. With a 1.5 s window and duplicates
/// at 0.3, 0.6 and 0.9 s, a push 1.7 s after the first is a new message,
/// although it comes 0.8 s after the last duplicate (a store that restarts
/// the window at each duplicate would still call it one).
pub async fn queue_dedup_window_runs_from_the_first_push(f: &Factory) {
    let c = f.client().await;
    let Some(q) = queues(&c) else {
        return;
    };
    let name = unique("q-dedup-first");
    let window = Duration::from_millis(1500);
    let opts = PushOptions::new().dedup_id("order-1").dedup_window(window);
    let sent = Instant::now();
    let first = q.push_with(&name, b"1", &opts).await.unwrap();
    let pushed = Instant::now();
    assert!(!first.duplicate, "the first push of a dedup id");
    for k in 1..=3 {
        tokio::time::sleep_until(sent + window * k / 5).await;
        let again = q.push_with(&name, b"1 again", &opts).await.unwrap();
        assert_eq!(
            (again.id, again.duplicate),
            (first.id, true),
            "a push {:?} into a {window:?} dedup window is a duplicate of the first",
            sent.elapsed()
        );
    }
    // The first window ends by `pushed + window`; restarted by the last
    // duplicate it would last until 0.9 s + the window after `sent`.
    tokio::time::sleep_until(pushed + window + Duration::from_millis(200)).await;
    let later = q.push_with(&name, b"1 later", &opts).await.unwrap();
    assert!(
        !later.duplicate && later.id != first.id,
        "a push {:?} after the first of a {window:?} dedup window was a duplicate: \
         the duplicates pushed within the window restarted it",
        pushed.elapsed()
    );
    q.purge(&name).await.unwrap();
}

/// Payloads are bytes, stored as they are: every byte value, an empty
/// payload, one at the store's limit, and JSON through the typed helpers.
pub async fn queue_binary_payloads_round_trip(f: &Factory) {
    let c = f.client().await;
    let Some(q) = queues(&c) else {
        return;
    };
    let name = unique("q-bytes");
    let all: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    let big: Vec<u8> = (0..q.max_payload()).map(|i| (i * 7 % 251) as u8).collect();
    for p in [all.clone(), Vec::new(), big.clone()] {
        q.push(&name, &p).await.unwrap();
        let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
        assert!(
            d.payload() == &p[..],
            "a {}-byte payload came back changed",
            p.len()
        );
        d.ack().await.unwrap();
    }
    let value = ("resize".to_string(), vec![640u32, 480], Some('é'));
    q.push_json(&name, &value, &PushOptions::new())
        .await
        .unwrap();
    let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    let back: (String, Vec<u32>, Option<char>) = d.json().unwrap();
    assert_eq!(back, value);
    assert!(matches!(d.json::<u64>(), Err(Error::Payload { .. })));
    d.ack().await.unwrap();
}

/// A pop blocked on an empty queue (polling set to 10 s; 200 ms on a store
/// without notifications) is woken by a push from another client within a
/// second.
pub async fn queue_blocked_pop_is_woken_by_a_push(f: &Factory) {
    let waiter = f.client().await;
    let waiter = waiter.clone().with_poll_interval(wake_poll(&waiter));
    let pusher = f.client().await;
    let (Some(qw), Some(qp)) = (queues(&waiter), pusher.queues().ok()) else {
        return;
    };
    let name = unique("q-wake");
    let n2 = name.clone();
    let task = tokio::spawn(async move { qw.pop(&n2, LONG, Duration::from_secs(8)).await });
    sleep(Duration::from_millis(500)).await;
    let pushed_at = Instant::now();
    qp.push(&name, b"wake").await.unwrap();
    let d = timeout(Duration::from_secs(9), task)
        .await
        .expect("the pop returned")
        .unwrap()
        .unwrap()
        .expect("the pushed message");
    let took = pushed_at.elapsed();
    assert!(
        took <= PROMPT,
        "a blocked pop got the push after {took:?}: not woken by the store"
    );
    d.ack().await.unwrap();
}

/// Start a pop of `name` on `waiter` (waiting up to 8 s), let it settle
/// into its sleep, run `act`, and return the delivery the pop got. It must
/// come within [`PROMPT`] of `act` finishing (of `due` after it, for a
/// message that is not deliverable before `due`), and not before `due`.
async fn woken_by<Fut: Future<Output = ()>>(
    waiter: &Queues,
    name: &str,
    what: &str,
    due: Duration,
    act: Fut,
) -> Delivery {
    let (qw, n) = (waiter.clone(), name.to_string());
    let task = tokio::spawn(async move { qw.pop(&n, LONG, Duration::from_secs(8)).await });
    sleep(Duration::from_millis(500)).await;
    let before = Instant::now();
    act.await;
    let at = Instant::now();
    let d = timeout(Duration::from_secs(9), task)
        .await
        .expect("the pop returned")
        .unwrap()
        .unwrap()
        .unwrap_or_else(|| panic!("after {what}, a waiting pop got nothing"));
    let (since_before, took) = (before.elapsed(), at.elapsed());
    assert!(
        since_before + Duration::from_millis(50) >= due,
        "after {what}, a waiting pop got the message {since_before:?} later, before it was due ({due:?})"
    );
    assert!(
        took <= due + PROMPT,
        "after {what}, a waiting pop got the message only {took:?} later (due after {due:?}): \
         not woken by the store"
    );
    d
}

/// A pop blocked on a queue whose only message is in flight, held back or
/// dead (polling 10 s; 200 ms on a store without notifications) is woken
/// within a second when the message is given back with `nack`, when its
/// delivery is dropped (given back in the background), when the head of
/// its ordered group is acked, and when it is redriven; and gets a message
/// pushed with a delay while it waits when the delay is over (not at its
/// next poll).
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

/// The watchdog keeps a delivery invisible past its visibility; ack stops
/// it. Extend moves the deadline; neither changes the token or attempts.
pub async fn queue_watchdog_keeps_the_delivery_until_ack(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let (Some(qa), Some(qb)) = (queues(&a), b.queues().ok()) else {
        return;
    };
    let name = unique("q-watchdog");
    qa.push(&name, b"long job").await.unwrap();
    // 2 s: the watchdog renews every 667 ms and has 1.3 s for a renewal,
    // enough for an etcd round trip while the suite's 10,000-message
    // fairness case runs beside it on a loaded machine (900 ms, which
    // rounds to 1 s there, failed once at load 17).
    let vis = ttl(&a, Duration::from_secs(2));
    let d = qa
        .pop_with(&name, PopOptions::new(vis).watchdog(true))
        .await
        .unwrap()
        .unwrap();
    let token = d.fencing_token();
    sleep(vis * 2 + vis / 2).await;
    assert!(d.is_valid(), "the watchdog let the delivery lapse");
    assert!(
        qb.pop(&name, LONG, Duration::ZERO).await.unwrap().is_none(),
        "a delivery kept by the watchdog was delivered to another consumer"
    );
    assert_eq!(d.fencing_token(), token);
    assert_eq!(d.attempts(), 1);
    d.ack().await.unwrap();
    assert_eq!(qa.stats(&name).await.unwrap(), Default::default());
}

/// Bad input is a typed error naming the field and writes nothing.
pub async fn queue_bad_input_is_rejected_and_writes_nothing(f: &Factory) {
    let c = f.client().await;
    let Some(q) = queues(&c) else {
        return;
    };
    let name = unique("q-bad");
    assert_eq!(
        field_of(q.push("", b"x").await, "empty queue name"),
        "queue"
    );
    assert_eq!(
        field_of(q.push("bad\nname", b"x").await, "control character"),
        "queue"
    );
    let too_big = vec![0u8; q.max_payload() + 1];
    assert_eq!(
        field_of(q.push(&name, &too_big).await, "payload"),
        "payload"
    );
    // Before any I/O: the same client with its store unreachable (every
    // call of the store fails, counted) still refuses it as too big.
    let raw = c.raw_queue().unwrap();
    assert_eq!(
        (q.max_payload(), q.durable()),
        (raw.max_payload(), raw.durable()),
        "Queues must report the store's limit and durability"
    );
    let cut_off = Arc::new(Unreachable {
        store: raw,
        calls: AtomicUsize::new(0),
    });
    let unreachable = c.clone().with_queues(cut_off.clone()).queues().unwrap();
    assert_eq!(unreachable.max_payload(), q.max_payload());
    assert_eq!(
        field_of(
            unreachable
                .push_with(&name, &too_big, &PushOptions::new().group("g"))
                .await,
            "an oversize payload to an unreachable store"
        ),
        "payload"
    );
    assert_eq!(
        cut_off.calls.load(Ordering::SeqCst),
        0,
        "an oversize push reached the store before it was refused"
    );
    let bad_group = PushOptions::new().group("");
    assert_eq!(
        field_of(q.push_with(&name, b"x", &bad_group).await, "empty group"),
        "group"
    );
    let bad_dedup = PushOptions::new().dedup_id("x".repeat(600));
    assert_eq!(
        field_of(q.push_with(&name, b"x", &bad_dedup).await, "long dedup id"),
        "dedup_id"
    );
    let far = PushOptions::new().delay(Duration::from_secs(400 * 24 * 3600));
    assert_eq!(
        field_of(q.push_with(&name, b"x", &far).await, "delay"),
        "delay"
    );
    assert_eq!(
        field_of(
            q.pop(&name, Duration::ZERO, Duration::ZERO).await,
            "zero visibility"
        ),
        "visibility"
    );
    let zero = q
        .clone()
        .with_config(QueueConfig::default().max_deliveries(0));
    assert_eq!(
        field_of(
            zero.pop(&name, LONG, Duration::ZERO).await,
            "max_deliveries 0"
        ),
        "max_deliveries"
    );
    assert_eq!(
        field_of(q.peek(&name, Lane::Main, 0).await, "limit 0"),
        "limit"
    );
    assert_eq!(
        field_of(q.redrive(&name, 1_000_000).await, "limit"),
        "limit"
    );
    let zero_window = PushOptions::new()
        .dedup_id("d")
        .dedup_window(Duration::ZERO);
    assert_eq!(
        field_of(
            q.push_with(&name, b"x", &zero_window).await,
            "zero dedup window"
        ),
        "dedup_window"
    );
    let long_window = PushOptions::new()
        .dedup_id("d")
        .dedup_window(Duration::from_secs(400 * 24 * 3600));
    assert_eq!(
        field_of(
            q.push_with(&name, b"x", &long_window).await,
            "dedup window over a year"
        ),
        "dedup_window"
    );
    let long_group = PushOptions::new().group("g".repeat(600));
    assert_eq!(
        field_of(q.push_with(&name, b"x", &long_group).await, "long group"),
        "group"
    );
    assert_eq!(
        field_of(
            q.pop(&name, Duration::from_secs(400 * 24 * 3600), Duration::ZERO)
                .await,
            "visibility over a year"
        ),
        "visibility"
    );
    let long_name = "q".repeat(600);
    assert_eq!(
        field_of(q.stats(&long_name).await, "long queue name"),
        "queue"
    );
    assert_eq!(
        field_of(q.purge("").await, "purge of an empty name"),
        "queue"
    );
    assert_eq!(
        field_of(
            q.peek(&name, Lane::Dead, coord_core::MAX_BATCH + 1).await,
            "limit over MAX_BATCH"
        ),
        "limit"
    );
    assert_eq!(q.stats(&name).await.unwrap(), Default::default());
    // A zero extend is refused before I/O and leaves the delivery as it was.
    q.push(&name, b"x").await.unwrap();
    let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    assert!(
        matches!(
            d.extend(Duration::ZERO).await,
            Err(Error::InvalidArgument { .. })
        ),
        "a zero extend must be InvalidArgument"
    );
    assert!(d.is_valid(), "a refused extend ended the delivery");
    d.ack()
        .await
        .expect("the delivery still holds after a refused extend");
    // A nack with a bad delay sends nothing and gives nothing back.
    q.push(&name, b"x").await.unwrap();
    let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(
        field_of(
            d.nack(Duration::from_secs(400 * 24 * 3600)).await,
            "nack delay"
        ),
        "delay"
    );
    sleep(Duration::from_millis(200)).await;
    let s = q.stats(&name).await.unwrap();
    assert_eq!(s.in_flight, 1, "a refused nack changed the message: {s:?}");
    q.purge(&name).await.unwrap();
}

/// A store that cannot be reached: its limits are the real store's, and
/// every call of it is counted and fails as a lost connection would.
struct Unreachable {
    store: Arc<dyn Queue>,
    calls: AtomicUsize,
}

impl Unreachable {
    fn fail<T>(&self, operation: &'static str) -> Result<T> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(Error::Unavailable {
            backend: self.store.capabilities().backend,
            operation,
            message: "connection refused (the test's unreachable store)".into(),
            source: None,
        })
    }
}

#[async_trait]
impl Queue for Unreachable {
    fn capabilities(&self) -> &Capabilities {
        self.store.capabilities()
    }
    fn max_payload(&self) -> usize {
        self.store.max_payload()
    }
    fn durable(&self) -> bool {
        self.store.durable()
    }
    async fn push(&self, _: &str, _: &NewMessage<'_>) -> Result<Pushed> {
        self.fail("queue push")
    }
    async fn try_pop(
        &self,
        _: &str,
        _: Lane,
        _: &OwnerToken,
        _: Duration,
        _: &QueueConfig,
    ) -> Result<PopAttempt> {
        self.fail("queue pop")
    }
    async fn ack(&self, _: &str, _: Lane, _: MessageId, _: &OwnerToken) -> Result<bool> {
        self.fail("queue ack")
    }
    async fn nack(
        &self,
        _: &str,
        _: Lane,
        _: MessageId,
        _: &OwnerToken,
        _: Duration,
    ) -> Result<bool> {
        self.fail("queue nack")
    }
    async fn extend(
        &self,
        _: &str,
        _: Lane,
        _: MessageId,
        _: &OwnerToken,
        _: Duration,
    ) -> Result<bool> {
        self.fail("queue extend")
    }
    async fn peek(&self, _: &str, _: Lane, _: usize) -> Result<Vec<Message>> {
        self.fail("queue peek")
    }
    async fn redrive(&self, _: &str, _: usize) -> Result<u64> {
        self.fail("queue redrive")
    }
    async fn stats(&self, _: &str) -> Result<QueueStats> {
        self.fail("queue stats")
    }
    async fn purge(&self, _: &str) -> Result<u64> {
        self.fail("queue purge")
    }
    async fn subscribe(&self, _: &str, _: Lane) -> Result<Waiter> {
        self.fail("queue subscribe")
    }
}
