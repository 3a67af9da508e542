//! Waiting for a lock: waiters are woken in FIFO order, a one-shot attempt
//! leaves no key, a waiter whose key vanished queues again, cancelled
//! attempts hold nothing past the TTL, and an abandoned local waiter does
//! not block the live one.

use std::time::Duration;

use conformance::testkit::etcd;
use coord_core::{Attempt, Lock, OwnerToken};
use coord_etcd::{EtcdBackend, EtcdOptions};
use tokio::time::{Instant, sleep, timeout};

use super::{backend, granted, ttl};

/// Waiters queue in FIFO order and each release wakes exactly the next one.
#[tokio::test]
async fn fifo_queue_wakes_exactly_the_next_waiter() {
    let holder = backend().await;
    let name = "fifo";
    let t = ttl(&holder) * 5;
    let o0 = OwnerToken::random();
    let first = granted(holder.try_acquire(name, o0.step(), t).await.unwrap());
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let b = backend().await;
        let o = OwnerToken::random();
        // As coord-core's wait loop: attempt, subscribe, attempt (queued).
        assert!(matches!(
            b.try_acquire(name, o.step(), t).await.unwrap(),
            Attempt::Held { .. }
        ));
        let w = Lock::subscribe(&*b, name, &o).await.unwrap();
        assert!(matches!(
            b.try_acquire(name, o.step(), t).await.unwrap(),
            Attempt::Held { .. }
        ));
        waiters.push((b, o, w));
    }
    let mut last = first;
    assert!(holder.release(name, o0.step()).await.unwrap());
    for i in 0..waiters.len() {
        // Only waiter i is woken.
        for (j, (_, _, w)) in waiters.iter().enumerate().skip(i) {
            let woke = timeout(
                Duration::from_millis(if j == i { 3000 } else { 300 }),
                w.notified(),
            )
            .await
            .is_ok();
            assert_eq!(woke, j == i, "waiter {j} woken={woke} after release {i}");
        }
        let (b, o, _) = &waiters[i];
        let tok = granted(b.try_acquire(name, o.step(), t).await.unwrap());
        assert!(tok > last);
        last = tok;
        assert!(b.release(name, o.step()).await.unwrap());
    }
}

/// A one-shot attempt (nobody subscribed) that loses writes nothing.
#[tokio::test]
async fn one_shot_attempt_leaves_no_key() {
    let a = backend().await;
    let b = backend().await;
    let c = backend().await;
    let name = "oneshot";
    let t = ttl(&a);
    let (o1, o2, o3) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    granted(a.try_acquire(name, o1.step(), t).await.unwrap());
    assert!(matches!(
        b.try_acquire(name, o2.step(), t).await.unwrap(),
        Attempt::Held { .. }
    ));
    assert!(a.release(name, o1.step()).await.unwrap());
    // Had b's attempt queued a key, c could not get the lock now.
    granted(c.try_acquire(name, o3.step(), t).await.unwrap());
    assert!(c.release(name, o3.step()).await.unwrap());
}

/// A queued waiter whose key vanished (its lease expired or was revoked)
/// queues again at its next attempt and keeps waiting: never an error, and
/// never a grant it does not hold.
#[tokio::test]
async fn queued_waiter_whose_key_vanished_queues_again() {
    let a = backend().await;
    let b = backend().await;
    let name = "waiter-lost";
    let t = ttl(&a) * 3;
    let (o1, o2) = (OwnerToken::random(), OwnerToken::random());
    granted(a.try_acquire(name, o1.step(), t).await.unwrap());
    for _ in 0..2 {
        assert!(matches!(
            b.try_acquire(name, o2.step(), t).await.unwrap(),
            Attempt::Held { .. }
        ));
    }
    // Revoke the waiter's lease behind its back (as an expiry would).
    let mut raw = etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap();
    let leases = b.claim_leases();
    assert_eq!(leases.len(), 1);
    raw.lease_revoke(leases[0]).await.unwrap();
    // Still held by a: b queues again (a fresh key, a fresh lease).
    assert!(matches!(
        b.try_acquire(name, o2.step(), t).await.unwrap(),
        Attempt::Held { .. }
    ));
    let again = b.claim_leases();
    assert_eq!(again.len(), 1);
    assert_ne!(again[0], leases[0]);
    assert!(a.release(name, o1.step()).await.unwrap());
    let start = Instant::now();
    loop {
        if let Attempt::Granted(_) = b.try_acquire(name, o2.step(), t).await.unwrap() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "not granted after release"
        );
        sleep(Duration::from_millis(20)).await;
    }
    assert!(b.release(name, o2.step()).await.unwrap());
}

/// Attempts cancelled mid-flight (the future dropped at any point, as when
/// a caller's `acquire` is cancelled: its subscription goes with it) never
/// leave the lock held past its TTL.
#[tokio::test]
async fn cancelled_attempts_leave_nothing_held_past_the_ttl() {
    let a = backend().await;
    let b = backend().await;
    let name = "cancelled";
    let t = ttl(&a);
    for i in 0..30u64 {
        let o = OwnerToken::random();
        let a = a.clone();
        let attempt = async move {
            // As coord-core's wait loop: the second attempt queues.
            let _ = a.try_acquire(name, o.step(), t).await;
            let _w = Lock::subscribe(&*a, name, &o).await.unwrap();
            let _ = a.try_acquire(name, o.step(), t).await;
            sleep(Duration::from_secs(3600)).await;
        };
        let _ = timeout(Duration::from_micros(100 + i * 150), attempt).await;
    }
    let o = OwnerToken::random();
    let start = Instant::now();
    loop {
        match b.try_acquire(name, o.step(), t).await.unwrap() {
            Attempt::Granted(_) => break,
            Attempt::Held { .. } => {
                assert!(
                    start.elapsed() < t + Duration::from_secs(4),
                    "a cancelled attempt left the lock held past its TTL"
                );
                sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert!(b.release(name, o.step()).await.unwrap());
}

/// Two waiters of one name in one client, one of them abandoned after it
/// queued without any cleanup (coord-core's cleanup on cancel normally
/// removes it at once; this is the safety net when that cleanup cannot
/// reach the cluster): the live one still gets the lock after the grace
/// (two call timeouts + 2 s; 1 s call timeouts here), without spinning.
#[tokio::test]
async fn an_abandoned_local_waiter_does_not_block_the_live_one() {
    let a = EtcdBackend::connect(
        EtcdOptions::parse(&etcd::shared().url())
            .unwrap()
            .with_call_timeout(Duration::from_secs(1)),
    )
    .await
    .expect("connect to the test etcd");
    let holder = backend().await;
    let name = "abandoned-local";
    let t = ttl(&a) * 10;
    let (oh, o1, o2) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    granted(holder.try_acquire(name, oh.step(), t).await.unwrap());
    let w = Lock::subscribe(&*a, name, &o2).await.unwrap();
    // o1 queues first, then is abandoned (never attempts again).
    for o in [&o1, &o1, &o2, &o2] {
        assert!(matches!(
            a.try_acquire(name, o.step(), t).await.unwrap(),
            Attempt::Held { .. }
        ));
    }
    let start = Instant::now();
    assert!(holder.release(name, oh.step()).await.unwrap());
    let mut attempts = 0;
    loop {
        let _ = timeout(Duration::from_secs(5), w.notified()).await;
        attempts += 1;
        if let Attempt::Granted(_) = a.try_acquire(name, o2.step(), t).await.unwrap() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "the live waiter was blocked"
        );
    }
    assert!(attempts <= 4, "{attempts} attempts: the waiter spun");
    assert!(a.release(name, o2.step()).await.unwrap());
    assert!(!a.release(name, o1.step()).await.unwrap());
}
