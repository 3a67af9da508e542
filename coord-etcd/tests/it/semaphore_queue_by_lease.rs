//! Semaphore grant and place keys named by their lease
//! (`<prefix>sem/<name>/h/<lease hex>` and `w/<lease hex>`, the owner
//! first in the value, keys reused through the spare pool).
//!
//! Each test drives a real etcd (the binary's shared server, a prefix of
//! its own per test) and checks the contract (docs/guarantees.md):
//! never more permits granted than the total (read from etcd and from the
//! clients' view), FIFO for the head of the queue, tokens rising per name,
//! release and extend acting only for the owner that holds, cancelled and
//! timed-out waits leaving nothing, read-write exclusion.

//!
//! This file: the queue over reused keys (FIFO for the head, blocked
//! waiters across clients, cancelled and timed-out waits), read-write
//! exclusion, lost replies and late copies. See
//! `semaphore_keys_by_lease.rs`.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use conformance::testkit::etcd;
use conformance::testkit::proxy::FaultProxy;
use coord_core::{Attempt, OwnerToken};
use tokio::time::{Instant, sleep, timeout};

use crate::late_support;
use crate::semaphore_support;
use semaphore_support::*;

/// FIFO across clients, with keys reused over rounds: the head of the
/// queue (3 of 4, client B) is never overtaken by later requests for 1
/// (another owner of the holder's client A, and client C), though 1
/// permit is free; a later request is granted only when it fits with
/// everything queued ahead of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_of_queue_is_never_overtaken_over_reused_keys() {
    let p = unique("fifo");
    let (ca, cb, cc) = (coord(&p).await, coord(&p).await, coord(&p).await);
    let (a, b, c) = (raw(&ca), raw(&cb), raw(&cc));
    let n = "q";
    let mut last = 0;
    let mut place_keys = std::collections::HashSet::new();
    for round in 0..4 {
        let (h, head, a2, c1) = (
            OwnerToken::random(),
            OwnerToken::random(),
            OwnerToken::random(),
            OwnerToken::random(),
        );
        let th = granted(a.try_acquire(n, h.step(), &req(3, 4, LONG, false)).await);
        assert!(th > last, "round {round}: token {th} after {last}");
        held(
            b.try_acquire(n, head.step(), &req(3, 4, LONG, true)).await,
            "head",
        );
        // Later and smaller, 1 free: must wait behind the head.
        held(
            a.try_acquire(n, a2.step(), &req(1, 4, LONG, true)).await,
            "a2 overtook the head",
        );
        held(
            c.try_acquire(n, c1.step(), &req(1, 4, LONG, true)).await,
            "c1 overtook the head",
        );
        let x = OwnerToken::random();
        held(
            c.try_acquire(n, x.step(), &req(1, 4, LONG, false)).await,
            "a single attempt overtook the head",
        );
        let (hs, ws, _) = state(&p, n).await;
        assert_eq!(hs.len(), 1, "{hs:#?}");
        assert_eq!(ws.len(), 3, "{ws:#?}");
        for w in &ws {
            place_keys.insert(w.key.clone());
        }
        // Retries keep refusing while the holder holds.
        held(
            a.try_acquire(n, a2.step(), &req(1, 4, LONG, true)).await,
            "a2 retry",
        );
        held(
            c.try_acquire(n, c1.step(), &req(1, 4, LONG, true)).await,
            "c1 retry",
        );
        assert!(a.release(n, h.step()).await.unwrap());
        // 4 free: head (3) + a2 (1) fit together, c1 (the third) does not.
        let ta2 = granted(a.try_acquire(n, a2.step(), &req(1, 4, LONG, true)).await);
        held(
            c.try_acquire(n, c1.step(), &req(1, 4, LONG, true)).await,
            "c1 overtook the head after release",
        );
        let thd = granted(b.try_acquire(n, head.step(), &req(3, 4, LONG, true)).await);
        held(
            c.try_acquire(n, c1.step(), &req(1, 4, LONG, true)).await,
            "c1 granted a fifth permit",
        );
        assert!(ta2 > th && thd > th);
        let (hs, ws, s) = state(&p, n).await;
        assert_eq!(
            hs.iter().map(|r| r.permits).sum::<u32>(),
            4,
            "round {round}: {hs:#?}"
        );
        assert_eq!(s, 4);
        assert_eq!(ws.len(), 1, "only c1 queued: {ws:#?}");
        assert!(b.release(n, head.step()).await.unwrap());
        let tc = granted(c.try_acquire(n, c1.step(), &req(1, 4, LONG, true)).await);
        assert!(tc > thd && tc > ta2);
        assert!(a.release(n, a2.step()).await.unwrap());
        assert!(c.release(n, c1.step()).await.unwrap());
        last = tc;
        let (hs, ws, s) = state(&p, n).await;
        assert!(
            hs.is_empty() && ws.is_empty() && s == 0,
            "{hs:?} {ws:?} {s}"
        );
    }
    assert!(
        place_keys.len() < 12,
        "{} place keys over 4 rounds of 3 places: not reused",
        place_keys.len()
    );
}

/// Waiting acquires (woken by the store) on three clients, two owners of
/// one client among them, over rounds that reuse keys: the head (all 4
/// permits) is granted before any later request for 1, though 1 permit is
/// free while it waits; the later ones are granted once it releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn blocked_waiters_keep_fifo_across_clients_and_rounds() {
    let p = unique("wfifo");
    let cs = [coord(&p).await, coord(&p).await, coord(&p).await];
    let n = "w";
    let t0 = Instant::now();
    for round in 0..3 {
        let sems: Vec<_> = cs.iter().map(|c| c.semaphores().unwrap()).collect();
        let holder = sems[0].acquire_many(n, 3, 4, LONG, LONG).await.unwrap();
        let log = Arc::new(Mutex::new(Vec::<(&'static str, Duration)>::new()));
        let spawn = |who: &'static str, sem: coord_core::Semaphores, k: u32, hold: u64| {
            let log = log.clone();
            tokio::spawn(async move {
                let g = sem
                    .acquire_many(n, k, 4, LONG, Duration::from_secs(25))
                    .await
                    .unwrap_or_else(|e| panic!("{who}: {e:?}"));
                log.lock().unwrap().push((who, t0.elapsed()));
                sleep(Duration::from_millis(hold)).await;
                log.lock().unwrap().push((who, t0.elapsed()));
                g.release().await.unwrap();
            })
        };
        let places = |k: usize| {
            let p = p.clone();
            async move { state(&p, n).await.1.len() == k }
        };
        let head = spawn("head", sems[1].clone(), 4, 200);
        until("head queued", Duration::from_secs(10), || places(1)).await;
        let a2 = spawn("a2", sems[0].clone(), 1, 10);
        let c1 = spawn("c1", sems[2].clone(), 1, 10);
        until("3 queued", Duration::from_secs(10), || places(3)).await;
        sleep(Duration::from_millis(300)).await;
        assert!(
            log.lock().unwrap().is_empty(),
            "round {round}: overtook the head: {:?}",
            log.lock().unwrap()
        );
        let released = t0.elapsed();
        holder.release().await.unwrap();
        for t in [head, a2, c1] {
            t.await.unwrap();
        }
        let log = log.lock().unwrap().clone();
        assert_eq!(log[0].0, "head", "round {round}: {log:?}");
        assert_eq!(
            log[1].0, "head",
            "round {round}: someone joined the head: {log:?}"
        );
        assert!(
            log[0].1 - released < Duration::from_secs(3),
            "round {round}: head woken after {:?}",
            log[0].1 - released
        );
        until("empty", Duration::from_secs(10), || async {
            let (h, w, s) = state(&p, n).await;
            h.is_empty() && w.is_empty() && s == 0
        })
        .await;
    }
}

/// Waits that time out and acquires cancelled at any point (2 clients, 2
/// owners each, a holder taking everything) leave no grant or place
/// behind once the holder is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_and_timed_out_waits_leave_nothing() {
    let p = unique("cancel");
    let cs = [coord(&p).await, coord(&p).await];
    let n = "c";
    for round in 0..3u64 {
        let sem0 = cs[0].semaphores().unwrap();
        let holder = sem0.acquire_many(n, 3, 3, LONG, LONG).await.unwrap();
        let mut tasks = Vec::new();
        for (ci, c) in cs.iter().enumerate() {
            for k in 0..2u64 {
                let sem = c.semaphores().unwrap();
                tasks.push(tokio::spawn(async move {
                    let m = 1 + (ci as u64 + k + round) % 3;
                    for j in 0..6u64 {
                        let w = Duration::from_millis(30 * ((j + k) % 4));
                        if j % 2 == 0 {
                            let r = sem.acquire_many(n, m as u32, 3, LONG, w).await;
                            assert!(
                                matches!(r, Err(coord_core::Error::Timeout { .. })),
                                "granted while the holder holds all: {r:?}"
                            );
                        } else {
                            let _ = timeout(w, sem.acquire_many(n, m as u32, 3, LONG, LONG)).await;
                        }
                    }
                }));
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        let (h, _, _) = state(&p, n).await;
        assert_eq!(h.len(), 1, "round {round}: {h:#?}");
        until("places go", Duration::from_secs(10), || async {
            state(&p, n).await.1.is_empty()
        })
        .await;
        holder.release().await.unwrap();
        until("nothing left", Duration::from_secs(10), || async {
            let (h, w, s) = state(&p, n).await;
            h.is_empty() && w.is_empty() && s == 0
        })
        .await;
        // And nothing comes back later (a late grant of a cancelled wait).
        sleep(Duration::from_millis(300)).await;
        let (h, w, s) = state(&p, n).await;
        assert!(h.is_empty() && w.is_empty() && s == 0, "{h:?} {w:?} {s}");
    }
}

/// Read-write locks from 2 clients (2 readers and a writer each) under
/// churn with key reuse: a writer is alone, readers never overlap a writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rwlock_exclusion_under_churn() {
    let p = unique("rw");
    let cs = [coord(&p).await, coord(&p).await];
    let readers = Arc::new(AtomicI64::new(0));
    let writers = Arc::new(AtomicI64::new(0));
    let writes = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in &cs {
        for role in 0..3u64 {
            let rw = c.rw_locks().unwrap();
            let (readers, writers, writes) = (readers.clone(), writers.clone(), writes.clone());
            tasks.push(tokio::spawn(async move {
                let mut last = 0u64;
                for i in 0..15u64 {
                    if role == 0 {
                        let g = rw
                            .write("doc", LONG, Duration::from_secs(30))
                            .await
                            .unwrap();
                        let t = g.fencing_token().get();
                        assert!(t > last, "writer token {t} after {last}");
                        last = t;
                        assert_eq!(writers.fetch_add(1, Ordering::SeqCst), 0, "two writers");
                        assert_eq!(readers.load(Ordering::SeqCst), 0, "writer with readers");
                        sleep(Duration::from_millis(3 + i % 5)).await;
                        assert_eq!(readers.load(Ordering::SeqCst), 0, "reader joined a writer");
                        writers.fetch_sub(1, Ordering::SeqCst);
                        writes.fetch_add(1, Ordering::SeqCst);
                        if i % 3 == 0 {
                            drop(g);
                        } else {
                            g.release().await.unwrap();
                        }
                        // Dropped: wait until the store let go (the next
                        // writer would otherwise just queue).
                    } else {
                        let g = rw.read("doc", LONG, Duration::from_secs(30)).await.unwrap();
                        readers.fetch_add(1, Ordering::SeqCst);
                        assert_eq!(writers.load(Ordering::SeqCst), 0, "reader with a writer");
                        sleep(Duration::from_millis(2 + (i * role) % 7)).await;
                        assert_eq!(writers.load(Ordering::SeqCst), 0, "writer joined readers");
                        readers.fetch_sub(1, Ordering::SeqCst);
                        if i % 4 == 0 {
                            drop(g);
                        } else {
                            g.release().await.unwrap();
                        }
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(writes.load(Ordering::SeqCst), 30);
}

/// Lost replies and key reuse together: one of three clients talks
/// through a proxy whose latency flips between none and more than its
/// call timeout, so its grant and place writes are often unanswered
/// (retried on the recorded key). Never more than the total is held in
/// etcd, no owner has two grants, the clients' granted permits never sum
/// above the total, and the name empties afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_replies_with_reuse_never_over_grant() {
    let p = unique("lost");
    let name = "lr";
    const TOTAL: u32 = 3;
    let proxy = Arc::new(FaultProxy::start(etcd::shared().client_port()));
    let slow = coord_at(proxy.port(), &p, 400).await;
    let cs = [coord(&p).await, coord(&p).await, slow];
    let stop = Arc::new(AtomicBool::new(false));
    let obs = observer(p.clone(), name.to_string(), TOTAL, stop.clone());
    let flip = {
        let (proxy, stop) = (proxy.clone(), stop.clone());
        tokio::spawn(async move {
            let mut rng = Rng(42);
            while !stop.load(Ordering::Relaxed) {
                let l = if rng.below(2) == 0 {
                    0
                } else {
                    300 + rng.below(400)
                };
                proxy.latency(Duration::from_millis(l));
                sleep(Duration::from_millis(100 + rng.below(300))).await;
            }
            proxy.latency(Duration::ZERO);
        })
    };
    let in_use = Arc::new(AtomicI64::new(0));
    let grants = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (ci, c) in cs.iter().enumerate() {
        for ti in 0..2u64 {
            let sem = c.semaphores().unwrap();
            let (in_use, grants) = (in_use.clone(), grants.clone());
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng(7 + ci as u64 * 31 + ti * 1009);
                let ttl = Duration::from_secs(5);
                for _ in 0..20 {
                    let k = 1 + rng.below(2) as u32;
                    let r = sem
                        .acquire_many(name, k, TOTAL, ttl, Duration::from_secs(3))
                        .await;
                    let Ok(g) = r else { continue };
                    grants.fetch_add(1, Ordering::SeqCst);
                    let now = in_use.fetch_add(k as i64, Ordering::SeqCst) + k as i64;
                    assert!(now <= TOTAL as i64, "clients hold {now} > {TOTAL}");
                    sleep(Duration::from_millis(rng.below(40))).await;
                    in_use.fetch_sub(k as i64, Ordering::SeqCst);
                    if rng.below(3) == 0 {
                        drop(g);
                    } else {
                        let _ = g.release().await;
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    flip.await.unwrap();
    obs.await.unwrap();
    assert!(grants.load(Ordering::SeqCst) > 30, "too few grants");
    // Within 15 s, not the 30 s a place's lease lasts: a waiter whose
    // leaving the queue failed (a lost reply) sends it again (coord-core's
    // cleanup); without that, its place would stay until its lease ran
    // out and hold up every waiter behind it.
    until("the name empties", Duration::from_secs(15), || async {
        let (h, w, s) = state(&p, name).await;
        h.is_empty() && w.is_empty() && s == 0
    })
    .await;
}

/// A late copy of an unanswered grant transaction (raw trait, one owner)
/// lands after the owner's retry was granted on the recorded key and
/// released, and after the client reused its spare for other owners'
/// grants: it takes nothing, leaves nothing, and the first owner stays
/// released (a stale release says not held); the name is grantable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_copy_after_retry_release_and_reuse_takes_nothing() {
    use late_support::{CALL_TIMEOUT, CUT_AFTER, DELAY, find, until_the_late_copy_landed};
    let p = unique("late");
    let n = "lt";
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let far = raw(&coord_at(proxy.port(), &p, CALL_TIMEOUT.as_millis() as u64).await);
    let near = raw(&coord(&p).await);
    // Warm the slow connection.
    late_support::warm_semaphore(&*far).await;
    let slot0 = format!("sem/{n}/s/0").into_bytes();
    proxy.deliver_late(move |b| find(b, &slot0).is_some(), DELAY, CUT_AFTER);
    let o1 = OwnerToken::random();
    let first = far.try_acquire(n, o1.step(), &req(1, 1, LONG, false)).await;
    assert!(first.is_err(), "the held attempt was answered: {first:?}");
    let start = Instant::now();
    let t1 = loop {
        match far.try_acquire(n, o1.step(), &req(1, 1, LONG, false)).await {
            Ok(Attempt::Granted(t)) => break t.get(),
            r => {
                assert!(start.elapsed() < Duration::from_secs(5), "retry: {r:?}");
                sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(proxy.held(), 1, "no attempt was held");
    assert!(far.release(n, o1.step()).await.unwrap());
    let mut last = t1;
    for _ in 0..3 {
        let o = OwnerToken::random();
        let t = granted(far.try_acquire(n, o.step(), &req(1, 1, LONG, false)).await);
        assert!(t > last);
        last = t;
        assert!(far.release(n, o.step()).await.unwrap());
    }
    assert_eq!(proxy.delivered(), 0, "the held attempt was not late");
    until_the_late_copy_landed(&proxy).await;
    let (h, w, s) = state(&p, n).await;
    assert!(
        h.is_empty() && w.is_empty() && s == 0,
        "late copy left {h:?} {w:?} {s}"
    );
    assert!(!far.release(n, o1.step()).await.unwrap());
    assert!(!near.release(n, o1.step()).await.unwrap());
    let o = OwnerToken::random();
    let t = granted(near.try_acquire(n, o.step(), &req(1, 1, LONG, false)).await);
    assert!(t > last);
    assert!(near.release(n, o.step()).await.unwrap());
}

/// A waiter that times out leaves the queue; when that release is lost
/// (its reply slower than the call timeout), it is sent again in the
/// background (coord-core's cleanup), so the place is gone within moments,
/// not the 30 s its lease lasts, during which every waiter queued behind
/// it waited. W waits through a proxy (call timeout 400 ms) for the only
/// permit, held by H; the proxy turns slow (1 s each way) just before W
/// gives up, and fast again once W has answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_leave_of_the_queue_is_sent_again() {
    let p = unique("leave");
    let name = "lv";
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let (h, w) = (coord(&p).await, coord_at(proxy.port(), &p, 400).await);
    let held = h
        .semaphores()
        .unwrap()
        .try_acquire(name, 1, Duration::from_secs(30))
        .await
        .unwrap()
        .expect("a free permit");
    let sem = w.semaphores().unwrap();
    let waiting = tokio::spawn(async move {
        sem.acquire_many(
            name,
            1,
            1,
            Duration::from_secs(30),
            Duration::from_millis(1500),
        )
        .await
    });
    until("W queued", Duration::from_secs(5), || async {
        !state(&p, name).await.1.is_empty()
    })
    .await;
    sleep(Duration::from_millis(1000)).await;
    proxy.latency(Duration::from_secs(1));
    let r = waiting.await.unwrap();
    assert!(r.is_err(), "W was granted a held permit: {r:?}");
    let left = state(&p, name).await.1;
    proxy.latency(Duration::ZERO);
    let t = Instant::now();
    until("W's place is gone", Duration::from_secs(5), || async {
        state(&p, name).await.1.is_empty()
    })
    .await;
    eprintln!(
        "W's place {} when W answered; gone {:?} after the proxy healed",
        if left.is_empty() {
            "already gone"
        } else {
            "still there"
        },
        t.elapsed()
    );
    held.release().await.unwrap();
}
