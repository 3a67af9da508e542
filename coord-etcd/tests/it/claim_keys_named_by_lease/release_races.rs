//! Releases racing reuse: a release through a second client hands over to
//! the local waiter, a force release removes exactly one claim each time,
//! and watchdog renewals or a dropped guard's release race a reacquire.

use crate::claim_support;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::testkit::wait::until;
use coord_core::{Error, Lock, OwnerToken};
use tokio::time::{sleep, timeout};

use claim_support::{all_keys, client, granted, owner_of, unique};

use super::{LONG, hex, lock_keys, refused, snap, until_keys};

/// Another client releases the holder by its owner token while a second
/// owner of the holder's client waits in line: the waiter is woken and
/// granted; the first client's stale extend and release of the removed
/// owner say not held and leave the new holder alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_through_a_second_client_hands_over_to_the_local_waiter() {
    let p = unique("second");
    let b = client(&p).await;
    let other = client(&p).await;
    // Spares first, so the waiter's key is a reused one.
    for _ in 0..3 {
        let o = OwnerToken::random();
        granted(b.try_acquire("h", o.step(), LONG).await);
        assert!(b.release("h", o.step()).await.unwrap());
    }
    let (o1, o2) = (OwnerToken::random(), OwnerToken::random());
    let t1 = granted(b.try_acquire("h", o1.step(), LONG).await);
    refused(b.try_acquire("h", o2.step(), LONG).await);
    let waiter = Lock::subscribe(&*b, "h", &o2).await.unwrap();
    refused(b.try_acquire("h", o2.step(), LONG).await);
    let k = lock_keys(&p, "h").await;
    assert_eq!(
        k.iter().map(owner_of).collect::<Vec<_>>(),
        vec![hex(&o1), hex(&o2)],
        "holder then waiter"
    );
    assert!(
        other.release("h", o1.step()).await.unwrap(),
        "the holder's release said not held"
    );
    timeout(Duration::from_secs(5), waiter.notified())
        .await
        .expect("the waiter is woken");
    let t2 = granted(b.try_acquire("h", o2.step(), LONG).await);
    assert!(t2 > t1);
    // A claim granted after queueing marks its key as the head (a put in
    // the background, see claim/handoff.rs): let it land before the snapshot.
    until("the head marker", Duration::from_secs(5), || async {
        lock_keys(&p, "h").await[0].version() > 1
    })
    .await;
    let before = snap(&lock_keys(&p, "h").await[0]);
    assert!(
        !b.extend("h", o1.step(), LONG).await.unwrap(),
        "stale extend"
    );
    assert!(!b.release("h", o1.step()).await.unwrap(), "stale release");
    assert!(
        !other.release("h", o1.step()).await.unwrap(),
        "second release"
    );
    refused(b.try_acquire("h", o1.step(), LONG).await);
    assert!(!b.release("h", o1.step()).await.unwrap());
    let k = lock_keys(&p, "h").await;
    assert_eq!(k.len(), 1);
    assert_eq!(snap(&k[0]), before);
    assert!(b.extend("h", o2.step(), LONG).await.unwrap());
    assert!(b.release("h", o2.step()).await.unwrap());
    let o3 = OwnerToken::random();
    assert!(granted(b.try_acquire("h", o3.step(), LONG).await) > t2);
    assert!(b.release("h", o3.step()).await.unwrap());
    assert!(all_keys(&p).await.is_empty());
}

/// An operator's force release races a client that takes and releases
/// one name over and over (its spare lease, so the same key, each time).
/// Every force release that says it removed something removed exactly one
/// live claim: the number of releases that found their claim gone equals
/// the number of successful force releases. Tokens rise throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_racing_reuse_removes_exactly_one_claim_each_time() {
    let p = unique("force");
    let b = client(&p).await;
    let op = client(&p).await;
    let locks = b.coord().locks().unwrap();
    let forced = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let operator = {
        let (forced, stop, op) = (forced.clone(), stop.clone(), op.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Acquire) {
                match Lock::force_release(&*op, "f").await {
                    Ok(true) => {
                        forced.fetch_add(1, Ordering::AcqRel);
                    }
                    Ok(false) => {}
                    Err(e) => panic!("force release: {e}"),
                }
                i += 1;
                sleep(Duration::from_millis(i % 4)).await;
            }
        })
    };
    let mut last = 0;
    let mut lost = 0u64;
    let mut keys_seen = std::collections::HashSet::new();
    for i in 0..150u32 {
        let g = locks
            .try_acquire("f", LONG)
            .await
            .unwrap()
            .expect("nobody else writes this name: the queue is empty");
        let t = g.fencing_token().get();
        assert!(t > last, "cycle {i}: token {t} after {last}");
        last = t;
        if let Some(kv) = lock_keys(&p, "f").await.first() {
            keys_seen.insert(kv.key().to_vec());
        }
        if i % 10 == 0 {
            // Make sure the operator hits some claims: hold until this
            // claim's key (its create revision is the token) is gone.
            until("a force release", Duration::from_secs(10), || async {
                lock_keys(&p, "f")
                    .await
                    .iter()
                    .all(|kv| kv.create_revision() as u64 != t)
            })
            .await;
        }
        let extended = g.extend(LONG).await;
        match g.release().await {
            Ok(()) => assert!(extended.is_ok(), "released after a failed extend"),
            Err(Error::NotHeld { .. }) => lost += 1,
            Err(e) => panic!("release: {e}"),
        }
    }
    stop.store(true, Ordering::Release);
    operator.await.unwrap();
    let forced = forced.load(Ordering::Acquire);
    eprintln!(
        "150 cycles: {forced} force releases, {lost} lost, {} keys",
        keys_seen.len()
    );
    assert!(forced >= 15);
    assert_eq!(
        lost, forced,
        "each successful force release must remove exactly one claim"
    );
    assert!(
        keys_seen.len() < 150,
        "no key was reused: the race was not exercised"
    );
    until_keys(&p, "f", 0, Duration::from_secs(5)).await;
}

/// Guards with a watchdog (TTL 2 s, renewals every ~0.67 s) held for
/// varied times so that renewals come just before a release, and the same
/// client takes the name again at once (on the released lease): no guard
/// is lost, no two hold at once, tokens rise, nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_renewals_racing_release_and_reacquire() {
    let p = unique("wd");
    let a = client(&p).await;
    let bc = client(&p).await;
    let ttl = Duration::from_secs(2);
    let holds = [0u64, 40, 660, 700, 1400, 10, 690];
    let busy = Arc::new(AtomicBool::new(false));
    let last = Arc::new(Mutex::new(0u64));
    let mut tasks = Vec::new();
    for (who, backend) in [(0usize, a.clone()), (1, a.clone()), (2, bc.clone())] {
        let (busy, last) = (busy.clone(), last.clone());
        let locks = backend.coord().locks().unwrap();
        tasks.push(tokio::spawn(async move {
            for i in 0..8usize {
                let opts = coord_core::LockOptions::new(ttl)
                    .wait(Duration::from_secs(60))
                    .watchdog(true);
                let g = locks.acquire_with("wd", opts).await.unwrap();
                assert!(g.has_watchdog());
                assert!(!busy.swap(true, Ordering::AcqRel), "two holders at once");
                let t = g.fencing_token().get();
                {
                    let mut l = last.lock().unwrap();
                    assert!(t > *l, "token {t} after {}", *l);
                    *l = t;
                }
                sleep(Duration::from_millis(holds[(who * 3 + i) % holds.len()])).await;
                assert!(
                    g.is_valid(),
                    "task {who} cycle {i}: the watchdog lost the claim"
                );
                busy.store(false, Ordering::Release);
                if i % 3 == 2 {
                    // Dropped: the background release stops the watchdog.
                    drop(g);
                } else {
                    g.release().await.unwrap();
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    until_keys(&p, "wd", 0, Duration::from_secs(5)).await;
}

/// A guard dropped (its release in the background) while the same client
/// at once takes the name again: the new acquire is granted, with a
/// higher token, and is the one holder etcd shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_release_racing_a_reacquire_by_the_same_client() {
    let p = unique("drop");
    let a = client(&p).await;
    let locks = a.coord().locks().unwrap();
    let mut g = locks.try_acquire("d", LONG).await.unwrap().unwrap();
    for i in 0..60u32 {
        let t = g.fencing_token();
        if i % 3 == 1 {
            g.keep_alive();
        }
        drop(g);
        g = locks
            .acquire("d", LONG, Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("cycle {i}: {e}"));
        assert!(g.fencing_token() > t, "cycle {i}");
        let info = locks.inspect("d").await.unwrap();
        assert_eq!(info.holders.len(), 1, "cycle {i}");
        assert_eq!(info.holders[0].owner_id, g.owner_id(), "cycle {i}: holder");
        assert_eq!(
            info.holders[0].fencing_token,
            g.fencing_token(),
            "cycle {i}"
        );
        let k = lock_keys(&p, "d").await;
        assert_eq!(k.len(), 1, "cycle {i}: keys left behind");
        assert_eq!(k[0].create_revision() as u64, g.fencing_token().get());
    }
    g.release().await.unwrap();
    assert!(all_keys(&p).await.is_empty());
}
