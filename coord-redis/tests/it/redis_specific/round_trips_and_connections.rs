//! What a client costs the server: an uncontended acquire and release
//! are two round trips, a release wakes another client's waiter by
//! pub/sub, and dropping the client closes its connections.

use crate::common;
use std::time::{Duration, Instant};

use common::{SEC, backend, granted, unique};
use conformance::testkit::proxy::FaultProxy;
use conformance::testkit::redis::{self as kit, CountingProxy, RedisServer};
use coord_core::{Attempt, Lock, OwnerToken};
use coord_redis::RedisOptions;

#[tokio::test]
async fn uncontended_acquire_and_release_cost_exactly_two_round_trips() {
    let proxy = CountingProxy::start(kit::server().port());
    let b = backend(&proxy.url()).await;
    let name = unique("roundtrips");
    let me = OwnerToken::random();
    // Warm up (first use of the connection).
    granted(b.try_acquire(&name, me.step(), 10 * SEC).await.unwrap());
    assert!(b.release(&name, me.step()).await.unwrap());

    for _ in 0..3 {
        let before = proxy.commands();
        let names_before = proxy.command_names().len();
        granted(b.try_acquire(&name, me.step(), 10 * SEC).await.unwrap());
        assert!(b.release(&name, me.step()).await.unwrap());
        let sent = proxy.commands() - before;
        let names = proxy.command_names()[names_before..].to_vec();
        assert_eq!(sent, 2, "acquire + release sent {names:?}");
        assert_eq!(names, ["EVALSHA", "EVALSHA"]);
    }
}

#[tokio::test]
async fn release_wakes_a_waiter_of_another_client_by_pubsub() {
    let url = kit::url();
    let (a, w) = (backend(&url).await, backend(&url).await);
    let name = unique("wake");
    let me = OwnerToken::random();
    granted(a.try_acquire(&name, me.step(), 30 * SEC).await.unwrap());
    let waiter = Lock::subscribe(&w, &name, &OwnerToken::random())
        .await
        .unwrap();
    let notified = waiter.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    assert!(matches!(
        w.try_acquire(&name, OwnerToken::random().step(), 30 * SEC)
            .await
            .unwrap(),
        Attempt::Held { .. }
    ));
    assert!(a.release(&name, me.step()).await.unwrap());
    tokio::time::timeout(Duration::from_secs(2), notified)
        .await
        .expect("the release's PUBLISH wakes the waiter");
}

#[tokio::test]
async fn dropping_the_client_closes_its_connections() {
    let server = RedisServer::start();
    let clients = |s: &RedisServer| {
        let info = s.command(&["INFO", "clients"]);
        let text = info.as_str().unwrap_or_default().to_string();
        text.lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .and_then(|v| v.trim().parse::<i64>().ok())
            .unwrap()
    };
    let base = clients(&server);
    let coord = coord_redis::connect(&server.url()).await.unwrap();
    // Command connection + subscriber connection.
    assert_eq!(clients(&server), base + 2);
    drop(coord);
    let deadline = Instant::now() + Duration::from_secs(5);
    while clients(&server) != base {
        assert!(
            Instant::now() < deadline,
            "connections (subscriber task) outlived the client"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Connecting loads every script in one request, which a busy or distant
/// server answers far later than a call: the connect limit bounds it, not
/// the call timeout, so a client with short call timeouts still connects.
#[tokio::test]
async fn a_script_load_slower_than_the_call_timeout_is_bounded_by_the_connect_limit() {
    let proxy = FaultProxy::start(kit::server().port());
    proxy.slow_requests(b"SCRIPT", Duration::from_millis(800));
    let coord = RedisOptions::new(&format!("redis://127.0.0.1:{}", proxy.port()))
        .timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("the script load is within the 5 s connect limit");
    // Its calls keep their short timeout, and pass.
    let locks = coord.locks().unwrap();
    let guard = locks
        .try_acquire(&unique("slowload"), 10 * SEC)
        .await
        .unwrap()
        .expect("free");
    guard.release().await.unwrap();
}
