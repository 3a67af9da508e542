//! The lock queue in one client: one-shot attempts beside waiters, handoff
//! between waiters of one shared client, release after expiry.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::testkit::etcd;
use coord_core::{Attempt, Lock, OwnerToken};
use coord_etcd::{EtcdBackend, EtcdOptions};
use tokio::time::{Instant, sleep, timeout};

async fn backend() -> Arc<EtcdBackend> {
    EtcdBackend::connect(EtcdOptions::parse(&etcd::shared().url()).unwrap())
        .await
        .expect("connect to the test etcd")
}

fn granted(a: Attempt) -> u64 {
    match a {
        Attempt::Granted(t) => t.get(),
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// A refused one-shot attempt leaves no key, even while another task of
/// the same client waits on the name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shot_beside_a_local_waiter_leaves_no_ghost() {
    let a = backend().await;
    let b = backend().await;
    let c = backend().await;
    let name = "ghost";
    let t = b.capabilities().min_ttl * 10;
    let (oh, ow, oone, oc) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    granted(a.try_acquire(name, oh.step(), t).await.unwrap());
    // A waiter in b, as coord-core's wait loop makes one: attempt,
    // subscribe, attempt again (now queued).
    assert!(matches!(
        b.try_acquire(name, ow.step(), t).await.unwrap(),
        Attempt::Held { .. }
    ));
    let w = Lock::subscribe(&*b, name, &ow).await.unwrap();
    assert!(matches!(
        b.try_acquire(name, ow.step(), t).await.unwrap(),
        Attempt::Held { .. }
    ));
    // A one-shot in b while the waiter waits: refused.
    assert!(matches!(
        b.try_acquire(name, oone.step(), t).await.unwrap(),
        Attempt::Held { .. }
    ));
    {
        let notified = w.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        assert!(a.release(name, oh.step()).await.unwrap());
        let _ = timeout(Duration::from_secs(3), notified).await;
    }
    granted(b.try_acquire(name, ow.step(), t).await.unwrap());
    assert!(b.release(name, ow.step()).await.unwrap());
    drop(w);
    // Had the one-shot left a key in the queue, c would be refused now.
    let start = Instant::now();
    let got = c.try_acquire(name, oc.step(), t).await.unwrap();
    assert!(
        matches!(got, Attempt::Granted(_)),
        "the refused one-shot left a ghost in the queue: {got:?} ({:?})",
        start.elapsed()
    );
    assert!(c.release(name, oc.step()).await.unwrap());
}

/// The median round trips of a read and of a write on the shared etcd
/// (for reports).
async fn round_trips() -> (Duration, Duration) {
    let mut raw = etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap();
    let (mut r, mut w) = (Vec::new(), Vec::new());
    for _ in 0..50 {
        let s = Instant::now();
        raw.get("rtt", None).await.unwrap();
        r.push(s.elapsed());
        let s = Instant::now();
        raw.put("rtt", "", None).await.unwrap();
        w.push(s.elapsed());
    }
    r.sort();
    w.sort();
    (r[r.len() / 2], w[w.len() / 2])
}

/// 8 waiters, each on `clients[i % clients.len()]`, take `name` 4 times
/// each; the time from a holder's release call to the next grant, sorted.
async fn handoffs(clients: Vec<coord_core::Coord>, name: &'static str) -> Vec<Duration> {
    const WAITERS: usize = 8;
    const ROUNDS: usize = 4;
    // (released at, granted at) pairs, in order.
    let released: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let handoffs: Arc<Mutex<Vec<Duration>>> = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let locks = clients[i % clients.len()].locks().unwrap();
        let (released, handoffs) = (released.clone(), handoffs.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let g = locks
                    .acquire(name, Duration::from_secs(10), Duration::from_secs(60))
                    .await
                    .expect("acquire");
                let now = Instant::now();
                if let Some(r) = released.lock().unwrap().take() {
                    handoffs.lock().unwrap().push(now - r);
                }
                sleep(Duration::from_millis(5)).await;
                *released.lock().unwrap() = Some(Instant::now());
                g.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        timeout(Duration::from_secs(120), t)
            .await
            .expect("the waiters did not finish")
            .unwrap();
    }
    let mut h = handoffs.lock().unwrap().clone();
    h.sort();
    assert!(h.len() >= WAITERS * ROUNDS - 2, "{} handoffs", h.len());
    let (read, write) = round_trips().await;
    let p50 = h[h.len() / 2];
    let max = *h.last().unwrap();
    eprintln!(
        "{name}: {} handoffs: p50 {p50:?} ({:.1} write round trips of {write:?}; reads take \
         {read:?}), p90 {:?}, max {max:?}",
        h.len(),
        p50.as_secs_f64() / write.as_secs_f64(),
        h[h.len() * 9 / 10]
    );
    assert!(p50 < Duration::from_millis(50), "p50 handoff {p50:?}");
    assert!(max < Duration::from_secs(1), "slowest handoff {max:?}");
    h
}

/// 8 waiters on one shared client, polling every 10 s: each release
/// hands over to the next waiter within a few round trips.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn handoff_between_waiters_of_one_client_is_prompt() {
    let coord = coord_etcd::connect(&etcd::shared().url())
        .await
        .unwrap()
        .with_poll_interval(Duration::from_secs(10));
    handoffs(vec![coord], "shared-handoff").await;
}

/// The same with each of the 8 waiters on a client of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn handoff_between_waiters_of_separate_clients_is_prompt() {
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(
            coord_etcd::connect(&etcd::shared().url())
                .await
                .unwrap()
                .with_poll_interval(Duration::from_secs(10)),
        );
    }
    handoffs(clients, "separate-handoff").await;
}

/// A release after the claim's TTL ran out never reports success.
/// The TTL counts from when the acquire was sent, which is after `start`
/// was read, by a little or (on a loaded machine) by milliseconds; so the
/// release is timed from when the grant came back, after every point the
/// TTL can count from (timed from `start`, a release 1.0028 s after
/// `start` on a fresh CI machine was told, rightly, that it still held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_the_ttl_is_not_held() {
    let a = backend().await;
    let t = a.capabilities().min_ttl;
    for i in 0..8u64 {
        let name = format!("late-release-{i}");
        let o = OwnerToken::random();
        let start = Instant::now();
        granted(a.try_acquire(&name, o.step(), t).await.unwrap());
        let returned = Instant::now();
        sleep(
            (returned + t + Duration::from_micros(i * 400))
                .saturating_duration_since(Instant::now()),
        )
        .await;
        let r = a.release(&name, o.step()).await.unwrap();
        assert!(
            !r,
            "release {:?} after the grant said it still held",
            start.elapsed()
        );
    }
}

/// A waiter's write applied after its cleanup (as a put forwarded by a
/// follower, or retried across a leader change, can land after the
/// delete) is replayed by hand: it must fail, or the key must expire within
/// its TTL, never stay held while the client lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_applied_after_its_cleanup_does_not_outlive_the_ttl() {
    let a = backend().await;
    let b = backend().await;
    let name = "late-write";
    let t = b.capabilities().min_ttl * 2;
    let (oh, ow) = (OwnerToken::random(), OwnerToken::random());
    granted(a.try_acquire(name, oh.step(), t).await.unwrap());
    let w = Lock::subscribe(&*b, name, &ow).await.unwrap();
    for _ in 0..2 {
        assert!(matches!(
            b.try_acquire(name, ow.step(), t).await.unwrap(),
            Attempt::Held { .. }
        ));
    }
    let mut raw = etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap();
    // Claim keys are named by their lease; the owner's hex is the value.
    let queued = raw
        .get(
            format!("coord:lock/{name}/"),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let kv = queued
        .kvs()
        .iter()
        .find(|kv| kv.value() == ow.to_hex().as_bytes())
        .expect("the waiter is queued");
    let (key, lease) = (kv.key().to_vec(), kv.lease());
    // The cleanup (what coord-core does when the acquire is cancelled).
    assert!(!b.release(name, ow.step()).await.unwrap());
    drop(w);
    // The late write: the waiter's put, applied now.
    let late = raw
        .put(
            key.clone(),
            ow.to_hex(),
            Some(etcd_client::PutOptions::new().with_lease(lease)),
        )
        .await;
    if late.is_ok() {
        sleep(t + Duration::from_millis(1500)).await;
        let left = raw.get(key, None).await.unwrap();
        assert!(
            left.kvs().is_empty(),
            "a write applied after its cleanup is still there after the TTL"
        );
    }
    assert!(a.release(name, oh.step()).await.unwrap());
}

/// With several waiters of one name in one client, a release wakes the
/// waiter whose predecessor left, and only it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiter_whose_predecessor_left_is_woken_alone() {
    let a = backend().await;
    let b = backend().await;
    let name = "targeted";
    let t = b.capabilities().min_ttl * 10;
    let oh = OwnerToken::random();
    granted(a.try_acquire(name, oh.step(), t).await.unwrap());
    let mut waiters = Vec::new();
    for _ in 0..3 {
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
        waiters.push((o, w));
    }
    for i in 0..waiters.len() {
        // Every later waiter waits, the last one longest (a wake-up shared
        // by all would reach it first).
        let mut pending: Vec<_> = waiters[i..]
            .iter()
            .rev()
            .map(|(_, w)| {
                let mut n = Box::pin(w.notified());
                n.as_mut().enable();
                n
            })
            .collect();
        pending.reverse();
        if i == 0 {
            assert!(a.release(name, oh.step()).await.unwrap());
        } else {
            let (o, _) = &waiters[i - 1];
            assert!(b.release(name, o.step()).await.unwrap());
        }
        let (first, rest) = pending.split_at_mut(1);
        timeout(Duration::from_secs(3), first[0].as_mut())
            .await
            .unwrap_or_else(|_| panic!("waiter {i} was not woken"));
        for (k, n) in rest.iter_mut().enumerate() {
            let woke = timeout(Duration::from_millis(200), n.as_mut())
                .await
                .is_ok();
            assert!(!woke, "waiter {} was woken too", i + 1 + k);
        }
        let (o, _) = &waiters[i];
        granted(b.try_acquire(name, o.step(), t).await.unwrap());
    }
    let (o, _) = waiters.last().unwrap();
    assert!(b.release(name, o.step()).await.unwrap());
}
