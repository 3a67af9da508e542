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
//! This file: over-grant and tokens under churn, stale owners after a
//! key was reused, releases and force releases racing reuse, extend moving
//! a lease, inspect. Queues and lost replies: `semaphore_queue_by_lease.rs`;
//! one owner through two clients: `semaphore_adopted_grants.rs`.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use conformance::testkit::etcd;
use conformance::testkit::proxy::FaultProxy;
use coord_core::{Attempt, OwnerToken};
use tokio::time::{sleep, timeout};

use crate::semaphore_support;
use semaphore_support::*;

/// 3 clients, 2 tasks each, requests of 1-3 of 4 permits on one name: held
/// and released, dropped, cancelled mid-wait, or (short TTL) abandoned to
/// expire. Never more than 4 permits are granted, in etcd and in the
/// clients' view; a grant's token is above every token returned before
/// its acquire began; keys are reused (few distinct grant keys).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn churn_never_over_grants_and_tokens_rise() {
    let p = unique("churn");
    let name = "pool";
    const TOTAL: u32 = 4;
    let clients = [coord(&p).await, coord(&p).await, coord(&p).await];
    let min = raw(&clients[0]).capabilities().min_ttl;
    let stop = Arc::new(AtomicBool::new(false));
    let obs = observer(p.clone(), name.to_string(), TOTAL, stop.clone());
    let in_use = Arc::new(AtomicI64::new(0));
    let max_token = Arc::new(AtomicU64::new(0));
    let keys_seen = Arc::new(Mutex::new(std::collections::HashSet::<String>::new()));
    let mut tasks = Vec::new();
    for (ci, c) in clients.iter().enumerate() {
        for ti in 0..2u64 {
            let sem = c.semaphores().unwrap();
            let (in_use, max_token, p, keys_seen) = (
                in_use.clone(),
                max_token.clone(),
                p.clone(),
                keys_seen.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((((ci as u64) << 8) | ti) * 7919 + 1));
                let mut grants = 0;
                for _ in 0..25 {
                    let n = 1 + rng.below(3) as u32;
                    let action = rng.below(10);
                    let floor = max_token.load(Ordering::SeqCst);
                    if action == 0 {
                        // Cancel mid-wait.
                        let w = Duration::from_millis(rng.below(200));
                        let _ = timeout(w, sem.acquire_many(name, n, TOTAL, LONG, LONG)).await;
                        continue;
                    }
                    let ttl = if action == 1 { min } else { LONG };
                    let got = sem
                        .acquire_many(name, n, TOTAL, ttl, Duration::from_secs(20))
                        .await;
                    let permit = match got {
                        Ok(p) => p,
                        Err(coord_core::Error::Timeout { .. }) => continue,
                        Err(e) => panic!("acquire: {e:?}"),
                    };
                    grants += 1;
                    let t = permit.fencing_token().get();
                    assert!(t > floor, "token {t} not above {floor} returned before");
                    max_token.fetch_max(t, Ordering::SeqCst);
                    let now = in_use.fetch_add(n as i64, Ordering::SeqCst) + n as i64;
                    assert!(now <= TOTAL as i64, "clients hold {now} > {TOTAL}");
                    let (h, _, _) = state(&p, name).await;
                    let mine: Vec<_> = h.iter().filter(|r| r.create as u64 == t).collect();
                    if permit.is_valid() && action != 1 {
                        assert_eq!(mine.len(), 1, "the grant is not in etcd: {h:#?}");
                        assert_eq!(mine[0].permits, n);
                        assert_eq!(mine[0].create as u64, t, "token != create revision");
                        keys_seen.lock().unwrap().insert(mine[0].key.clone());
                    }
                    sleep(Duration::from_millis(rng.below(30))).await;
                    match action {
                        1 => {
                            // Walk away: hold nothing in the clients' view once
                            // the TTL is over (the store ends it).
                            let until_at = permit.valid_until();
                            std::mem::forget(permit);
                            tokio::time::sleep_until(until_at).await;
                            in_use.fetch_sub(n as i64, Ordering::SeqCst);
                        }
                        2 | 3 => {
                            in_use.fetch_sub(n as i64, Ordering::SeqCst);
                            drop(permit);
                        }
                        _ => {
                            in_use.fetch_sub(n as i64, Ordering::SeqCst);
                            permit.release().await.unwrap();
                        }
                    }
                }
                grants
            }));
        }
    }
    let mut total_grants = 0;
    for t in tasks {
        total_grants += t.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let observations = obs.await.unwrap();
    assert!(total_grants > 50, "only {total_grants} grants");
    assert!(observations > 20, "only {observations} observations");
    until("the name empties", Duration::from_secs(20), || async {
        let (h, w, s) = state(&p, name).await;
        h.is_empty() && w.is_empty() && s == 0
    })
    .await;
    let distinct = keys_seen.lock().unwrap().len();
    assert!(
        distinct < total_grants / 2,
        "{distinct} distinct grant keys for {total_grants} grants: keys not reused"
    );
}

/// A stale owner whose grant ended (released through another client,
/// force-released, or lapsed) cannot release or extend the grant of the
/// next owner of the same client, from either client, whether or not the
/// key was reused; the live grant is left exactly as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_owner_after_reuse_changes_nothing() {
    let p = unique("stale");
    let (ca, cb) = (coord(&p).await, coord(&p).await);
    let (a, b) = (raw(&ca), raw(&cb));
    let min = a.capabilities().min_ttl;
    let n = "s";
    for how in ["other-release", "force", "own-release", "lapse"] {
        let (o1, o2) = (OwnerToken::random(), OwnerToken::random());
        let ttl = if how == "lapse" { min } else { LONG };
        let t1 = granted(a.try_acquire(n, o1.step(), &req(2, 3, ttl, false)).await);
        match how {
            "other-release" => assert!(b.release(n, o1.step()).await.unwrap()),
            "force" => assert!(b.force_release(n).await.unwrap()),
            "own-release" => assert!(a.release(n, o1.step()).await.unwrap()),
            _ => {
                until(
                    "the grant lapses",
                    min + Duration::from_secs(10),
                    || async { state(&p, n).await.0.is_empty() },
                )
                .await;
            }
        }
        let t2 = granted(a.try_acquire(n, o2.step(), &req(2, 3, LONG, false)).await);
        assert!(t2 > t1, "{how}: token {t2} after {t1}");
        let before = state(&p, n).await;
        assert_eq!(before.0.len(), 1);
        assert_eq!(before.0[0].owner, o2.to_hex());
        for s in [&a, &b] {
            assert!(
                !s.release(n, o1.step()).await.unwrap(),
                "{how}: stale release said held"
            );
            assert!(
                !s.extend(n, o1.step(), LONG).await.unwrap(),
                "{how}: stale extend said held"
            );
        }
        // The stale owner cannot take more than what is left either.
        held(
            a.try_acquire(n, o1.step(), &req(2, 3, LONG, false)).await,
            "stale owner over-granted",
        );
        assert_eq!(
            state(&p, n).await,
            before,
            "{how}: the stale owner changed o2's grant"
        );
        assert!(a.extend(n, o2.step(), LONG).await.unwrap());
        assert!(a.release(n, o2.step()).await.unwrap());
        assert!(!b.release(n, o2.step()).await.unwrap());
        let (h, w, s) = state(&p, n).await;
        assert!(
            h.is_empty() && w.is_empty() && s == 0,
            "{how}: {h:?} {w:?} {s}"
        );
    }
}

/// A release by owner token through a slow proxy races the owner's own
/// release and the same client's next grant, which reuses the key: at
/// most one release says held, and the next owner's grant is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_release_by_token_racing_reuse_leaves_the_next_grant() {
    let p = unique("slow");
    let a = raw(&coord(&p).await);
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let slow = raw(&coord_at(proxy.port(), &p, 15_000).await);
    let n = "r";
    // Warm the slow client's connection.
    assert!(!slow.release(n, OwnerToken::random().step()).await.unwrap());
    let mut reused = 0;
    for i in 0..8u64 {
        let (o1, o2) = (OwnerToken::random(), OwnerToken::random());
        granted(a.try_acquire(n, o1.step(), &req(2, 3, LONG, false)).await);
        let k1 = state(&p, n).await.0[0].key.clone();
        proxy.latency(Duration::from_millis(40 * (i % 4)));
        let s2 = slow.clone();
        let o1c = o1;
        let racer = tokio::spawn(async move { s2.release(n, o1c.step()).await.unwrap() });
        sleep(Duration::from_millis(10 * (i % 3))).await;
        let own = a.release(n, o1.step()).await.unwrap();
        let t2 = a.try_acquire(n, o2.step(), &req(2, 3, LONG, false)).await;
        let theirs = racer.await.unwrap();
        proxy.latency(Duration::ZERO);
        assert!(own || theirs, "round {i}: nobody released o1");
        assert!(!(own && theirs), "round {i}: o1 released twice");
        granted(t2);
        let (h, _, s) = state(&p, n).await;
        assert_eq!(h.len(), 1, "round {i}: o2's grant is gone: {h:#?}");
        assert_eq!(h[0].owner, o2.to_hex());
        assert_eq!(s, 2);
        if h[0].key == k1 {
            reused += 1;
        }
        assert!(a.extend(n, o2.step(), LONG).await.unwrap());
        assert!(!slow.release(n, o1.step()).await.unwrap());
        assert!(!a.release(n, o1.step()).await.unwrap());
        assert!(a.release(n, o2.step()).await.unwrap());
    }
    assert!(reused > 0, "no round reused the key");
}

/// force_release from another client races a release and a re-grant that
/// reuses the key: afterwards the client's view and etcd agree (extend
/// says held iff the grant is in etcd) and nothing is left over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_racing_reuse_stays_consistent() {
    let p = unique("force");
    let a = raw(&coord(&p).await);
    let op = raw(&coord(&p).await);
    let n = "f";
    for i in 0..30u64 {
        let (o1, o2) = (OwnerToken::random(), OwnerToken::random());
        granted(a.try_acquire(n, o1.step(), &req(1, 2, LONG, false)).await);
        let op2 = op.clone();
        let f = tokio::spawn(async move {
            sleep(Duration::from_millis(i % 5)).await;
            op2.force_release(n).await.unwrap()
        });
        let _ = a.release(n, o1.step()).await.unwrap();
        let g = a
            .try_acquire(n, o2.step(), &req(1, 2, LONG, false))
            .await
            .unwrap();
        f.await.unwrap();
        let (h, _, s) = state(&p, n).await;
        assert!(h.len() <= 1, "{h:#?}");
        assert!(h.iter().all(|r| r.owner == o2.to_hex()), "{h:#?}");
        assert_eq!(s, h.len());
        let in_etcd = !h.is_empty();
        if in_etcd {
            assert!(matches!(g, Attempt::Granted(_)));
        }
        let ext = a.extend(n, o2.step(), LONG).await.unwrap();
        assert_eq!(ext, in_etcd, "round {i}: extend {ext}, in etcd {in_etcd}");
        assert_eq!(state(&p, n).await.0.len(), h.len());
        assert_eq!(a.release(n, o2.step()).await.unwrap(), in_etcd);
        assert!(!a.release(n, o1.step()).await.unwrap());
        let (h, w, s) = state(&p, n).await;
        assert!(
            h.is_empty() && w.is_empty() && s == 0,
            "round {i}: {h:?} {w:?} {s}"
        );
    }
}

/// Extend to another TTL moves the grant to a new lease (the key kept);
/// after release that lease is reused by the next owner: the old owner's
/// release and extend (same TTL, another TTL) change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_moves_lease_then_reuse_leaves_stale_owner_out() {
    let p = unique("move");
    let (ca, cb) = (coord(&p).await, coord(&p).await);
    let (a, b) = (raw(&ca), raw(&cb));
    let n = "m";
    let (o1, o2) = (OwnerToken::random(), OwnerToken::random());
    let t1 = granted(a.try_acquire(n, o1.step(), &req(1, 2, LONG, false)).await);
    let k0 = state(&p, n).await.0[0].clone();
    assert!(
        a.extend(n, o1.step(), Duration::from_secs(45))
            .await
            .unwrap()
    );
    let k1 = state(&p, n).await.0[0].clone();
    assert_eq!((k1.key.as_str(), k1.create), (k0.key.as_str(), k0.create));
    assert_ne!(k1.lease, k0.lease, "another TTL: moved to another lease");
    assert!(
        a.extend(n, o1.step(), Duration::from_secs(20))
            .await
            .unwrap()
    );
    assert_eq!(state(&p, n).await.0[0].create as u64, t1);
    assert!(a.release(n, o1.step()).await.unwrap());
    let t2 = granted(
        a.try_acquire(n, o2.step(), &req(1, 2, Duration::from_secs(20), false))
            .await,
    );
    assert!(t2 > t1);
    let before = state(&p, n).await;
    for s in [&a, &b] {
        for ttl in [Duration::from_secs(20), LONG] {
            assert!(!s.extend(n, o1.step(), ttl).await.unwrap(), "stale extend");
        }
        assert!(!s.release(n, o1.step()).await.unwrap(), "stale release");
    }
    assert_eq!(state(&p, n).await, before);
    assert!(a.release(n, o2.step()).await.unwrap());
    let (h, w, s) = state(&p, n).await;
    assert!(h.is_empty() && w.is_empty() && s == 0);
}

/// inspect reads owners and permits from the values: two grants of one
/// client and one of another, after keys were reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_names_owners_and_permits_after_reuse() {
    let p = unique("insp");
    let (ca, cb) = (coord(&p).await, coord(&p).await);
    let (a, b) = (raw(&ca), raw(&cb));
    let n = "i";
    // Reuse: grant and release a few times on a's spare.
    for _ in 0..3 {
        let o = OwnerToken::random();
        granted(a.try_acquire(n, o.step(), &req(2, 5, LONG, false)).await);
        assert!(a.release(n, o.step()).await.unwrap());
    }
    let (o1, o2, o3) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    granted(a.try_acquire(n, o1.step(), &req(2, 5, LONG, false)).await);
    granted(a.try_acquire(n, o2.step(), &req(1, 5, LONG, false)).await);
    granted(b.try_acquire(n, o3.step(), &req(2, 5, LONG, false)).await);
    for s in [&a, &b] {
        let rec = s.inspect(n).await.unwrap();
        let mut got: Vec<(String, u32, u64)> = rec
            .holders
            .iter()
            .map(|h| (h.owner.to_hex(), h.permits, h.token.get()))
            .collect();
        got.sort();
        let (hs, _, _) = state(&p, n).await;
        let mut want: Vec<(String, u32, u64)> = [(&o1, 2), (&o2, 1), (&o3, 2)]
            .iter()
            .map(|(o, k)| {
                let r = hs.iter().find(|r| r.owner == o.to_hex()).expect("in etcd");
                (o.to_hex(), *k, r.create as u64)
            })
            .collect();
        want.sort();
        assert_eq!(got, want, "inspect disagrees with etcd");
    }
    let (h, _, _) = state(&p, n).await;
    assert_eq!(h.iter().map(|r| r.permits).sum::<u32>(), 5);
    for o in [&o1, &o2, &o3] {
        assert!(a.release(n, o.step()).await.unwrap() || b.release(n, o.step()).await.unwrap());
    }
}
