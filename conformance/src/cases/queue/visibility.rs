//! Delivery and visibility: each message once among many consumers, a
//! lapsed or crashed delivery delivered again, stale consumers refused and
//! fenced out, the watchdog keeping a delivery.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use coord_core::{Error, FencedRegister, FencingToken, Lane, OwnerToken, PopOptions, QueueConfig};
use tokio::time::{Instant, sleep};

use super::{CLOCK_SLACK, LONG, delivered, queues, raw_message};
use crate::{Factory, PROMPT, ttl, unique};

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
    // In flight until `start` + vis at the earliest: a pop answered before
    // gets nothing; one answered later may rightly get the redelivery.
    let early = qb.pop(&name, LONG, Duration::ZERO).await.unwrap();
    let again = match early {
        Some(d) => {
            assert!(
                start.elapsed() >= vis,
                "a message in flight was delivered to a second consumer"
            );
            d
        }
        None => qb
            .pop(&name, LONG, Duration::from_secs(10))
            .await
            .unwrap()
            .expect("the crashed consumer's message must be delivered again"),
    };
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
