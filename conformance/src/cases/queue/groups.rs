//! Groups: FIFO within a group, ordered groups one message at a time, and
//! fair turns across groups (late, waiting, refilling and small groups,
//! one consumer and several at once).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_core::{FencingToken, PopOptions, PushOptions, QueueConfig};
use tokio::time::Instant;

use super::{LONG, queues};
use crate::{Factory, unique};

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
    let delay = Duration::from_millis(600);
    // The delay runs from after `nacked`: a pop answered before `nacked` +
    // delay gets nothing; one answered later may rightly get the first.
    let nacked = Instant::now();
    first.nack(delay).await.unwrap();
    let early = q.pop(&name, LONG, Duration::ZERO).await.unwrap();
    let again = match early {
        Some(d) if nacked.elapsed() >= delay && d.id() == a1 => d,
        Some(d) => panic!(
            "{} came {:?} after group a's first message was nacked with a {delay:?} delay: \
             group a's second message overtook its first, or the first came early",
            d.id(),
            nacked.elapsed()
        ),
        None => q
            .pop(&name, LONG, Duration::from_secs(5))
            .await
            .unwrap()
            .expect("the nacked message after its delay"),
    };
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

/// Fairness under concurrent consumers: four consumers pop at once (each
/// on its own client, acking what it gets) from a queue holding a backlog
/// of 200 messages of one group and then 10 of another. The small group
/// is through within two deliveries per small message plus two per
/// consumer: the order across groups may bend by the pops in flight (a
/// store that keeps turns per message lets a pop pass the messages other
/// pops hold locked), never by the backlog.
pub async fn queue_groups_take_turns_under_concurrent_consumers(f: &Factory) {
    const BIG: usize = 200;
    const SMALL: usize = 10;
    const CONSUMERS: usize = 4;
    let Some(q) = queues(&f.client().await) else {
        return;
    };
    let name = unique("q-fair-many");
    let (big, small) = (
        PushOptions::new().group("big"),
        PushOptions::new().group("small"),
    );
    for i in 0..BIG {
        q.push_with(&name, format!("big{i}"), &big).await.unwrap();
    }
    for i in 0..SMALL {
        q.push_with(&name, format!("small{i}"), &small)
            .await
            .unwrap();
    }
    // The groups in the order the store delivered them: by the
    // deliveries' fencing tokens, which the store draws in each pop. (The
    // order the pops returned in bends with the machine's load: a consumer
    // whose task runs late reports its delivery after later ones.)
    let order = Arc::new(Mutex::new(Vec::new()));
    let small_left = Arc::new(AtomicUsize::new(SMALL));
    let mut consumers = Vec::new();
    for _ in 0..CONSUMERS {
        let c = f.client().await.queues().unwrap();
        let (name, order, small_left) = (name.clone(), order.clone(), small_left.clone());
        consumers.push(tokio::spawn(async move {
            while small_left.load(Ordering::SeqCst) > 0 {
                let Some(d) = c.pop(&name, LONG, Duration::ZERO).await.unwrap() else {
                    break;
                };
                let g = d.group().unwrap_or("").to_string();
                if g == "small" {
                    small_left.fetch_sub(1, Ordering::SeqCst);
                }
                order.lock().unwrap().push((d.fencing_token(), g));
                d.ack().await.unwrap();
            }
        }));
    }
    for c in consumers {
        c.await.unwrap();
    }
    let returned = order.lock().unwrap().clone();
    let mut order = returned.clone();
    order.sort();
    let order: Vec<String> = order.into_iter().map(|(_, g)| g).collect();
    let last_small = order.iter().rposition(|g| g == "small");
    let bound = 2 * SMALL + 2 * CONSUMERS;
    assert!(
        last_small.is_some_and(|i| i < bound),
        "the small group's {SMALL} messages were not through within {bound} deliveries \
         with {CONSUMERS} consumers popping at once: {order:?} (as the pops returned: \
         {returned:?})"
    );
    assert_eq!(
        order.iter().filter(|g| *g == "small").count(),
        SMALL,
        "{order:?}"
    );
    q.purge(&name).await.unwrap();
}
