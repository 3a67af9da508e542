//! A lock waiter whose attempt failed (its request lost on the way: a cut
//! link, a reset connection) still takes its place in the queue on its
//! next attempt, so the store wakes it when the lock is free.
//!
//! The etcd backend queues a waiter's key on the owner's attempt after a
//! refused one (coord-core attempts, subscribes, then attempts again); a
//! one-shot attempt writes only into an empty queue. An attempt that failed
//! with an error is a waiter's too (coord-core retries only inside a wait),
//! so the attempt after it must queue. Otherwise (as the fault suite's
//! `compaction_during_watches` shows, on a server with slow disk writes)
//! a waiter whose attempt died with a connection reset is refused once
//! more without queueing and sleeps until its deadline while the lock
//! stands free.

use std::sync::Arc;
use std::time::Duration;

use conformance::testkit::etcd::EtcdServer;
use conformance::testkit::proxy::FaultProxy;
use coord_core::{Attempt, Lock, OwnerToken};
use coord_etcd::{EtcdBackend, EtcdOptions};

const TTL: Duration = Duration::from_secs(10);

/// A backend on `127.0.0.1:port` with a 500 ms call timeout.
async fn fast(port: u16) -> Arc<EtcdBackend> {
    let url = format!("etcd://127.0.0.1:{port}?timeout=500ms&connect_timeout=500ms");
    EtcdBackend::connect(EtcdOptions::parse(&url).unwrap())
        .await
        .unwrap()
}

/// An attempt of `owner` through `proxy` while the proxy delivers nothing:
/// it fails (its request never reaches the server). Then the link heals.
async fn failed_attempt(b: &EtcdBackend, proxy: &FaultProxy, name: &str, owner: &OwnerToken) {
    proxy.close_after_loss(true);
    proxy.blackhole();
    let r = b.try_acquire(name, owner.step(), TTL).await;
    assert!(r.is_err(), "an attempt through a cut link answered: {r:?}");
    proxy.reset();
    proxy.heal();
}

/// An attempt of `owner`, repeated while it fails, as coord-core's wait
/// loop repeats it: the first calls after a reset can fail too (the
/// client's connection died under them).
async fn answered(b: &EtcdBackend, name: &str, owner: &OwnerToken) -> Attempt {
    for _ in 0..20 {
        match b.try_acquire(name, owner.step(), TTL).await {
            Ok(a) => return a,
            Err(e) => eprintln!("attempt failed, again: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("20 attempts in a row failed after the link healed");
}

fn granted(a: Attempt) {
    assert!(matches!(a, Attempt::Granted(_)), "not granted: {a:?}");
}

fn refused(a: Attempt) {
    assert!(matches!(a, Attempt::Held { .. }), "not refused: {a:?}");
}

/// Which of the waiter's attempts fails.
#[derive(Clone, Copy, PartialEq)]
enum Fails {
    /// Its first, before it subscribed.
    First,
    /// Its second, the one that was to queue.
    Queueing,
}

/// A holder holds `name`; a waiter behind a proxy attempts, subscribes
/// and attempts again, one of its attempts failing as `fails` says, then
/// attempts once more (refused); the holder releases. The waiter must be
/// woken by the store within 3 s, and then be granted.
async fn a_waiter_with_a_failed_attempt_is_woken(name: &str, fails: Fails) {
    let server = EtcdServer::start();
    let proxy = FaultProxy::start(server.client_port());
    let a = fast(server.client_port()).await;
    let b = fast(proxy.port()).await;
    let (oa, ob) = (OwnerToken::random(), OwnerToken::random());
    granted(a.try_acquire(name, oa.step(), TTL).await.unwrap());
    if fails == Fails::First {
        failed_attempt(&b, &proxy, name, &ob).await;
    } else {
        refused(b.try_acquire(name, ob.step(), TTL).await.unwrap());
    }
    let w = b.subscribe(name, &ob).await.unwrap();
    let notified = w.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    if fails == Fails::Queueing {
        failed_attempt(&b, &proxy, name, &ob).await;
    }
    refused(answered(&b, name, &ob).await);
    assert!(a.release(name, oa.step()).await.unwrap());
    tokio::time::timeout(Duration::from_secs(3), notified)
        .await
        .expect("the waiter was not woken within 3 s of the release: it did not queue");
    granted(answered(&b, name, &ob).await);
    assert!(b.release(name, ob.step()).await.unwrap());
}

/// The waiter's queueing attempt (its second) fails; its third must queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_queueing_attempt_failed_queues_on_the_next() {
    a_waiter_with_a_failed_attempt_is_woken("queue-after-error", Fails::Queueing).await;
}

/// The waiter's first attempt fails; the one after it subscribed must
/// queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_first_attempt_failed_queues_on_the_next() {
    a_waiter_with_a_failed_attempt_is_woken("first-error", Fails::First).await;
}

/// The holder releases while the waiter's watch of it is cut off, the
/// release is the next write after the waiter queued, and the history is
/// compacted at exactly the release's revision before the waiter's watch
/// is opened again: a watch resumed from that revision never sees the
/// deletion on etcd before 3.4.34/3.5.15 (etcd-io/etcd#18089, the tombstone
/// at the compaction revision is removed and the watch not cancelled). The
/// waiter must be woken all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_when_the_release_was_compacted_away_meanwhile() {
    let server = EtcdServer::start();
    let proxy = FaultProxy::start(server.client_port());
    let a = fast(server.client_port()).await;
    let b = fast(proxy.port()).await;
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let (oa, ob) = (OwnerToken::random(), OwnerToken::random());
    let name = "compacted-release";
    granted(a.try_acquire(name, oa.step(), TTL).await.unwrap());
    refused(b.try_acquire(name, ob.step(), TTL).await.unwrap());
    let w = b.subscribe(name, &ob).await.unwrap();
    let notified = w.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    refused(b.try_acquire(name, ob.step(), TTL).await.unwrap());
    let queued_at = raw
        .get("x", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    // Let the waiter's watch be established, then cut it off.
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.close_after_loss(true);
    proxy.blackhole();
    assert!(a.release(name, oa.step()).await.unwrap());
    let released_at = raw
        .get("x", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    assert_eq!(
        released_at,
        queued_at + 1,
        "the release was not the next write after the waiter queued"
    );
    raw.compact(
        released_at,
        Some(etcd_client::CompactionOptions::new().with_physical()),
    )
    .await
    .unwrap();
    proxy.reset();
    proxy.heal();
    tokio::time::timeout(Duration::from_secs(5), notified)
        .await
        .expect("the waiter was not woken within 5 s: its watch missed the compacted release");
    granted(answered(&b, name, &ob).await);
    assert!(b.release(name, ob.step()).await.unwrap());
}
