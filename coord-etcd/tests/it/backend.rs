//! The etcd backend's own tests, on the raw traits, against a real
//! single-node etcd started by the test kit.

use std::sync::Arc;
use std::time::Duration;

use conformance::testkit::etcd;
use coord_core::{
    Algorithm, Attempt, Barrier, Election, Error, FencingSource, Lease, Limiter, Lock, OwnerToken,
    Quota,
};
use coord_etcd::{EtcdBackend, EtcdOptions};
use tokio::time::{Instant, sleep, timeout};

async fn backend() -> Arc<EtcdBackend> {
    EtcdBackend::connect(EtcdOptions::parse(&etcd::shared().url()).unwrap())
        .await
        .expect("connect to the test etcd")
}

fn ttl(b: &EtcdBackend) -> Duration {
    b.capabilities().min_ttl
}

fn granted(a: Attempt) -> u64 {
    match a {
        Attempt::Granted(t) => t.get(),
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[tokio::test]
async fn capabilities_are_honest() {
    let b = backend().await;
    let c = b.capabilities();
    assert_eq!(c.backend, "etcd");
    assert_eq!(c.ttl_granularity, Duration::from_secs(1));
    assert!(c.min_ttl >= Duration::from_secs(1));
    assert!(c.fair && c.notifications && !c.server_clock);
}

#[tokio::test]
async fn lock_grant_is_idempotent_exclusive_and_releasable() {
    let a = backend().await;
    let b = backend().await;
    let (o1, o2) = (OwnerToken::random(), OwnerToken::random());
    let name = "basic/with slash";
    let t1 = granted(a.try_acquire(name, &o1, ttl(&a)).await.unwrap());
    assert_eq!(
        granted(a.try_acquire(name, &o1, ttl(&a)).await.unwrap()),
        t1
    );
    assert!(matches!(
        b.try_acquire(name, &o2, ttl(&b)).await.unwrap(),
        Attempt::Held { .. }
    ));
    // A lock named like the queue's parent never collides.
    granted(b.try_acquire("basic", &o2, ttl(&b)).await.unwrap());
    assert!(!b.release(name, &o2).await.unwrap());
    assert!(a.extend(name, &o1, ttl(&a)).await.unwrap());
    assert!(a.release(name, &o1).await.unwrap());
    assert!(!a.release(name, &o1).await.unwrap());
    assert!(!a.extend(name, &o1, ttl(&a)).await.unwrap());
    let t2 = granted(b.try_acquire(name, &o2, ttl(&b)).await.unwrap());
    assert!(t2 > t1);
    assert!(b.force_release(name).await.unwrap());
    assert!(!b.extend(name, &o2, ttl(&b)).await.unwrap());
    assert!(!b.force_release(name).await.unwrap());
    assert!(b.release("basic", &o2).await.unwrap());
}

#[tokio::test]
async fn lock_expires_at_its_ttl_without_extend_and_is_not_resurrected() {
    let a = backend().await;
    let b = backend().await;
    let (o1, o2) = (OwnerToken::random(), OwnerToken::random());
    let name = "expiry";
    let t = ttl(&a);
    let start = Instant::now();
    granted(a.try_acquire(name, &o1, t).await.unwrap());
    // Still held just before the TTL ...
    sleep(t.saturating_sub(Duration::from_millis(300))).await;
    assert!(matches!(
        b.try_acquire(name, &o2, t).await.unwrap(),
        Attempt::Held { .. }
    ));
    // ... free soon after it: the server expires the claim's own lease
    // (etcd looks for expired leases every 500 ms).
    sleep((start + t).saturating_duration_since(Instant::now())).await;
    loop {
        if let Attempt::Granted(_) = b.try_acquire(name, &o2, t).await.unwrap() {
            break;
        }
        assert!(
            start.elapsed() < t + Duration::from_millis(1500),
            "still held {:?} after a grant with TTL {t:?}",
            start.elapsed()
        );
        sleep(Duration::from_millis(50)).await;
    }
    eprintln!("free {:?} after a grant with TTL {t:?}", start.elapsed());
    assert!(!a.extend(name, &o1, t).await.unwrap());
    assert!(!a.release(name, &o1).await.unwrap());
    assert!(b.release(name, &o2).await.unwrap());
}

#[tokio::test]
async fn extend_keeps_the_token_and_can_change_the_ttl() {
    let a = backend().await;
    let o = OwnerToken::random();
    let name = "extend";
    let t = ttl(&a);
    let tok = granted(a.try_acquire(name, &o, t).await.unwrap());
    assert!(a.extend(name, &o, t * 3).await.unwrap());
    sleep(t + Duration::from_millis(300)).await;
    // Extended to 3x: still ours, same token.
    assert_eq!(granted(a.try_acquire(name, &o, t * 3).await.unwrap()), tok);
    assert!(a.extend(name, &o, t).await.unwrap());
    assert!(a.release(name, &o).await.unwrap());
}

/// Waiters queue in FIFO order and each release wakes exactly the next one.
#[tokio::test]
async fn fifo_queue_wakes_exactly_the_next_waiter() {
    let holder = backend().await;
    let name = "fifo";
    let t = ttl(&holder) * 5;
    let o0 = OwnerToken::random();
    let first = granted(holder.try_acquire(name, &o0, t).await.unwrap());
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let b = backend().await;
        let o = OwnerToken::random();
        // As coord-core's wait loop: attempt, subscribe, attempt (queued).
        assert!(matches!(
            b.try_acquire(name, &o, t).await.unwrap(),
            Attempt::Held { .. }
        ));
        let w = Lock::subscribe(&*b, name, &o).await.unwrap();
        assert!(matches!(
            b.try_acquire(name, &o, t).await.unwrap(),
            Attempt::Held { .. }
        ));
        waiters.push((b, o, w));
    }
    let mut last = first;
    assert!(holder.release(name, &o0).await.unwrap());
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
        let tok = granted(b.try_acquire(name, o, t).await.unwrap());
        assert!(tok > last);
        last = tok;
        assert!(b.release(name, o).await.unwrap());
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
    granted(a.try_acquire(name, &o1, t).await.unwrap());
    assert!(matches!(
        b.try_acquire(name, &o2, t).await.unwrap(),
        Attempt::Held { .. }
    ));
    assert!(a.release(name, &o1).await.unwrap());
    // Had b's attempt queued a key, c could not get the lock now.
    granted(c.try_acquire(name, &o3, t).await.unwrap());
    assert!(c.release(name, &o3).await.unwrap());
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
    granted(a.try_acquire(name, &o1, t).await.unwrap());
    for _ in 0..2 {
        assert!(matches!(
            b.try_acquire(name, &o2, t).await.unwrap(),
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
        b.try_acquire(name, &o2, t).await.unwrap(),
        Attempt::Held { .. }
    ));
    let again = b.claim_leases();
    assert_eq!(again.len(), 1);
    assert_ne!(again[0], leases[0]);
    assert!(a.release(name, &o1).await.unwrap());
    let start = Instant::now();
    loop {
        if let Attempt::Granted(_) = b.try_acquire(name, &o2, t).await.unwrap() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "not granted after release"
        );
        sleep(Duration::from_millis(20)).await;
    }
    assert!(b.release(name, &o2).await.unwrap());
}

#[tokio::test]
async fn fencing_tokens_strictly_increase() {
    let a = backend().await;
    let b = backend().await;
    let mut last = 0;
    for i in 0..20 {
        let src: &EtcdBackend = if i % 2 == 0 { &a } else { &b };
        let t = src.next("fence-res").await.unwrap().get();
        assert!(t > last);
        last = t;
    }
}

#[tokio::test]
async fn election_campaign_leader_resign_and_wakeups() {
    let a = backend().await;
    let b = backend().await;
    let name = "elect";
    let t = ttl(&a) * 2;
    let (o1, o2) = (OwnerToken::random(), OwnerToken::random());
    assert_eq!(a.leader(name).await.unwrap(), None);
    let term1 = granted(a.try_campaign(name, "alice", &o1, t).await.unwrap());
    assert_eq!(
        granted(a.try_campaign(name, "alice", &o1, t).await.unwrap()),
        term1
    );
    let w = Election::subscribe(&*b, name).await.unwrap();
    assert!(matches!(
        b.try_campaign(name, "bob", &o2, t).await.unwrap(),
        Attempt::Held { .. }
    ));
    let l = a.leader(name).await.unwrap().unwrap();
    assert_eq!((l.candidate.as_str(), l.term.get()), ("alice", term1));
    assert!(Election::renew(&*a, name, &o1, t).await.unwrap());
    let notified = w.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    assert!(a.resign(name, &o1).await.unwrap());
    timeout(Duration::from_secs(3), notified)
        .await
        .expect("the watch wakes the other candidate");
    let term2 = granted(b.try_campaign(name, "bob", &o2, t).await.unwrap());
    assert!(term2 > term1);
    assert_eq!(b.leader(name).await.unwrap().unwrap().candidate, "bob");
    assert!(!Election::renew(&*a, name, &o1, t).await.unwrap());
    assert!(b.resign(name, &o2).await.unwrap());
    assert_eq!(b.leader(name).await.unwrap(), None);
}

#[tokio::test]
async fn barrier_generations_idempotence_and_party_mismatch() {
    let a = backend().await;
    let b = backend().await;
    let name = "barrier";
    let w = Barrier::subscribe(&*b, name).await.unwrap();
    let r1 = a
        .arrive(name, 2, "p1", &coord_core::OwnerToken::random())
        .await
        .unwrap();
    assert!(!r1.complete);
    assert_eq!(
        a.arrive(name, 2, "p1", &coord_core::OwnerToken::random())
            .await
            .unwrap(),
        r1
    );
    let e = b
        .arrive(name, 3, "p2", &coord_core::OwnerToken::random())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert!(!a.is_complete(name, r1.generation).await.unwrap());
    let notified = w.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    let r2 = b
        .arrive(name, 2, "p2", &coord_core::OwnerToken::random())
        .await
        .unwrap();
    assert!(r2.complete);
    assert_eq!(r2.generation, r1.generation);
    timeout(Duration::from_secs(3), notified)
        .await
        .expect("completion wakes waiters");
    assert!(a.is_complete(name, r1.generation).await.unwrap());
    // Next generation; withdraw before it completes.
    let id3 = coord_core::OwnerToken::random();
    let r3 = a.arrive(name, 2, "p1", &id3).await.unwrap();
    assert_eq!(r3.generation, r1.generation + 1);
    assert!(a.withdraw(name, r3.generation, "p1", &id3).await.unwrap());
    assert!(!a.withdraw(name, r1.generation, "p1", &id3).await.unwrap());
}

#[tokio::test]
async fn limiters_admit_exactly_the_limit_across_clients() {
    let a = backend().await;
    let b = backend().await;
    for alg in Algorithm::ALL {
        let q = Quota::new(10, Duration::from_secs(30), alg);
        let key = format!("limit-{alg:?}");
        let mut admitted = 0;
        let mut tasks = Vec::new();
        for i in 0..16 {
            let be = if i % 2 == 0 { a.clone() } else { b.clone() };
            let key = key.clone();
            tasks.push(tokio::spawn(
                async move { be.check(&key, &q, 1).await.unwrap() },
            ));
        }
        for t in tasks {
            let d = t.await.unwrap();
            if d.allowed {
                admitted += 1;
            } else {
                assert!(d.retry_after > Duration::ZERO);
            }
        }
        assert_eq!(admitted, 10, "{alg:?}");
    }
}

#[tokio::test]
async fn named_leases_grant_renew_remaining_revoke_and_expire() {
    let a = backend().await;
    let b = backend().await;
    let name = "worker-7";
    let t = ttl(&a) * 2;
    let (o1, o2) = (OwnerToken::random(), OwnerToken::random());
    let tok = granted(a.grant(name, &o1, t).await.unwrap());
    assert_eq!(granted(a.grant(name, &o1, t).await.unwrap()), tok);
    assert!(matches!(
        b.grant(name, &o2, t).await.unwrap(),
        Attempt::Held { .. }
    ));
    let left = b.remaining(name).await.unwrap().expect("live");
    assert!(left <= t, "{left:?}");
    let mine = a.remaining(name).await.unwrap().expect("live");
    assert!(mine <= t && mine > t / 2, "{mine:?}");
    assert!(Lease::renew(&*a, name, &o1, t * 2).await.unwrap());
    assert!(!Lease::renew(&*b, name, &o2, t).await.unwrap());
    assert!(!b.revoke(name, &o2).await.unwrap());
    assert!(a.revoke(name, &o1).await.unwrap());
    assert_eq!(b.remaining(name).await.unwrap(), None);
    // Expiry without renew; renewing afterwards resurrects nothing.
    let t1 = ttl(&a);
    granted(b.grant(name, &o2, t1).await.unwrap());
    sleep(t1 + Duration::from_millis(300)).await;
    assert!(!Lease::renew(&*b, name, &o2, t1).await.unwrap());
    assert_eq!(a.remaining(name).await.unwrap(), None);
    granted(a.grant(name, &o1, t1).await.unwrap());
    assert!(a.revoke(name, &o1).await.unwrap());
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
            let _ = a.try_acquire(name, &o, t).await;
            let _w = Lock::subscribe(&*a, name, &o).await.unwrap();
            let _ = a.try_acquire(name, &o, t).await;
            sleep(Duration::from_secs(3600)).await;
        };
        let _ = timeout(Duration::from_micros(100 + i * 150), attempt).await;
    }
    let o = OwnerToken::random();
    let start = Instant::now();
    loop {
        match b.try_acquire(name, &o, t).await.unwrap() {
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
    assert!(b.release(name, &o).await.unwrap());
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
    granted(holder.try_acquire(name, &oh, t).await.unwrap());
    let w = Lock::subscribe(&*a, name, &o2).await.unwrap();
    // o1 queues first, then is abandoned (never attempts again).
    for o in [&o1, &o1, &o2, &o2] {
        assert!(matches!(
            a.try_acquire(name, o, t).await.unwrap(),
            Attempt::Held { .. }
        ));
    }
    let start = Instant::now();
    assert!(holder.release(name, &oh).await.unwrap());
    let mut attempts = 0;
    loop {
        let _ = timeout(Duration::from_secs(5), w.notified()).await;
        attempts += 1;
        if let Attempt::Granted(_) = a.try_acquire(name, &o2, t).await.unwrap() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "the live waiter was blocked"
        );
    }
    assert!(attempts <= 4, "{attempts} attempts: the waiter spun");
    assert!(a.release(name, &o2).await.unwrap());
    assert!(!a.release(name, &o1).await.unwrap());
}

/// Options in the URL take effect: every key under the URL's prefix; a bad
/// option fails before any connection is tried.
#[tokio::test]
async fn url_options_take_effect() {
    let prefix = format!("urlopt-{}/", std::process::id());
    let url = format!(
        "{}?prefix={prefix}&timeout=2s&connect_timeout=1s",
        etcd::shared().url()
    );
    let coord = coord_etcd::connect(&url).await.unwrap();
    let g = coord
        .locks()
        .unwrap()
        .try_acquire("from-url", Duration::from_secs(10))
        .await
        .unwrap()
        .expect("granted");
    let mut raw = etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap();
    let found = raw
        .get(
            prefix.as_bytes(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert!(
        found
            .kvs()
            .iter()
            .any(|kv| kv.key_str().unwrap().contains("from-url")),
        "no key under {prefix}"
    );
    g.release().await.unwrap();
    for bad in ["timeout=2", "prefx=a", "connect_timeout=0s"] {
        match coord_etcd::connect(&format!("etcd://127.0.0.1:1?{bad}")).await {
            Err(coord_core::Error::Config(m)) => {
                assert!(m.contains(bad.split('=').next().unwrap()), "{m}")
            }
            Err(e) => panic!("{bad}: not a Config error: {e}"),
            Ok(_) => panic!("{bad}: connected"),
        }
    }
}
