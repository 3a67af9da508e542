//! What a queue costs the server: one request for each uncontended push,
//! pop and ack, and a pop woken by another client's push with no
//! `PUBLISH` while nobody waits.

use crate::common;
use std::time::Duration;

use common::{SEC, unique};
use conformance::testkit::redis::{self as kit, CountingProxy, RedisServer};
use conformance::testkit::wait::until;
use coord_core::PushOptions;
use tokio::time::{Instant, sleep, timeout};

use super::{LONG, MS, backend};

/// How many times the server ran `cmd` (scripts' calls included).
fn calls(server: &RedisServer, cmd: &str) -> i64 {
    server
        .info("commandstats", &format!("cmdstat_{cmd}"))
        .split(',')
        .find_map(|f| f.strip_prefix("calls="))
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test]
async fn uncontended_push_pop_and_ack_cost_one_request_each() {
    let proxy = CountingProxy::start(kit::server().port());
    let q = backend(&proxy.url()).await.into_coord().queues().unwrap();
    let name = unique("q-requests");
    // Warm up (first use of the connection).
    q.push(&name, b"warm").await.unwrap();
    q.pop(&name, LONG, Duration::ZERO)
        .await
        .unwrap()
        .unwrap()
        .ack()
        .await
        .unwrap();
    for i in 0..3 {
        let mut sent = Vec::new();
        let before = proxy.command_names().len();
        q.push(&name, format!("m{i}")).await.unwrap();
        sent.push(proxy.command_names()[before..].to_vec());
        let before = proxy.command_names().len();
        let d = q.pop(&name, LONG, SEC).await.unwrap().expect("a message");
        sent.push(proxy.command_names()[before..].to_vec());
        let before = proxy.command_names().len();
        d.ack().await.unwrap();
        sent.push(proxy.command_names()[before..].to_vec());
        for (op, names) in ["push", "pop", "ack"].iter().zip(&sent) {
            assert_eq!(names, &["EVALSHA"], "{op} sent {names:?}");
        }
    }
}

#[tokio::test]
async fn a_pop_is_woken_by_another_clients_push_and_nobody_waiting_costs_no_publish() {
    let server = RedisServer::start();
    let pusher = backend(&server.url()).await.into_coord().queues().unwrap();
    let waiter = backend(&server.url())
        .await
        .into_coord()
        .with_poll_interval(Duration::from_secs(30))
        .queues()
        .unwrap();
    let name = unique("q-wake");
    let pubs = calls(&server, "publish");
    for _ in 0..3 {
        pusher.push(&name, b"nobody waits").await.unwrap();
        let d = pusher.pop(&name, LONG, Duration::ZERO).await.unwrap();
        d.unwrap().ack().await.unwrap();
    }
    assert_eq!(
        calls(&server, "publish"),
        pubs,
        "published with nobody waiting"
    );

    for round in 0..3 {
        let (w, n) = (waiter.clone(), name.clone());
        let task = tokio::spawn(async move { w.pop(&n, LONG, 20 * SEC).await });
        sleep(300 * MS).await;
        let pushed_at = Instant::now();
        pusher.push(&name, format!("wake {round}")).await.unwrap();
        let d = timeout(5 * SEC, task)
            .await
            .expect("the pop returned")
            .unwrap()
            .unwrap()
            .expect("the pushed message");
        assert!(
            pushed_at.elapsed() < SEC,
            "woken only after {:?}",
            pushed_at.elapsed()
        );
        assert_eq!(d.payload(), format!("wake {round}").as_bytes());
        d.ack().await.unwrap();
    }
    assert!(calls(&server, "publish") > pubs);

    // A delayed push wakes a waiter only when it comes due before anything
    // else the waiter was told of. The pop waits once its attempt after
    // subscribing has refreshed the lane's waiting mark (the mark of the
    // rounds above is still live, so the pushes would publish without it:
    // only the pop's own refresh says it listens).
    let state = format!("coord:queue:{{{name}}}");
    let mark = || {
        server
            .command(&["HGET", &state, "w0"])
            .as_str()
            .map(|v| v.parse::<i64>().unwrap())
    };
    let before = mark();
    let (w, n) = (waiter.clone(), name.clone());
    let task = tokio::spawn(async move { w.pop(&n, LONG, 5 * SEC).await });
    until("the pop waits", 5 * SEC, || async { mark() > before }).await;
    let pubs = calls(&server, "publish");
    let later = PushOptions::new().delay(20 * SEC);
    pusher.push_with(&name, b"in 20 s", &later).await.unwrap();
    assert_eq!(
        calls(&server, "publish"),
        pubs + 1,
        "the soonest delayed push"
    );
    let latest = PushOptions::new().delay(30 * SEC);
    pusher.push_with(&name, b"in 30 s", &latest).await.unwrap();
    assert_eq!(calls(&server, "publish"), pubs + 1, "a later delayed push");
    assert!(task.await.unwrap().unwrap().is_none());
    assert_eq!(pusher.purge(&name).await.unwrap(), 2);
}
