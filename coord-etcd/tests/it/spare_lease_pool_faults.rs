//! The spare-lease pool against a real etcd through a real TCP fault
//! proxy: lost replies (requests applied, answers
//! dropped), latency near the call timeout and connection resets while a
//! client cycles claims, then steady reuse of its spares. A spare that
//! still carried a key (of a lost-reply acquire, a timed-out txn applied
//! later) would keep that key alive for as long as the pool is busy.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::testkit::etcd::EtcdServer;
use conformance::testkit::proxy::{FaultProxy, Mode};
use coord_core::{Attempt, Lock, OwnerToken};
use coord_etcd::{EtcdBackend, EtcdOptions};
use etcd_client::GetOptions;
use tokio::time::{Instant, sleep};

async fn fast(port: u16) -> Arc<EtcdBackend> {
    let url = format!("etcd://127.0.0.1:{port}?timeout_ms=500");
    EtcdBackend::connect(EtcdOptions::parse(&url).unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_key_outlives_its_ttl_while_the_pool_reuses_spares_after_lost_replies() {
    let server = EtcdServer::start();
    let proxy = FaultProxy::start(server.client_port());
    let a = fast(proxy.port()).await;
    let ttl = Duration::from_secs(2);
    // The last time A began an operation on each faulted name.
    let touched: Arc<Mutex<HashMap<String, Instant>>> = Default::default();
    let stop = Arc::new(AtomicBool::new(false));
    let faulted = {
        let (a, touched, stop) = (a.clone(), touched.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut i, mut errors, mut grants) = (0u32, 0u32, 0u32);
            while !stop.load(Ordering::SeqCst) {
                let name = format!("faulted-{}", i % 12);
                i += 1;
                let owner = OwnerToken::random();
                touched.lock().unwrap().insert(name.clone(), Instant::now());
                let r = a.try_acquire(&name, owner.step(), ttl).await;
                match &r {
                    Ok(Attempt::Granted(_)) => grants += 1,
                    Err(_) => errors += 1,
                    Ok(_) => {}
                }
                match r {
                    Ok(Attempt::Granted(_)) | Err(_) => {
                        touched.lock().unwrap().insert(name.clone(), Instant::now());
                        let _ = a.release(&name, owner.step()).await;
                    }
                    Ok(_) => {}
                }
            }
            (errors, grants)
        })
    };
    // 4 s of faults: lost replies, latency around the call timeout, resets.
    let began = Instant::now();
    let mut k = 0u32;
    while began.elapsed() < Duration::from_secs(4) {
        match k % 4 {
            0 => proxy.set(Mode::DropReplies),
            1 => {
                proxy.heal();
                proxy.latency(Duration::from_millis(120));
            }
            2 => {
                proxy.reset();
                proxy.heal();
            }
            _ => proxy.heal(),
        }
        k += 1;
        sleep(Duration::from_millis(170 + u64::from(k % 3) * 60)).await;
    }
    proxy.heal();
    stop.store(true, Ordering::SeqCst);
    let (errors, grants) = faulted.await.unwrap();
    assert!(
        errors > 0 && grants > 0,
        "the faults did not bite: {errors} errors, {grants} grants"
    );
    let quiet = Instant::now();

    // Now the pool is busy: claims of the same TTL reuse its spares.
    let busy_stop = Arc::new(AtomicBool::new(false));
    let busy = {
        let (a, stop) = (a.clone(), busy_stop.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let name = format!("busy-{}", n % 4);
                n += 1;
                let owner = OwnerToken::random();
                if let Ok(Attempt::Granted(_)) = a.try_acquire(&name, owner.step(), ttl).await {
                    let _ = a.release(&name, owner.step()).await;
                }
            }
            n
        })
    };
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    // etcd checks expiry every 500 ms; a lease's TTL counts from its last
    // grant or keepalive, which the server got at most a call timeout
    // (500 ms) plus the proxy's latency after the operation began.
    let slack = Duration::from_millis(2000);
    let mut seen_late = Vec::new();
    while quiet.elapsed() < Duration::from_secs(8) {
        let now = Instant::now();
        let kvs = raw
            .get("", Some(GetOptions::new().with_all_keys()))
            .await
            .unwrap()
            .take_kvs();
        let t = touched.lock().unwrap().clone();
        for kv in kvs {
            let key = String::from_utf8_lossy(kv.key()).to_string();
            for (name, at) in &t {
                if key.contains(&format!("/{name}/")) && now > *at + ttl + slack {
                    seen_late.push((key.clone(), kv.lease(), now - *at));
                }
            }
        }
        sleep(Duration::from_millis(100)).await;
    }
    busy_stop.store(true, Ordering::SeqCst);
    let cycles = busy.await.unwrap();
    assert!(cycles > 20, "the pool was not busy: {cycles} cycles");
    assert!(
        seen_late.is_empty(),
        "keys outlived their TTL while the pool was busy: {:?}",
        &seen_late[..seen_late.len().min(5)]
    );
}

/// Two waiters in one client, the holder in another, a long polling
/// fallback: the first waiter takes the lock at the release and releases
/// it at once (its lease goes back to the pool); the second must get the
/// lock within a round trip or two, not at its fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_local_waiter_is_woken_after_the_first_hands_over() {
    let server = EtcdServer::start();
    let holder = coord_etcd::connect(&server.url()).await.unwrap();
    let waiters = coord_etcd::connect(&server.url())
        .await
        .unwrap()
        .with_poll_interval(Duration::from_secs(120));
    let ttl = Duration::from_secs(60);
    let held = holder
        .locks()
        .unwrap()
        .try_acquire("two-local", ttl)
        .await
        .unwrap()
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let w = waiters.clone();
        tasks.push(tokio::spawn(async move {
            let g = w
                .locks()
                .unwrap()
                .acquire("two-local", ttl, Duration::from_secs(20))
                .await
                .expect("the waiter gets the lock");
            let at = Instant::now();
            g.release().await.unwrap();
            at
        }));
    }
    sleep(Duration::from_millis(500)).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let mut got = Vec::new();
    for t in tasks {
        got.push(t.await.unwrap());
    }
    got.sort();
    let lag = got[1] - released_at;
    assert!(
        lag < Duration::from_secs(2),
        "the second local waiter got the lock {lag:?} after the first release"
    );
}

/// A grant on a reused spare (one that the server would otherwise expire
/// about half a TTL from now), over a slow link, then the link is cut (no
/// keepalive after the grant): the server must keep the key at least until
/// the grant's local deadline (attempt start + TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_on_a_reused_spare_lives_its_full_ttl_on_the_server() {
    let server = EtcdServer::start();
    let proxy = FaultProxy::start(server.client_port());
    let a = {
        let url = format!("etcd://127.0.0.1:{}?timeout_ms=2000", proxy.port());
        EtcdBackend::connect(EtcdOptions::parse(&url).unwrap())
            .await
            .unwrap()
    };
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let ttl = Duration::from_secs(3);
    let o = OwnerToken::random();
    assert!(matches!(
        a.try_acquire("spare-x", o.step(), ttl).await.unwrap(),
        Attempt::Granted(_)
    ));
    assert!(a.release("spare-x", o.step()).await.unwrap());
    let leases_before: Vec<i64> = raw
        .leases()
        .await
        .unwrap()
        .leases()
        .iter()
        .map(|l| l.id())
        .collect();
    // The spare is now good for a little more than half its TTL.
    sleep(Duration::from_millis(1300)).await;
    proxy.latency(Duration::from_millis(150));
    let start = Instant::now();
    let o2 = OwnerToken::random();
    assert!(matches!(
        a.try_acquire("spare-y", o2.step(), ttl).await.unwrap(),
        Attempt::Granted(_)
    ));
    proxy.blackhole();
    let kv = raw
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .unwrap()
        .take_kvs()
        .into_iter()
        .find(|kv| String::from_utf8_lossy(kv.key()).contains("spare-y"))
        .expect("the key of the grant");
    assert!(
        leases_before.contains(&kv.lease()),
        "the grant did not reuse the spare (lease {} not in {leases_before:?})",
        kv.lease()
    );
    loop {
        let present = raw
            .get("", Some(GetOptions::new().with_all_keys()))
            .await
            .unwrap()
            .take_kvs()
            .iter()
            .any(|kv| String::from_utf8_lossy(kv.key()).contains("spare-y"));
        if !present {
            break;
        }
        sleep(Duration::from_millis(25)).await;
    }
    let gone = start.elapsed();
    assert!(
        gone >= ttl,
        "the server expired the key {gone:?} after the attempt began, before its TTL {ttl:?}"
    );
    proxy.heal();
}

/// An attempt of TTL 30 s whose reply is lost (its key landed), retried by
/// the same owner with TTL 2 s: the retry adopts the landed key and its
/// 30 s lease. After the release that lease must not serve as a 2 s spare:
/// a later 2 s claim on it would live 30 s on the server if its holder
/// died.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_adopted_after_a_lost_reply_is_not_pooled_under_another_ttl() {
    let server = EtcdServer::start();
    let proxy = FaultProxy::start(server.client_port());
    let a = fast(proxy.port()).await;
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    // A 30 s spare, so that the attempt below sends its write at once
    // (no lease grant first, whose reply would be lost).
    let w = OwnerToken::random();
    let long = Duration::from_secs(30);
    assert!(matches!(
        a.try_acquire("adopt-warmup", w.step(), long).await.unwrap(),
        Attempt::Granted(_)
    ));
    assert!(a.release("adopt-warmup", w.step()).await.unwrap());
    let o = OwnerToken::random();
    proxy.set(Mode::DropReplies);
    assert!(a.try_acquire("adopt-x", o.step(), long).await.is_err());
    proxy.reset();
    proxy.heal();
    let landed = raw
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .unwrap()
        .take_kvs()
        .iter()
        .any(|kv| String::from_utf8_lossy(kv.key()).contains("adopt-x"));
    assert!(landed, "the attempt whose reply was lost did not land");
    let short = Duration::from_secs(2);
    let mut granted = false;
    for _ in 0..20 {
        if let Ok(Attempt::Granted(_)) = a.try_acquire("adopt-x", o.step(), short).await {
            granted = true;
            break;
        }
        sleep(Duration::from_millis(100)).await;
    }
    assert!(granted, "the retry was not granted");
    assert!(a.release("adopt-x", o.step()).await.unwrap());
    let o2 = OwnerToken::random();
    assert!(matches!(
        a.try_acquire("adopt-y", o2.step(), short).await.unwrap(),
        Attempt::Granted(_)
    ));
    let kv = raw
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .unwrap()
        .take_kvs()
        .into_iter()
        .find(|kv| String::from_utf8_lossy(kv.key()).contains("adopt-y"))
        .expect("the key of the grant");
    let ttl = raw.lease_time_to_live(kv.lease(), None).await.unwrap();
    assert!(
        ttl.granted_ttl() <= 2 && ttl.ttl() <= 3,
        "a 2 s claim sits on a lease of granted TTL {} s ({} s left)",
        ttl.granted_ttl(),
        ttl.ttl()
    );
}
