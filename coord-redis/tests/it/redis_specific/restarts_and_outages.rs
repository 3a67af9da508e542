//! The server losing its scripts or data, or going away: scripts survive
//! `SCRIPT FLUSH`, tokens keep rising across a restart, errors during an
//! outage are bounded and the client recovers, and a silently dead
//! wake-up connection is replaced.

use crate::common;
use std::time::{Duration, Instant};

use common::{SEC, backend, eventually, granted, unique};
use conformance::testkit::redis::{self as kit, CountingProxy, RedisServer, Resp};
use coord_core::{Algorithm, Attempt, Error, FencingSource, Limiter, Lock, OwnerToken, Quota};
use coord_redis::{RedisBackend, RedisOptions};

#[tokio::test]
async fn scripts_survive_script_flush() {
    // A private server: flushing the shared one would disturb the
    // round-trip counts of tests running beside this one.
    let server = &RedisServer::start();
    let b = backend(&server.url()).await;
    let name = unique("flush");
    let me = OwnerToken::random();
    granted(b.try_acquire(&name, me.step(), 10 * SEC).await.unwrap());
    assert_eq!(
        server.command(&["SCRIPT", "FLUSH"]),
        Resp::Simple("OK".into())
    );
    assert!(b.release(&name, me.step()).await.unwrap());
    server.command(&["SCRIPT", "FLUSH"]);
    let q = Quota::new(5, 10 * SEC, Algorithm::Gcra);
    assert!(b.check(&name, &q, 1).await.unwrap().allowed);
    server.command(&["SCRIPT", "FLUSH"]);
    assert!(b.next(&name).await.unwrap().get() > 0);
}

#[tokio::test]
async fn restart_loses_data_but_scripts_reload_and_tokens_keep_rising() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let name = unique("restart");
    let me = OwnerToken::random();
    let before = granted(b.try_acquire(&name, me.step(), 10 * SEC).await.unwrap());
    let fence_before = b.next(&name).await.unwrap().get();

    server.restart();

    // The restarted server has no scripts and no data: EVALSHA gets NOSCRIPT
    // and the script is loaded again; the counters are re-seeded from the
    // server clock, above every token issued before.
    let after = eventually("acquire after restart", || {
        b.try_acquire(&name, me.step(), 10 * SEC)
    })
    .await;
    let after = granted(after);
    assert!(after > before, "{after} > {before}");
    assert!(after > fence_before);
    let fence_after = eventually("fencing after restart", || b.next(&name)).await;
    assert!(fence_after.get() > fence_before);
    assert!(b.release(&name, me.step()).await.unwrap());

    // Wake-ups work again after the subscriber reconnected.
    let other = backend(&server.url()).await;
    let waiter = Lock::subscribe(&b, &name, &OwnerToken::random())
        .await
        .unwrap();
    let notified = waiter.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    let deadline = Instant::now() + Duration::from_secs(10);
    // The subscriber may still be reconnecting: release repeatedly until a
    // wake-up arrives.
    // (A release publishes only when a client with waiters was refused
    // the claim, so `b` tries once while `other` holds it.)
    let them = OwnerToken::random();
    loop {
        granted(other.try_acquire(&name, me.step(), 10 * SEC).await.unwrap());
        assert!(matches!(
            b.try_acquire(&name, them.step(), 10 * SEC).await.unwrap(),
            Attempt::Held { .. }
        ));
        other.release(&name, me.step()).await.unwrap();
        if tokio::time::timeout(Duration::from_millis(200), &mut notified)
            .await
            .is_ok()
        {
            break;
        }
        assert!(Instant::now() < deadline, "no wake-up after restart");
    }
    // And once settled, a single release's PUBLISH reaches the waiter.
    let notified = waiter.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    granted(other.try_acquire(&name, me.step(), 10 * SEC).await.unwrap());
    assert!(matches!(
        b.try_acquire(&name, them.step(), 10 * SEC).await.unwrap(),
        Attempt::Held { .. }
    ));
    assert!(other.release(&name, me.step()).await.unwrap());
    tokio::time::timeout(Duration::from_secs(2), notified)
        .await
        .expect("a release after the restart wakes the waiter");
}

#[tokio::test]
async fn unreachable_server_is_unavailable_and_bounded() {
    let port = conformance::testkit::port::free_port();
    let started = Instant::now();
    let err = RedisBackend::connect(
        RedisOptions::new(&format!("redis://:pw@127.0.0.1:{port}"))
            .connect_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(!format!("{err} {err:?}").contains(":pw@"));
}

#[tokio::test]
async fn an_outage_gives_bounded_unavailable_errors_then_recovers() {
    let server = RedisServer::start();
    let b = RedisBackend::connect(RedisOptions::new(&server.url()).timeout(Duration::from_secs(1)))
        .await
        .unwrap();
    let name = unique("outage");
    let me = OwnerToken::random();
    granted(b.try_acquire(&name, me.step(), 10 * SEC).await.unwrap());
    server.stop();
    for _ in 0..3 {
        let started = Instant::now();
        let err = b.try_acquire(&name, me.step(), 10 * SEC).await.unwrap_err();
        assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
        assert!(err.is_retryable());
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.start_again();
    let t = eventually("acquire after the outage", || {
        b.try_acquire(&name, me.step(), 10 * SEC)
    })
    .await;
    granted(t);
    assert!(b.release(&name, me.step()).await.unwrap());
}

/// A wake-up connection that dies without closing (half-open TCP: replies
/// and messages silently dropped) is found by the listener's PING and
/// replaced, so waiters are woken by notifications again instead of
/// sleeping until their polling fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silently_dead_wakeup_connection_is_detected_and_replaced() {
    let proxy = CountingProxy::start(kit::server().port());
    let holder = backend(&kit::url()).await.into_coord();
    let waiter = RedisOptions::new(&proxy.url())
        .timeout(2 * SEC)
        .connect()
        .await
        .unwrap()
        .with_poll_interval(Duration::from_secs(120));
    let name = unique("half-open");
    let held = holder
        .locks()
        .unwrap()
        .try_acquire(&name, 120 * SEC)
        .await
        .unwrap()
        .unwrap();
    let n2 = name.clone();
    let task = tokio::spawn(async move {
        let g = waiter
            .locks()
            .unwrap()
            .acquire(&n2, 30 * SEC, Duration::from_secs(90))
            .await;
        (Instant::now(), g)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.freeze_subscribers();
    // One health check period plus its timeout: the listener has noticed
    // and subscribed again on a fresh connection.
    tokio::time::sleep(coord_redis::HEALTH_CHECK + 4 * SEC).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let (got_at, g) = task.await.unwrap();
    let g = g.expect("the waiter gets the lock");
    let lag = got_at - released_at;
    assert!(
        lag < 2 * SEC,
        "waiter woke {lag:?} after release: the dead subscriber was not replaced"
    );
    g.release().await.unwrap();
}
