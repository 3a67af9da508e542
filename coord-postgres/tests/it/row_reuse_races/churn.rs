//! A churn of grants, releases, expiries, stale releases and extends
//! beside a grace-0 sweep, on several names and on one hot name: never
//! two holders of a name, and tokens rise.

use crate::support;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coord_core::{Attempt, Lease, Lock, OwnerToken};
use coord_postgres::PostgresBackend;
use support::unique;

use super::backend_with;

/// Per name, the current holder as the clients know it: owner, and the
/// latest instant the server's grant can have ended by (a lower bound of
/// its expiry: the send time of the grant or extend plus the TTL).
type Holders = HashMap<String, (OwnerToken, Instant, u64)>;

/// 10 tasks on 6 names for 6 s with a sweeper at grace 0 in a loop: grants
/// (with and without metadata, through waiting acquires too), releases,
/// extends, grants left to expire (40 ms), and stale releases and extends
/// of earlier owners. A grant while another owner's grant is surely live
/// (its send time plus TTL not yet passed, not released) is a double
/// grant; tokens of grants recorded in time must rise; a stale release or
/// extend must report NotHeld.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_double_grant_and_rising_tokens_under_churn_with_a_grace_0_sweep() {
    churn(6, 30).await;
}

/// The same on ONE name, 10 tasks with no pause between cycles: every
/// attempt races the others' takes, releases, stale calls and the sweep
/// on the same row (the EvalPlanQual re-checks under full contention).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_double_grant_and_rising_tokens_on_one_hot_name() {
    churn(1, 1).await;
}

async fn churn(names: u64, pause_ms: u64) {
    let schema = unique("rv_churn");
    let b = backend_with(&schema, Duration::ZERO).await;
    let sweeper = backend_with(&schema, Duration::ZERO).await;
    let ttl = Duration::from_millis(40);
    let holders: Arc<Mutex<Holders>> = Arc::default();
    let stale: Arc<Mutex<Vec<(String, OwnerToken)>>> = Arc::default();
    let tokens: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let swept = Arc::new(AtomicU64::new(0));
    let grants = Arc::new(AtomicU64::new(0));
    let sweeping = {
        let (stop, swept) = (stop.clone(), swept.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                swept.fetch_add(sweeper.sweep().await.unwrap(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let mut tasks = Vec::new();
    for k in 0..10u64 {
        let tokens = tokens.clone();
        let (b, holders, stale, stop, grants) = (
            b.clone(),
            holders.clone(),
            stale.clone(),
            stop.clone(),
            grants.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut r: u64 = k * 7919 + 1;
            let mut next = || {
                r = r
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                r >> 33
            };
            while !stop.load(Ordering::Relaxed) {
                // Now and then, a stale owner's release or extend.
                if next() % 3 == 0 {
                    let s = stale.lock().unwrap().pop();
                    if let Some((key, sowner)) = s {
                        let (lease, sname) = split(&key);
                        let rel = next() % 2 == 0;
                        let ok = match (lease, rel) {
                            (false, true) => Lock::release(&*b, sname, sowner.step()).await.unwrap(),
                            (false, false) => Lock::extend(&*b, sname, sowner.step(), ttl).await.unwrap(),
                            (true, true) => b.revoke(sname, sowner.step()).await.unwrap(),
                            (true, false) => Lease::renew(&*b, sname, sowner.step(), ttl).await.unwrap(),
                        };
                        assert!(
                            !ok,
                            "{key}: a stale owner's {} succeeded",
                            if rel { "release" } else { "extend" }
                        );
                    }
                }
                let lease = next() % 4 == 0;
                let name = format!("c{}", next() % names);
                let key = format!("{}:{name}", if lease { "lease" } else { "lock" });
                let owner = OwnerToken::random();
                let sent = Instant::now();
                let attempt = match (lease, next() % 2) {
                    (true, _) => b.grant(&name, owner.step(), ttl).await.unwrap(),
                    (false, 0) => b.try_acquire(&name, owner.step(), ttl).await.unwrap(),
                    (false, _) => b
                        .try_acquire_with_metadata(&name, owner.step(), ttl, b"m")
                        .await
                        .unwrap(),
                };
                let Attempt::Granted(t) = attempt else {
                    tokio::time::sleep(Duration::from_millis(next() % 3)).await;
                    continue;
                };
                grants.fetch_add(1, Ordering::Relaxed);
                let now = Instant::now();
                // Only a grant recorded within its TTL of the send is known
                // to have been live when recorded (else a later grant may
                // already have been recorded before it).
                if now.duration_since(sent) < ttl {
                    let mut last = tokens.lock().unwrap();
                    let prev = last.insert(key.clone(), t.get()).unwrap_or(0);
                    assert!(t.get() > prev, "{key}: token {t:?} after {prev} (in grant order)");
                    drop(last);
                    let mut h = holders.lock().unwrap();
                    if let Some((prev, until, prev_t)) = h.get(&key).copied() {
                        assert!(
                            prev == owner || until <= now,
                            "{key}: granted {t:?} to a new owner while {prev_t} was surely live \
                             ({:?} left)",
                            until - now
                        );
                        assert!(t.get() > prev_t, "{key}: token {t:?} after {prev_t}");
                    }
                    h.insert(key.clone(), (owner, sent + ttl, t.get()));
                }
                let release = |b: Arc<PostgresBackend>, name: String, owner: OwnerToken| async move {
                    if lease {
                        b.revoke(&name, owner.step()).await.unwrap()
                    } else {
                        Lock::release(&*b, &name, owner.step()).await.unwrap()
                    }
                };
                match next() % 4 {
                    0 => {
                        // Extend once, then release.
                        let sent = Instant::now();
                        let ok = if lease {
                            Lease::renew(&*b, &name, owner.step(), ttl).await.unwrap()
                        } else {
                            Lock::extend(&*b, &name, owner.step(), ttl).await.unwrap()
                        };
                        if ok {
                            let mut h = holders.lock().unwrap();
                            if let Some(e) = h.get_mut(&key) {
                                if e.0 == owner {
                                    e.1 = e.1.max(sent + ttl);
                                }
                            }
                        }
                        holders.lock().unwrap().retain(|_, e| e.0 != owner);
                        release(b.clone(), name.clone(), owner).await;
                    }
                    1 | 2 => {
                        holders.lock().unwrap().retain(|_, e| e.0 != owner);
                        release(b.clone(), name.clone(), owner).await;
                    }
                    _ => {} // left to expire
                }
                // Stale from here on: released, or left to expire and
                // checked only once its TTL surely passed.
                let stale = stale.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(ttl + Duration::from_millis(20)).await;
                    stale.lock().unwrap().push((key, owner));
                });
                tokio::time::sleep(Duration::from_millis(next() % pause_ms)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    sweeping.await.unwrap();
    println!(
        "{} grants, {} rows swept",
        grants.load(Ordering::Relaxed),
        swept.load(Ordering::Relaxed)
    );
    assert!(grants.load(Ordering::Relaxed) > 100);
    assert!(swept.load(Ordering::Relaxed) > 0);
}

fn split(key: &str) -> (bool, &str) {
    let (kind, name) = key.split_once(':').unwrap();
    (kind == "lease", name)
}
