//! Deliveries: payloads with every byte value round-trip, fencing tokens
//! and ids keep rising after the server lost its data, a lapse larger than
//! one step's batch redelivers everything, and deliveries follow the rule
//! as the state machine does.

use crate::common;
use std::collections::BTreeSet;
use std::sync::Arc;

use common::{SEC, eventually, unique};
use conformance::testkit::redis::{self as kit, RedisServer};
use coord_core::{Lane, MessageId, OwnerToken, PopAttempt, PushOptions, Queue, QueueConfig};
use tokio::time::{Instant, sleep};

use super::{LONG, MS, backend, delivered, msg};

#[tokio::test]
async fn payloads_with_every_byte_value_round_trip() {
    let b = backend(&kit::url()).await;
    let name = unique("q-bytes");
    let me = OwnerToken::random();
    let every: Vec<u8> = (0..=255u8).cycle().take(256 * 3).collect();
    let tricky: &[&[u8]] = &[
        &every,
        b"",
        b"\0",
        b"%d %s [^]*$ \\0",
        b"a:b:c:d",
        &[0xff; 17],
    ];
    let group = "t\u{e9}nant:7 {x}";
    for p in tricky {
        b.push(&name, &msg(p, Some(group))).await.unwrap();
    }
    let peeked = b.peek(&name, Lane::Main, 100).await.unwrap();
    assert_eq!(peeked.len(), tricky.len());
    for (m, p) in peeked.iter().zip(tricky) {
        assert_eq!(&m.payload[..], *p, "peek changed a payload");
        assert_eq!(m.group.as_deref(), Some(group));
    }
    let cfg = QueueConfig::default();
    for p in tricky {
        let (m, _) = delivered(b.try_pop(&name, Lane::Main, &me, LONG, &cfg).await.unwrap());
        assert_eq!(&m.payload[..], *p, "a delivery changed a payload");
        assert_eq!(m.group.as_deref(), Some(group));
        assert!(b.ack(&name, Lane::Main, m.id, &me).await.unwrap());
    }
}

#[tokio::test]
async fn fencing_tokens_and_ids_keep_rising_after_the_server_lost_its_data() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let name = unique("q-fence");
    let me = OwnerToken::random();
    let cfg = QueueConfig::default();
    let mut last = (MessageId(0), 0u64);
    let x = msg(b"x", None);
    for round in 0..3 {
        for _ in 0..5 {
            let id = eventually("push", || b.push(&name, &x)).await.id;
            let (m, token) = delivered(
                eventually("pop", || b.try_pop(&name, Lane::Main, &me, LONG, &cfg)).await,
            );
            assert_eq!(m.id, id);
            assert!(
                id > last.0 && token > last.1,
                "round {round}: id {id} token {token} after {last:?}"
            );
            last = (id, token);
        }
        match round {
            0 => {
                server.command(&["FLUSHALL"]);
            }
            _ => server.restart(),
        }
    }
}

#[tokio::test]
async fn a_lapse_larger_than_one_steps_batch_redelivers_everything() {
    let b = Arc::new(backend(&kit::url()).await);
    let name = unique("q-mass-lapse");
    let (me, other) = (OwnerToken::random(), OwnerToken::random());
    let cfg = QueueConfig::default();
    const N: usize = 600;
    for i in 0..N {
        let group = ["a", "b", "c"][i % 3];
        b.push(&name, &msg(b"m", Some(group))).await.unwrap();
    }
    // Every delivery lapses at the same moment (give or take the pops).
    // No delivery may lapse before the last pop: eight consumers' pops
    // run at once, within a visibility that leaves a loaded machine room.
    let vis = 10 * SEC;
    let start = Instant::now();
    let mut pops = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (b, name) = (b.clone(), name.clone());
        pops.spawn(async move {
            for _ in 0..N / 8 {
                delivered(b.try_pop(&name, Lane::Main, &me, vis, &cfg).await.unwrap());
            }
        });
    }
    while let Some(done) = pops.join_next().await {
        done.unwrap();
    }
    let empty = b.try_pop(&name, Lane::Main, &me, LONG, &cfg).await.unwrap();
    assert!(start.elapsed() < vis, "the pops took {:?}", start.elapsed());
    assert!(
        matches!(empty, PopAttempt::Empty { next_in: Some(n) } if n <= vis),
        "{empty:?}"
    );
    sleep(vis + 100 * MS).await;
    assert_eq!(b.stats(&name).await.unwrap().ready, N as u64);
    let mut seen = BTreeSet::new();
    for _ in 0..N {
        let (m, _) = delivered(
            b.try_pop(&name, Lane::Main, &other, LONG, &cfg)
                .await
                .unwrap(),
        );
        assert_eq!(m.attempts, 2);
        assert!(seen.insert(m.id), "{} delivered twice", m.id);
        assert!(!b.ack(&name, Lane::Main, m.id, &me).await.unwrap());
        assert!(b.ack(&name, Lane::Main, m.id, &other).await.unwrap());
    }
    assert_eq!(b.stats(&name).await.unwrap(), Default::default());
}

/// Random pushes, pops (ordered or not, with dead-lettering), acks, nacks,
/// acks by the wrong consumer and redrives: every pop delivers what
/// coord-core's queue state machine delivers, and stats and peeks agree
/// with it (`conformance::queue_rule`).
#[tokio::test]
async fn deliveries_follow_the_rule_as_the_state_machine_does() {
    let b: Arc<dyn Queue> = Arc::new(backend(&kit::url()).await);
    conformance::queue_rule::deliveries_follow_the_state_machine(
        b,
        coord_core::queue_state::Turns::PerGroup,
        600,
        async |_| {},
    )
    .await;
    // Pushing through the handle with options works as the raw trait.
    let q = backend(&kit::url()).await.into_coord().queues().unwrap();
    let name = unique("q-handle");
    let p = q
        .push_with(&name, b"x", &PushOptions::new().group("g").dedup_id("d"))
        .await
        .unwrap();
    assert!(!p.duplicate);
    q.purge(&name).await.unwrap();
}
