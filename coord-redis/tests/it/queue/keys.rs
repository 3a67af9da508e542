//! The queue's keys in Redis: none left once acked or purged, names with
//! braces keep one hash slot, and a queue whose keys were lost never fails
//! and works again after a purge.

use crate::common;
use std::collections::HashMap;
use std::time::Duration;

use common::{SEC, unique};
use conformance::testkit::redis::{self as kit, RedisServer};
use coord_core::{Lane, OwnerToken, PopAttempt, Queue, QueueConfig};
use tokio::time::sleep;

use super::{LONG, MS, backend, delivered, msg};

fn dbsize(server: &RedisServer) -> i64 {
    server.command(&["DBSIZE"]).as_int().unwrap()
}

fn keys(server: &RedisServer) -> Vec<String> {
    match server.command(&["KEYS", "*"]) {
        kit::Resp::Array(Some(items)) => items
            .iter()
            .filter_map(|k| k.as_str().map(str::to_string))
            .collect(),
        other => panic!("KEYS: {other:?}"),
    }
}

#[tokio::test]
async fn an_acked_or_purged_queue_leaves_no_keys() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let cfg = QueueConfig::default().max_deliveries(1);
    let me = OwnerToken::random();

    // Acked: nothing left at once.
    let name = unique("q-keys");
    let id = b.push(&name, &msg(b"x", Some("g"))).await.unwrap().id;
    assert!(dbsize(&server) > 0);
    let (m, _) = delivered(b.try_pop(&name, Lane::Main, &me, LONG, &cfg).await.unwrap());
    assert_eq!(m.id, id);
    assert!(b.ack(&name, Lane::Main, id, &me).await.unwrap());
    assert_eq!(
        dbsize(&server),
        0,
        "an acked queue left {:?}",
        keys(&server)
    );

    // Every state at once (ready, delayed, in flight, dead, several
    // groups), then purged: nothing left.
    for i in 0..20u8 {
        let group = ["a", "b", "c"][i as usize % 3];
        let body = [i];
        let delay = if i % 4 == 0 { 10 * SEC } else { Duration::ZERO };
        let m = msg(&body, Some(group)).delayed(delay);
        b.push(&name, &m).await.unwrap();
    }
    for _ in 0..6 {
        let (m, _) = delivered(b.try_pop(&name, Lane::Main, &me, LONG, &cfg).await.unwrap());
        assert!(
            b.nack(&name, Lane::Main, m.id, &me, Duration::ZERO)
                .await
                .unwrap()
        );
    }
    delivered(b.try_pop(&name, Lane::Main, &me, LONG, &cfg).await.unwrap());
    delivered(b.try_pop(&name, Lane::Dead, &me, LONG, &cfg).await.unwrap());
    let s = b.stats(&name).await.unwrap();
    assert_eq!((s.delayed, s.in_flight, s.dead), (5, 1, 6), "{s:?}");
    assert_eq!(b.purge(&name).await.unwrap(), 20);
    assert_eq!(
        dbsize(&server),
        0,
        "a purged queue left {:?}",
        keys(&server)
    );
    assert_eq!(b.stats(&name).await.unwrap(), Default::default());

    // A dedup id outlives its message for its window, on a TTL, and only it.
    let d = msg(b"d", None).dedup("once", 700 * MS);
    let id = b.push(&name, &d).await.unwrap().id;
    let (m, _) = delivered(b.try_pop(&name, Lane::Main, &me, LONG, &cfg).await.unwrap());
    assert!(b.ack(&name, Lane::Main, m.id, &me).await.unwrap());
    let left = keys(&server);
    assert_eq!(left.len(), 2, "{left:?}");
    for k in &left {
        assert!(k.contains(":dedup"), "{k}");
        let ttl = server.command(&["PTTL", k]).as_int().unwrap();
        assert!(ttl > 0 && ttl <= 701, "{k}: PTTL {ttl}");
    }
    let again = b.push(&name, &d).await.unwrap();
    assert!(again.duplicate && again.id == id);
    sleep(800 * MS).await;
    // KEYS leaves out keys whose TTL ran out (DBSIZE counts them until
    // active expiry reaps them, later on a loaded machine).
    let left = keys(&server);
    assert!(left.is_empty(), "{left:?}");

    // A waiting pop on an empty queue leaves its mark on a TTL only.
    let coord = backend(&server.url()).await.into_coord();
    let q = coord.queues().unwrap();
    assert!(q.pop(&name, LONG, 300 * MS).await.unwrap().is_none());
    let left = keys(&server);
    assert_eq!(left.len(), 1, "{left:?}");
    let ttl = server.command(&["PTTL", &left[0]]).as_int().unwrap();
    // 60 s, rounded up to the next millisecond (`tidy` sets floor + 1 ms so
    // the key outlives the mark): 60,001 when read within the millisecond.
    assert!(ttl > 0 && ttl <= 60_001, "the mark's PTTL {ttl}");
}

#[tokio::test]
async fn names_with_braces_work_and_keep_one_hash_slot() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let me = OwnerToken::random();
    let cfg = QueueConfig::default();
    let names = ["{", "}", "a}{b", "{x}", "%7D", "}}{{:main:meta"];
    for name in names {
        b.push(name, &msg(name.as_bytes(), Some("}{")))
            .await
            .unwrap();
        b.push(name, &msg(b"delayed", None).delayed(10 * SEC))
            .await
            .unwrap();
    }
    // Each name's keys share one hash tag (so one Cluster slot), and no two
    // names share a key.
    let mut tags: HashMap<String, usize> = HashMap::new();
    for k in keys(&server) {
        let open = k.find('{').expect("a hash tag");
        let close = open + k[open..].find('}').expect("a closed hash tag");
        *tags.entry(k[open + 1..close].to_string()).or_default() += 1;
    }
    assert_eq!(tags.len(), names.len(), "{tags:?}");
    for name in names {
        let (m, _) = delivered(b.try_pop(name, Lane::Main, &me, LONG, &cfg).await.unwrap());
        assert_eq!(m.payload, name.as_bytes());
        assert_eq!(m.group.as_deref(), Some("}{"));
        assert!(b.ack(name, Lane::Main, m.id, &me).await.unwrap());
        let s = b.stats(name).await.unwrap();
        assert_eq!((s.ready, s.delayed), (0, 1), "{name}: {s:?}");
        assert_eq!(b.purge(name).await.unwrap(), 1);
    }
    assert_eq!(dbsize(&server), 0);
}

#[tokio::test]
async fn a_queue_whose_keys_were_lost_never_fails_and_works_after_a_purge() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let name = "lost";
    let me = OwnerToken::random();
    let cfg = QueueConfig::default().ordered_groups(true);
    for lost in [
        ":bodies",
        ":main:meta",
        ":main:all",
        ":main:ready",
        ":main:groups",
        "",
    ] {
        for i in 0..4u8 {
            b.push(name, &msg(&[i], Some(["a", "b"][i as usize % 2])))
                .await
                .unwrap();
        }
        server.command(&["DEL", &format!("coord:queue:{{{name}}}{lost}")]);
        for _ in 0..8 {
            match b.try_pop(name, Lane::Main, &me, LONG, &cfg).await.unwrap() {
                PopAttempt::Delivered { message, .. } => {
                    b.ack(name, Lane::Main, message.id, &me).await.unwrap();
                }
                PopAttempt::Empty { .. } => break,
            }
        }
        b.stats(name).await.unwrap();
        b.peek(name, Lane::Main, 10).await.unwrap();
        b.purge(name).await.unwrap();
        // Working again.
        let id = b.push(name, &msg(b"ok", None)).await.unwrap().id;
        let (m, _) = delivered(b.try_pop(name, Lane::Main, &me, LONG, &cfg).await.unwrap());
        assert_eq!(m.id, id, "after losing {lost:?}");
        assert!(b.ack(name, Lane::Main, id, &me).await.unwrap());
        assert_eq!(
            dbsize(&server),
            0,
            "after losing {lost:?}: {:?}",
            keys(&server)
        );
    }
}
