//! Progress under contention: no step of one consumer starves while
//! others keep working the same queue.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::{Deployment, PushOptions};
use tokio::time::{Instant, sleep};

use super::{LONG, queues};
use crate::{Factory, unique};

/// The oldest delivery of each of four groups (the one every later
/// message of its group queues behind) is acked while 12 other consumers
/// pop and ack the messages right behind them as fast as they can. Each
/// of these acks takes no more than a few rounds of the others' work: a
/// store that must see the message right behind the oldest one unchanged
/// to ack the oldest one keeps losing to them (that message is the one
/// acked next), and gets there only when they slow down or run out of
/// work. (On a store in this process, the runtime decides what runs
/// meanwhile: there the acks need only succeed.)
pub async fn queue_ack_of_the_oldest_delivery_completes_while_others_work_its_group(f: &Factory) {
    oldest_settled_beside_others(f, Settle::Ack).await;
}

/// As [`queue_ack_of_the_oldest_delivery_completes_while_others_work_its_group`],
/// with each oldest delivery given back at once (a nack without delay): it
/// makes the message its group's lowest ready one again, which the others'
/// deliveries from the group keep changing, and still takes no more than a
/// few rounds of their work.
pub async fn queue_nack_of_the_oldest_delivery_completes_while_others_work_its_group(f: &Factory) {
    oldest_settled_beside_others(f, Settle::NackNow).await;
}

/// How the oldest deliveries are settled.
#[derive(Clone, Copy, Debug)]
enum Settle {
    Ack,
    NackNow,
}

async fn oldest_settled_beside_others(f: &Factory, settle: Settle) {
    const MESSAGES: usize = 400;
    const GROUPS: usize = 4;
    const OTHERS: usize = 12;
    const PUSHERS: usize = 8;
    let c = f.client().await;
    let Some(q) = queues(&c) else {
        return;
    };
    let embedded = q.capabilities().deployment == Deployment::Embedded;
    let name = unique("q-oldest");
    let mut pushes = Vec::new();
    for p in 0..PUSHERS {
        let (q, name) = (q.clone(), name.clone());
        pushes.push(tokio::spawn(async move {
            for i in (p..MESSAGES).step_by(PUSHERS) {
                let group = PushOptions::new().group(format!("g{}", i % GROUPS));
                q.push_with(&name, format!("m{i}"), &group).await.unwrap();
            }
        }));
    }
    for p in pushes {
        p.await.unwrap();
    }
    // Each group's first delivery is its oldest message (FIFO within a
    // group; groups take turns).
    let mut oldest = Vec::new();
    for _ in 0..GROUPS {
        let d = q
            .pop(&name, LONG, Duration::ZERO)
            .await
            .unwrap()
            .expect("a group's first delivery");
        oldest.push(d);
    }
    let groups: HashSet<Option<String>> = oldest
        .iter()
        .map(|d| d.group().map(str::to_string))
        .collect();
    assert_eq!(
        groups.len(),
        GROUPS,
        "the first deliveries were not one per group"
    );
    let acked = Arc::new(AtomicUsize::new(0));
    let mut others = Vec::new();
    for _ in 0..OTHERS {
        let c = f.client().await.queues().unwrap();
        let (name, acked) = (name.clone(), acked.clone());
        others.push(tokio::spawn(async move {
            while let Some(d) = c
                .pop(&name, LONG, Duration::from_millis(100))
                .await
                .expect("pop beside the oldest deliveries")
            {
                d.ack().await.expect("ack behind the oldest deliveries");
                acked.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    // The others are well under way before the oldest deliveries' acks.
    let started = Instant::now();
    while acked.load(Ordering::SeqCst) < OTHERS * 2 {
        assert!(
            started.elapsed() < LONG,
            "the other consumers acked only {} messages in {LONG:?}",
            acked.load(Ordering::SeqCst)
        );
        sleep(Duration::from_millis(5)).await;
    }
    let acks = oldest.into_iter().map(|d| {
        let acked = acked.clone();
        async move {
            let before = acked.load(Ordering::SeqCst);
            let outcome = match settle {
                Settle::Ack => d.ack().await,
                Settle::NackNow => d.nack(Duration::ZERO).await,
            };
            (outcome, before, acked.load(Ordering::SeqCst))
        }
    });
    let outcomes = futures::future::join_all(acks).await;
    for o in others {
        o.await.unwrap();
    }
    for (outcome, before, after) in outcomes {
        outcome.unwrap_or_else(|e| {
            panic!("{settle:?} of an oldest delivery beside consumers working its group: {e:?}")
        });
        // A few rounds of the others' work, not the rest of the queue. In
        // this process, what runs meanwhile is the runtime's choice.
        let during = after - before;
        assert!(
            embedded || during <= OTHERS * 8,
            "the others acked {during} messages during the {settle:?} of an oldest delivery \
             ({before} before it, of {MESSAGES}): it waited for them to slow down"
        );
    }
    let s = q.stats(&name).await.unwrap();
    assert_eq!(
        (s.ready, s.delayed, s.in_flight, s.dead),
        (0, 0, 0, 0),
        "acked messages were left: {s:?}"
    );
}
