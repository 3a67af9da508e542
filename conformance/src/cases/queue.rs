//! Work queue cases: at-least-once delivery with visibility timeouts,
//! fenced deliveries, dead letters, dedup, delays and fairness across
//! groups (the rule is in `coord_core::queue_backend`).
//!
//! A store without queues (yet) skips every case here with the reason
//! [`QUEUE_GATE`] on stderr, never a silent pass.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_core::{
    Coord, Error, FencedRegister, FencingToken, Lane, PopOptions, PushOptions, QueueConfig, Queues,
};
use tokio::time::{Instant, sleep, timeout};

use crate::{Factory, PROMPT, ttl, unique};

const LONG: Duration = Duration::from_secs(30);

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
/// consumer (waiting, polling only every 10 s) with attempts 2 and a higher
/// fencing token.
pub async fn queue_crashed_consumers_message_is_redelivered_after_visibility(f: &Factory) {
    let a = f.client().await;
    let b = f.client().await.with_poll_interval(Duration::from_secs(10));
    let (Some(qa), Some(qb)) = (queues(&a), b.queues().ok()) else {
        return;
    };
    let name = unique("q-crash");
    qa.push(&name, b"work").await.unwrap();
    let vis = ttl(&a, Duration::from_millis(1500));
    let d = qa
        .pop(&name, vis, Duration::ZERO)
        .await
        .unwrap()
        .expect("a message");
    let start = Instant::now();
    let first_token = d.fencing_token();
    assert_eq!(d.attempts(), 1);
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
    again.ack().await.unwrap();
}

/// A stale consumer (paused past its visibility while the message went to
/// another): its ack, extend and nack are refused with `NotHeld` and change
/// nothing, and its fenced write is rejected after the new consumer's.
pub async fn queue_stale_consumer_is_refused_and_fenced_out(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let (Some(qa), Some(qb)) = (queues(&a), b.queues().ok()) else {
        return;
    };
    let name = unique("q-stale");
    qa.push(&name, b"job").await.unwrap();
    let vis = ttl(&a, Duration::from_millis(800));
    let stale = qa.pop(&name, vis, Duration::ZERO).await.unwrap().unwrap();
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
/// order. With ordered groups, a group's next message is not delivered
/// while its previous one is in flight (or nacked with a delay), while
/// another group's is.
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
    for d in held {
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
    for attempt in 1..=2 {
        let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
        assert_eq!((d.id(), d.attempts()), (id, attempt));
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
    sleep(window + Duration::from_millis(300)).await;
    let later = q.push_with(&name, b"1 next", &opts).await.unwrap();
    assert!(!later.duplicate, "a dedup id is forgotten after its window");
    assert!(later.id > other.id);
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

/// A pop blocked on an empty queue (polling set to 10 s) is woken by a push
/// from another client within a second.
pub async fn queue_blocked_pop_is_woken_by_a_push(f: &Factory) {
    let waiter = f.client().await.with_poll_interval(Duration::from_secs(10));
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

/// The watchdog keeps a delivery invisible past its visibility; ack stops
/// it. Extend moves the deadline; neither changes the token or attempts.
pub async fn queue_watchdog_keeps_the_delivery_until_ack(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let (Some(qa), Some(qb)) = (queues(&a), b.queues().ok()) else {
        return;
    };
    let name = unique("q-watchdog");
    qa.push(&name, b"long job").await.unwrap();
    let vis = ttl(&a, Duration::from_millis(900));
    let d = qa
        .pop_with(&name, PopOptions::new(vis).watchdog(true))
        .await
        .unwrap()
        .unwrap();
    let token = d.fencing_token();
    sleep(vis * 3).await;
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
    assert_eq!(q.stats(&name).await.unwrap(), Default::default());
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
