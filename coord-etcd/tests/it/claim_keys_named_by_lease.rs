//! Claim keys named by their lease (`<prefix>lock|election/<name>/<lease
//! hex>`, the owner in the value, a spare lease's key written again by the
//! client's next claim): stale owners, reused keys and leases, races with
//! releases, force releases and cancellations, odd names.
//!
//! Each test drives a real etcd (the binary's shared server, a prefix of
//! its own per test) and checks the contract (docs/guarantees.md):
//! release and extend act only for the owner that holds and otherwise
//! report not held and change nothing; tokens rise over the grants of a
//! name; at most one holder at a time; a cancelled or refused attempt
//! leaves nothing behind; names and candidates are taken as they are.
//! Keys and leases are read from etcd directly, never from the client.

use crate::claim_support;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::testkit::etcd;
use conformance::testkit::proxy::FaultProxy;
use conformance::testkit::wait::until;
use coord_core::{Attempt, Election, Error, Lock, OwnerToken};
use coord_etcd::EtcdBackend;
use etcd_client::{KeyValue, LeaseTimeToLiveOptions};
use futures::StreamExt;
use tokio::time::{sleep, timeout};

use claim_support::{all_keys, claim_keys, client, client_at, granted, owner_of, raw_etcd, unique};

const LONG: Duration = Duration::from_secs(30);

async fn lock_keys(prefix: &str, name: &str) -> Vec<KeyValue> {
    claim_keys(prefix, "lock", name).await
}

fn hex(o: &OwnerToken) -> Vec<u8> {
    o.to_hex().into_bytes()
}

/// What an observer saw: each item's (term, candidate), `None` for vacant.
type Seen = Arc<Mutex<Vec<Option<(u64, String)>>>>;

/// What identifies a stored key version: (key, create, mod, lease, value).
type Snap = (Vec<u8>, i64, i64, i64, Vec<u8>);

fn snap(kv: &KeyValue) -> Snap {
    (
        kv.key().to_vec(),
        kv.create_revision(),
        kv.mod_revision(),
        kv.lease(),
        kv.value().to_vec(),
    )
}

fn refused(a: coord_core::Result<Attempt>) {
    match a {
        Ok(Attempt::Held { .. }) => {}
        a => panic!("expected a refusal: {a:?}"),
    }
}

fn not_held<T: std::fmt::Debug>(r: coord_core::Result<T>, what: &str) {
    match r {
        Err(Error::NotHeld { .. }) => {}
        r => panic!("{what}: expected NotHeld, got {r:?}"),
    }
}

async fn until_keys(prefix: &str, name: &str, n: usize, limit: Duration) {
    until(&format!("{n} keys under lock {name:?}"), limit, || async {
        lock_keys(prefix, name).await.len() == n
    })
    .await;
}

/// The keys attached to etcd lease `id` (empty if it is gone).
async fn keys_on_lease(id: i64) -> Vec<Vec<u8>> {
    let mut raw = raw_etcd().await;
    match raw
        .lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
    {
        Ok(r) if r.ttl() > 0 => r.keys().to_vec(),
        _ => Vec::new(),
    }
}

/// A stale owner (released, and its key since written again by the same
/// client's next claim, on the same name and then on another name) can
/// neither release nor extend nor take anything, from its own client or
/// another one; the key of the live claim is left exactly as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_owner_after_its_key_and_lease_were_reused() {
    let p = unique("stale");
    let b = client(&p).await;
    let other = client(&p).await;

    let o1 = OwnerToken::random();
    let t1 = granted(b.try_acquire("n1", &o1, LONG).await);
    let k = lock_keys(&p, "n1").await;
    assert_eq!(k.len(), 1);
    let (key1, lease1) = (k[0].key().to_vec(), k[0].lease());
    assert!(
        String::from_utf8_lossy(&key1).ends_with(&format!("/{lease1:x}")),
        "the key is not named by its lease: {:?}",
        String::from_utf8_lossy(&key1)
    );
    assert!(b.release("n1", &o1).await.unwrap());

    // Same name, same client: the spare lease writes the same key.
    let o2 = OwnerToken::random();
    let t2 = granted(b.try_acquire("n1", &o2, LONG).await);
    assert!(t2 > t1, "token {t2} after {t1}");
    let k = lock_keys(&p, "n1").await;
    assert_eq!(k.len(), 1);
    assert_eq!(k[0].key(), &key1[..], "the scenario needs the key reused");
    assert_eq!(owner_of(&k[0]), hex(&o2));
    let before = snap(&k[0]);

    assert!(
        !b.release("n1", &o1).await.unwrap(),
        "stale release said held"
    );
    assert!(
        !b.extend("n1", &o1, LONG).await.unwrap(),
        "stale extend said held"
    );
    assert!(!other.release("n1", &o1).await.unwrap());
    assert!(!other.extend("n1", &o1, LONG).await.unwrap());
    // The stale owner trying again is refused (o2 holds) ...
    refused(b.try_acquire("n1", &o1, LONG).await);
    // ... and leaves nothing behind once it gives up.
    assert!(!b.release("n1", &o1).await.unwrap());
    let k = lock_keys(&p, "n1").await;
    assert_eq!(k.len(), 1);
    assert_eq!(
        snap(&k[0]),
        before,
        "a stale owner changed the holder's key"
    );
    assert!(b.extend("n1", &o2, LONG).await.unwrap());
    assert!(b.release("n1", &o2).await.unwrap());

    // Another name, same client: the lease (the key's suffix) is reused.
    let o3 = OwnerToken::random();
    let t3 = granted(b.try_acquire("n2", &o3, LONG).await);
    assert!(t3 > t2);
    let k2 = lock_keys(&p, "n2").await;
    assert_eq!(k2.len(), 1);
    assert_eq!(k2[0].lease(), lease1, "the scenario needs the lease reused");
    let before2 = snap(&k2[0]);
    for (name, o) in [("n1", &o1), ("n1", &o2), ("n2", &o1), ("n2", &o2)] {
        assert!(!b.release(name, o).await.unwrap(), "{name}: stale release");
        assert!(
            !b.extend(name, o, LONG).await.unwrap(),
            "{name}: stale extend"
        );
        assert!(
            !other.release(name, o).await.unwrap(),
            "{name}: other release"
        );
    }
    assert!(lock_keys(&p, "n1").await.is_empty());
    let k2 = lock_keys(&p, "n2").await;
    assert_eq!(k2.len(), 1);
    assert_eq!(snap(&k2[0]), before2, "a stale owner changed n2's key");
    let r = Lock::inspect(&*other, "n2").await.unwrap();
    assert_eq!((r.holders[0].owner, r.holders[0].token.get()), (o3, t3));
    assert!(b.extend("n2", &o3, LONG).await.unwrap());
    assert!(b.release("n2", &o3).await.unwrap());
    assert!(all_keys(&p).await.is_empty());
}

/// A claim whose lease is gone on the server (lapsed with a 1 s TTL, or
/// ended while the client still counts it valid) and a next holder of
/// the same client on the same name: the stale owner's release and extend
/// say not held and leave the next holder's key alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_owner_after_its_lease_ended_on_the_server() {
    let p = unique("expired");
    let b = client(&p).await;
    let other = client(&p).await;
    let short = Duration::from_secs(1);

    // (a) the TTL runs out; nobody renews.
    let o1 = OwnerToken::random();
    let t1 = granted(b.try_acquire("x", &o1, short).await);
    until_keys(&p, "x", 0, Duration::from_secs(10)).await;
    let o2 = OwnerToken::random();
    let t2 = granted(b.try_acquire("x", &o2, short).await);
    assert!(t2 > t1);
    let before = snap(&lock_keys(&p, "x").await[0]);
    assert!(!b.extend("x", &o1, short).await.unwrap());
    assert!(!b.release("x", &o1).await.unwrap());
    assert!(!other.release("x", &o1).await.unwrap());
    let k = lock_keys(&p, "x").await;
    assert_eq!(k.len(), 1);
    assert_eq!(snap(&k[0]), before);
    assert!(b.release("x", &o2).await.unwrap());

    // (b) the lease ends on the server while the guard is still valid
    // (as after a pause past the TTL): the same client takes the name
    // again; the stale guard's extend and release are refused.
    let c = b.coord();
    let locks = c.locks().unwrap();
    let g1 = locks.try_acquire("y", LONG).await.unwrap().unwrap();
    let k = lock_keys(&p, "y").await;
    raw_etcd().await.lease_revoke(k[0].lease()).await.unwrap();
    assert!(lock_keys(&p, "y").await.is_empty());
    assert!(g1.is_valid(), "the guard cannot know yet");
    let g2 = locks
        .try_acquire("y", LONG)
        .await
        .unwrap()
        .expect("free now");
    assert!(g2.fencing_token() > g1.fencing_token());
    let before = snap(&lock_keys(&p, "y").await[0]);
    not_held(g1.extend(LONG).await, "extend of a claim whose lease ended");
    not_held(g1.release().await, "release of a claim whose lease ended");
    let k = lock_keys(&p, "y").await;
    assert_eq!(k.len(), 1);
    assert_eq!(
        snap(&k[0]),
        before,
        "the stale guard changed the next holder's key"
    );
    g2.extend(LONG).await.unwrap();
    let ol = other.coord().locks().unwrap();
    assert!(ol.try_acquire("y", LONG).await.unwrap().is_none());
    g2.release().await.unwrap();
    assert!(all_keys(&p).await.is_empty());
}

/// A release of an owner the releasing client has no record of, sent
/// through a slow link: its read sees the owner's key, then (before its
/// conditional delete lands) the owner releases and the same client's
/// next claim writes the same key again. The late delete must not remove
/// the next claim. Same for a resignation.
///
/// The slow link delays each message 1 s, so the owner's release and the
/// next claim go between the slow read (at 1 s) and the slow delete (at
/// 3 s). On a loaded machine the slow delete may still come first: it
/// then rightly releases the owner, the round proves nothing and is
/// played again on another name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_release_by_owner_token_never_removes_the_reused_key() {
    let p = unique("slowrel");
    let b = client(&p).await;
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let slow = client_at(proxy.port(), &p, 15_000).await;
    assert!(!slow.release("warm", &OwnerToken::random()).await.unwrap());
    const ROUNDS: usize = 5;
    let mut proved = false;
    for round in 0..ROUNDS {
        if slow_release_round(&p, &b, &slow, &proxy, &format!("r{round}")).await {
            proved = true;
            break;
        }
    }
    assert!(
        proved,
        "the slow lock release came first in all {ROUNDS} rounds"
    );
    let mut proved = false;
    for round in 0..ROUNDS {
        if slow_resign_round(&p, &b, &slow, &proxy, &format!("e{round}")).await {
            proved = true;
            break;
        }
    }
    assert!(
        proved,
        "the slow resignation came first in all {ROUNDS} rounds"
    );
    assert!(all_keys(&p).await.is_empty());
}

/// The slow link's delay each way in the slow-release rounds.
const SLOW_LINK: Duration = Duration::from_secs(1);

/// A lock round of `a_slow_release_by_owner_token_never_removes_the_reused_key`
/// on `name`: false if the slow release came first (nothing proved).
async fn slow_release_round(
    p: &str,
    b: &Arc<EtcdBackend>,
    slow: &Arc<EtcdBackend>,
    proxy: &FaultProxy,
    name: &str,
) -> bool {
    let o1 = OwnerToken::random();
    let t1 = granted(b.try_acquire(name, &o1, LONG).await);
    let key = lock_keys(p, name).await[0].key().to_vec();
    proxy.latency(SLOW_LINK);
    let (s, n) = (slow.clone(), name.to_string());
    let late = tokio::spawn(async move { s.release(&n, &o1).await });
    sleep(SLOW_LINK + SLOW_LINK / 2).await;
    if !b.release(name, &o1).await.unwrap() {
        let released = late.await.unwrap().unwrap();
        proxy.latency(Duration::ZERO);
        assert!(released, "{name}: neither release found the owner holding");
        assert!(lock_keys(p, name).await.is_empty(), "{name}: a key left");
        return false;
    }
    let o2 = OwnerToken::random();
    let t2 = granted(b.try_acquire(name, &o2, LONG).await);
    assert!(t2 > t1);
    let released = late.await.unwrap().unwrap();
    proxy.latency(Duration::ZERO);
    assert!(
        !released,
        "a release of an owner that had released said held"
    );
    let k = lock_keys(p, name).await;
    assert_eq!(k.len(), 1, "the reused key was removed");
    assert_eq!(k[0].key(), &key[..], "the scenario needs the key reused");
    assert_eq!(
        (owner_of(&k[0]), k[0].create_revision() as u64),
        (hex(&o2), t2)
    );
    assert!(b.extend(name, &o2, LONG).await.unwrap());
    assert!(b.release(name, &o2).await.unwrap());
    true
}

/// The election round of the same: false if the slow resignation came
/// first (nothing proved).
async fn slow_resign_round(
    p: &str,
    b: &Arc<EtcdBackend>,
    slow: &Arc<EtcdBackend>,
    proxy: &FaultProxy,
    name: &str,
) -> bool {
    let e1 = OwnerToken::random();
    let term1 = granted(b.try_campaign(name, "cand one", &e1, LONG).await);
    let ekey = claim_keys(p, "election", name).await[0].key().to_vec();
    proxy.latency(SLOW_LINK);
    let (s, n) = (slow.clone(), name.to_string());
    let late = tokio::spawn(async move { s.resign(&n, &e1).await });
    sleep(SLOW_LINK + SLOW_LINK / 2).await;
    if !b.resign(name, &e1).await.unwrap() {
        let resigned = late.await.unwrap().unwrap();
        proxy.latency(Duration::ZERO);
        assert!(resigned, "{name}: neither resignation found the leader");
        assert!(
            claim_keys(p, "election", name).await.is_empty(),
            "{name}: a key left"
        );
        return false;
    }
    let e2 = OwnerToken::random();
    let term2 = granted(b.try_campaign(name, "cand two", &e2, LONG).await);
    assert!(term2 > term1);
    let resigned = late.await.unwrap().unwrap();
    proxy.latency(Duration::ZERO);
    assert!(!resigned, "a resignation of a past leader said it led");
    let k = claim_keys(p, "election", name).await;
    assert_eq!(k.len(), 1, "the reused election key was removed");
    assert_eq!(k[0].key(), &ekey[..], "the scenario needs the key reused");
    let leader = b.leader(name).await.unwrap().expect("e2 leads");
    assert_eq!(
        (leader.candidate.as_str(), leader.term.get()),
        ("cand two", term2)
    );
    assert!(Election::renew(&**b, name, &e2, LONG).await.unwrap());
    assert!(b.resign(name, &e2).await.unwrap());
    true
}

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
        granted(b.try_acquire("h", &o, LONG).await);
        assert!(b.release("h", &o).await.unwrap());
    }
    let (o1, o2) = (OwnerToken::random(), OwnerToken::random());
    let t1 = granted(b.try_acquire("h", &o1, LONG).await);
    refused(b.try_acquire("h", &o2, LONG).await);
    let waiter = Lock::subscribe(&*b, "h", &o2).await.unwrap();
    refused(b.try_acquire("h", &o2, LONG).await);
    let k = lock_keys(&p, "h").await;
    assert_eq!(
        k.iter().map(owner_of).collect::<Vec<_>>(),
        vec![hex(&o1), hex(&o2)],
        "holder then waiter"
    );
    assert!(
        other.release("h", &o1).await.unwrap(),
        "the holder's release said not held"
    );
    timeout(Duration::from_secs(5), waiter.notified())
        .await
        .expect("the waiter is woken");
    let t2 = granted(b.try_acquire("h", &o2, LONG).await);
    assert!(t2 > t1);
    // A claim granted after queueing marks its key as the head (a put in
    // the background, see claim/handoff.rs): let it land before the snapshot.
    until("the head marker", Duration::from_secs(5), || async {
        lock_keys(&p, "h").await[0].version() > 1
    })
    .await;
    let before = snap(&lock_keys(&p, "h").await[0]);
    assert!(!b.extend("h", &o1, LONG).await.unwrap(), "stale extend");
    assert!(!b.release("h", &o1).await.unwrap(), "stale release");
    assert!(!other.release("h", &o1).await.unwrap(), "second release");
    refused(b.try_acquire("h", &o1, LONG).await);
    assert!(!b.release("h", &o1).await.unwrap());
    let k = lock_keys(&p, "h").await;
    assert_eq!(k.len(), 1);
    assert_eq!(snap(&k[0]), before);
    assert!(b.extend("h", &o2, LONG).await.unwrap());
    assert!(b.release("h", &o2).await.unwrap());
    let o3 = OwnerToken::random();
    assert!(granted(b.try_acquire("h", &o3, LONG).await) > t2);
    assert!(b.release("h", &o3).await.unwrap());
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

/// Hundreds of grants on one name from two clients (two tasks in one),
/// with 1 s TTLs and now and then a holder that walks away and lets its
/// lease lapse: at most one holder at a time, tokens strictly rising in
/// grant order, every other release succeeds, nothing left at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_over_hundreds_of_cycles_with_contention_and_expiry() {
    let p = unique("fence");
    let a = client(&p).await;
    let bc = client(&p).await;
    let ttl = Duration::from_secs(2);
    let busy = Arc::new(AtomicBool::new(false));
    let last = Arc::new(Mutex::new(0u64));
    let grants = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (who, backend) in [(0u32, a.clone()), (1, a.clone()), (2, bc.clone())] {
        let (busy, last, grants) = (busy.clone(), last.clone(), grants.clone());
        let locks = backend.coord().locks().unwrap();
        tasks.push(tokio::spawn(async move {
            for i in 0..100u32 {
                let g = locks
                    .acquire("fence", ttl, Duration::from_secs(60))
                    .await
                    .unwrap_or_else(|e| panic!("task {who} cycle {i}: {e}"));
                assert!(
                    !busy.swap(true, Ordering::AcqRel),
                    "task {who} cycle {i}: two holders at once"
                );
                let t = g.fencing_token().get();
                {
                    let mut l = last.lock().unwrap();
                    assert!(t > *l, "task {who} cycle {i}: token {t} after {}", *l);
                    *l = t;
                }
                grants.fetch_add(1, Ordering::AcqRel);
                busy.store(false, Ordering::Release);
                if i % 50 == 25 {
                    // Walk away: no release; the server ends it at its TTL.
                    std::mem::forget(g);
                } else {
                    g.release()
                        .await
                        .unwrap_or_else(|e| panic!("task {who} cycle {i}: release: {e}"));
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(grants.load(Ordering::Acquire), 300);
    until_keys(&p, "fence", 0, Duration::from_secs(10)).await;
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

/// Two owners of one client wait on one name behind a holder of that
/// client (guards, spares warmed first): distinct keys and leases, granted
/// in arrival order, each with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_local_waiters_are_served_in_order_through_guards() {
    let p = unique("fifo");
    let a = client(&p).await;
    let locks = a.coord().locks().unwrap();
    for _ in 0..4 {
        locks
            .try_acquire("q", LONG)
            .await
            .unwrap()
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let h = locks.try_acquire("q", LONG).await.unwrap().unwrap();
    let wait = Duration::from_secs(30);
    let l1 = locks.clone();
    let w1 = tokio::spawn(async move { l1.acquire("q", LONG, wait).await });
    until_keys(&p, "q", 2, Duration::from_secs(5)).await;
    let l2 = locks.clone();
    let w2 = tokio::spawn(async move { l2.acquire("q", LONG, wait).await });
    until_keys(&p, "q", 3, Duration::from_secs(5)).await;
    let k = lock_keys(&p, "q").await;
    let names: std::collections::HashSet<&[u8]> = k.iter().map(|kv| kv.key()).collect();
    let leases: std::collections::HashSet<i64> = k.iter().map(|kv| kv.lease()).collect();
    assert_eq!(
        (names.len(), leases.len()),
        (3, 3),
        "claims share a key or a lease"
    );
    let second_owner = owner_of(&k[1]);

    let th = h.fencing_token();
    h.release().await.unwrap();
    let g1 = timeout(Duration::from_secs(5), w1)
        .await
        .expect("the first waiter is granted")
        .unwrap()
        .unwrap();
    assert!(g1.fencing_token() > th);
    let k = lock_keys(&p, "q").await;
    assert_eq!(k.len(), 2);
    assert_eq!(
        owner_of(&k[0]),
        second_owner,
        "the first in line is not the holder"
    );
    assert_eq!(k[0].create_revision() as u64, g1.fencing_token().get());
    sleep(Duration::from_millis(300)).await;
    assert!(
        !w2.is_finished(),
        "the second waiter was granted while the first holds"
    );
    let t1 = g1.fencing_token();
    g1.release().await.unwrap();
    let g2 = timeout(Duration::from_secs(5), w2)
        .await
        .expect("the second waiter is granted")
        .unwrap()
        .unwrap();
    assert!(g2.fencing_token() > t1);
    g2.release().await.unwrap();
    assert!(all_keys(&p).await.is_empty());
}

/// An acquire dropped mid-wait leaves nothing in etcd: not while the
/// holder holds, not when the drop races the holder's release (the waiter
/// may have just been granted), and the same client and another one take
/// the name at once afterwards. A campaign dropped mid-wait likewise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_leaves_nothing_behind() {
    let p = unique("cancel");
    let a = client(&p).await;
    let other = client(&p).await;
    let locks = a.coord().locks().unwrap();
    let olocks = other.coord().locks().unwrap();
    let wait = Duration::from_secs(30);

    // Dropped while the holder holds.
    let h = locks.try_acquire("c", LONG).await.unwrap().unwrap();
    let l = locks.clone();
    let w = tokio::spawn(async move { l.acquire("c", LONG, wait).await });
    until_keys(&p, "c", 2, Duration::from_secs(5)).await;
    w.abort();
    let _ = w.await;
    until_keys(&p, "c", 1, Duration::from_secs(5)).await;
    h.release().await.unwrap();
    until_keys(&p, "c", 0, Duration::from_secs(5)).await;
    olocks
        .try_acquire("c", LONG)
        .await
        .unwrap()
        .expect("free for another client")
        .release()
        .await
        .unwrap();

    // Dropped as the holder releases.
    for i in 0..24u64 {
        let h = locks.try_acquire("c", LONG).await.unwrap().unwrap();
        let l = locks.clone();
        let w = tokio::spawn(async move { l.acquire("c", LONG, wait).await });
        until_keys(&p, "c", 2, Duration::from_secs(5)).await;
        let rel = tokio::spawn(h.release());
        sleep(Duration::from_millis(i % 8)).await;
        w.abort();
        let _ = w.await;
        rel.await.unwrap().unwrap();
        until(
            &format!("round {i}: nothing left"),
            Duration::from_secs(5),
            || async { lock_keys(&p, "c").await.is_empty() },
        )
        .await;
        let ours = locks
            .try_acquire("c", LONG)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("round {i}: the same client is refused"));
        ours.release().await.unwrap();
        olocks
            .try_acquire("c", LONG)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("round {i}: another client is refused"))
            .release()
            .await
            .unwrap();
    }

    // A campaign dropped mid-wait.
    let el = a.coord().elections().unwrap();
    let leader = el.try_campaign("ce", "lead", LONG).await.unwrap().unwrap();
    let e2 = el.clone();
    let w = tokio::spawn(async move { e2.campaign("ce", "next", LONG, wait).await });
    sleep(Duration::from_millis(300)).await;
    w.abort();
    let _ = w.await;
    leader.resign().await.unwrap();
    until("the election is vacant", Duration::from_secs(5), || async {
        claim_keys(&p, "election", "ce").await.is_empty()
    })
    .await;
    let oel = other.coord().elections().unwrap();
    oel.try_campaign("ce", "x", LONG)
        .await
        .unwrap()
        .expect("vacant for another client")
        .resign()
        .await
        .unwrap();
    assert!(all_keys(&p).await.is_empty());
}

/// Names with `/`, `%`, spaces, non-ASCII and maximal length, held at
/// once by owners of one client: each key sits in its own escaped queue,
/// another client is refused each, releasing one frees no other, and the
/// leases (key suffixes) reused across names never mix two names up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_names_keep_their_own_keys_across_lease_reuse() {
    let p = unique("names");
    let b = client(&p).await;
    let other = client(&p).await;
    let long = "n".repeat(512);
    let names: Vec<&str> = vec![
        "a",
        "a/b",
        "a%2Fb",
        "a/",
        "%",
        "/",
        "%2F",
        "a b",
        "ÿÿ",
        "日本/語",
        "a\u{a0}b",
        &long,
    ];
    let mut last: HashMap<&str, u64> = HashMap::new();
    for round in 0..3 {
        let mut owners = Vec::new();
        for n in &names {
            let o = OwnerToken::random();
            let t = granted(b.try_acquire(n, &o, LONG).await);
            assert!(t > *last.get(n).unwrap_or(&0), "{n:?}: token");
            last.insert(n, t);
            owners.push((*n, o, t));
        }
        for (n, o, t) in &owners {
            let k = lock_keys(&p, n).await;
            assert_eq!(k.len(), 1, "round {round}: {n:?} has {} keys", k.len());
            assert_eq!(
                (owner_of(&k[0]), k[0].create_revision() as u64),
                (hex(o), *t)
            );
            let ro = OwnerToken::random();
            refused(other.try_acquire(n, &ro, LONG).await);
            assert!(!other.release(n, &ro).await.unwrap());
            let r = Lock::inspect(&*other, n).await.unwrap();
            assert_eq!((r.holders[0].owner, r.holders[0].token.get()), (*o, *t));
        }
        // Release in an order that differs per round; the others stay.
        let mut order: Vec<usize> = (0..owners.len()).collect();
        order.rotate_left(round * 5 % owners.len());
        for (j, &i) in order.iter().enumerate() {
            let (n, o, _) = &owners[i];
            assert!(b.release(n, o).await.unwrap(), "{n:?}: release");
            for &i2 in &order[j + 1..] {
                let (n2, o2, t2) = &owners[i2];
                let k = lock_keys(&p, n2).await;
                assert_eq!(k.len(), 1, "releasing {n:?} touched {n2:?}");
                assert_eq!(
                    (owner_of(&k[0]), k[0].create_revision() as u64),
                    (hex(o2), *t2)
                );
            }
        }
    }
    assert!(all_keys(&p).await.is_empty());
}

/// Elections on odd names with odd candidates (spaces anywhere, only a
/// space, `/` and `%`, non-ASCII; through the raw trait also the empty
/// candidate): every term rises, `leader`, `inspect` and an observer of
/// another client show each term with its own candidate, a rival is
/// refused, and a resigned name leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_terms_and_candidates_survive_key_reuse() {
    let p = unique("elect");
    let a = client(&p).await;
    let other = client(&p).await;
    let el = a.coord().elections().unwrap();
    let oel = other.coord().elections().unwrap();
    let names = ["e", "e/x", "e%2Fx", "e x", "ÿ/%"];
    let candidates = [
        "a b", " lead", "trail ", " ", "  ", "x/y%z", "ü ñ", "node-1", "a  b  ",
    ];
    for name in names {
        let seen: Seen = Arc::default();
        let mut observe = Box::pin(oel.observe(name).unwrap());
        let first = timeout(Duration::from_secs(5), observe.next())
            .await
            .expect("the observer answers")
            .unwrap()
            .unwrap();
        assert!(first.is_none(), "{name:?} starts vacant");
        let obs = {
            let seen = seen.clone();
            tokio::spawn(async move {
                while let Some(item) = observe.next().await {
                    let item = item.unwrap().map(|l| (l.term.get(), l.candidate));
                    seen.lock().unwrap().push(item);
                }
            })
        };
        let mut terms: HashMap<u64, String> = HashMap::new();
        let mut last = 0;
        let mut key_names = std::collections::HashSet::new();
        for round in 0..2 {
            for cand in candidates {
                let l = el
                    .try_campaign(name, cand, LONG)
                    .await
                    .unwrap()
                    .unwrap_or_else(|| panic!("{name:?} {cand:?}: not elected"));
                let term = l.term().get();
                assert!(term > last, "{name:?}: term {term} after {last}");
                last = term;
                terms.insert(term, cand.to_string());
                assert_eq!(l.candidate(), cand);
                let info = oel.leader(name).await.unwrap().expect("a leader");
                assert_eq!((info.candidate.as_str(), info.term.get()), (cand, term));
                let d = oel.inspect(name).await.unwrap().expect("a leader");
                assert_eq!((d.candidate.as_str(), d.term.get()), (cand, term));
                assert_eq!(d.owner_id, l.owner_id());
                assert!(
                    oel.try_campaign(name, "rival", LONG)
                        .await
                        .unwrap()
                        .is_none(),
                    "{name:?}: a rival was elected beside {cand:?}"
                );
                for kv in claim_keys(&p, "election", name).await {
                    key_names.insert(kv.key().to_vec());
                }
                if round == 1 && cand == " " {
                    // Through the raw trait: another client's resign of a
                    // token that does not lead changes nothing.
                    assert!(!other.resign(name, &OwnerToken::random()).await.unwrap());
                }
                l.resign().await.unwrap();
            }
        }
        // Raw trait: the empty candidate.
        let o = OwnerToken::random();
        let term = granted(a.try_campaign(name, "", &o, LONG).await);
        assert!(term > last);
        terms.insert(term, String::new());
        let info = other.leader(name).await.unwrap().expect("a leader");
        assert_eq!((info.candidate.as_str(), info.term.get()), ("", term));
        assert!(a.resign(name, &o).await.unwrap());

        until(
            &format!("{name:?}: observer sees vacancy"),
            Duration::from_secs(10),
            || {
                let seen = seen.clone();
                async move {
                    let s = seen.lock().unwrap();
                    // Terms that end faster than a round trip may be seen
                    // only as their end state: wait for the final vacancy.
                    s.last().is_some_and(|x| x.is_none())
                }
            },
        )
        .await;
        obs.abort();
        let seen = seen.lock().unwrap().clone();
        assert!(
            seen.iter().flatten().count() > 0,
            "{name:?}: the observer saw none of {} terms",
            terms.len()
        );
        let mut max = 0;
        for (t, c) in seen.iter().flatten() {
            assert!(*t >= max, "{name:?}: observed term {t} after {max}");
            max = *t;
            assert_eq!(
                terms.get(t),
                Some(c),
                "{name:?}: term {t} observed with candidate {c:?}"
            );
        }
        assert!(
            key_names.len() < candidates.len() * 2,
            "{name:?}: no election key was reused ({} keys)",
            key_names.len()
        );
        assert!(claim_keys(&p, "election", name).await.is_empty());
    }
    assert!(all_keys(&p).await.is_empty());
}

/// Semaphores, locks and elections of one client draw on one pool of
/// spare leases (same TTL): a lock or election key's lease must carry no
/// other key, whatever the order of grants and releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_lease_carries_only_its_own_key_across_primitives() {
    let p = unique("mixed");
    let a = client(&p).await;
    let c = a.coord();
    let (sems, locks, el) = (
        c.semaphores().unwrap(),
        c.locks().unwrap(),
        c.elections().unwrap(),
    );
    let mut last_lock = 0;
    for i in 0..30u32 {
        let permit = sems
            .try_acquire("s", 2, LONG)
            .await
            .unwrap()
            .expect("a permit");
        let g = locks
            .try_acquire("l", LONG)
            .await
            .unwrap()
            .expect("the lock");
        let l = el
            .try_campaign("e", "me", LONG)
            .await
            .unwrap()
            .expect("leader");
        assert!(g.fencing_token().get() > last_lock);
        last_lock = g.fencing_token().get();
        for (kind, name) in [("lock", "l"), ("election", "e")] {
            let k = claim_keys(&p, kind, name).await;
            assert_eq!(k.len(), 1, "cycle {i}: {kind}");
            let on = keys_on_lease(k[0].lease()).await;
            assert_eq!(
                on,
                vec![k[0].key().to_vec()],
                "cycle {i}: the {kind} key's lease carries other keys"
            );
        }
        match i % 3 {
            0 => {
                permit.release().await.unwrap();
                g.release().await.unwrap();
                l.resign().await.unwrap();
            }
            1 => {
                l.resign().await.unwrap();
                g.release().await.unwrap();
                permit.release().await.unwrap();
            }
            _ => {
                g.release().await.unwrap();
                permit.release().await.unwrap();
                l.resign().await.unwrap();
            }
        }
        // A lock on another name takes a spare in between.
        let g2 = locks.try_acquire("l2", LONG).await.unwrap().unwrap();
        let k = lock_keys(&p, "l2").await;
        assert_eq!(keys_on_lease(k[0].lease()).await, vec![k[0].key().to_vec()]);
        g2.release().await.unwrap();
    }
    until("nothing left", Duration::from_secs(5), || async {
        all_keys(&p).await.is_empty()
    })
    .await;
}

/// An extend with another TTL moves the key (named by its first lease) to
/// a new lease; after release that lease is a spare of the new TTL and
/// names the next claim's key. Stale owners stay refused, each lease
/// carries only its own key, a leader's candidate survives the move, and
/// terms and tokens rise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_with_another_ttl_then_reuse_of_the_moved_lease() {
    let p = unique("move");
    let b = client(&p).await;
    let other = client(&p).await;
    let short = Duration::from_secs(20);
    let o1 = OwnerToken::random();
    let t1 = granted(b.try_acquire("m", &o1, LONG).await);
    let k = lock_keys(&p, "m").await;
    let (key1, lease1) = (k[0].key().to_vec(), k[0].lease());
    assert!(b.extend("m", &o1, short).await.unwrap());
    let k = lock_keys(&p, "m").await;
    assert_eq!((k[0].key(), k[0].create_revision() as u64), (&key1[..], t1));
    let moved = k[0].lease();
    assert_ne!(moved, lease1, "another TTL moves the key to another lease");
    assert_eq!(owner_of(&k[0]), hex(&o1));
    assert_eq!(keys_on_lease(moved).await, vec![key1.clone()]);
    assert!(b.release("m", &o1).await.unwrap());

    let o2 = OwnerToken::random();
    let t2 = granted(b.try_acquire("m", &o2, short).await);
    assert!(t2 > t1);
    let k = lock_keys(&p, "m").await;
    assert_eq!(k.len(), 1);
    assert_eq!(keys_on_lease(k[0].lease()).await, vec![k[0].key().to_vec()]);
    let before = snap(&k[0]);
    assert!(!b.release("m", &o1).await.unwrap());
    assert!(!b.extend("m", &o1, short).await.unwrap());
    assert!(!b.extend("m", &o1, LONG).await.unwrap());
    assert!(!other.release("m", &o1).await.unwrap());
    assert_eq!(snap(&lock_keys(&p, "m").await[0]), before);
    // And back to the first TTL, then a claim of that TTL on another name.
    assert!(b.extend("m", &o2, LONG).await.unwrap());
    let k = lock_keys(&p, "m").await;
    assert_eq!(k[0].create_revision() as u64, t2);
    assert_eq!(keys_on_lease(k[0].lease()).await, vec![k[0].key().to_vec()]);
    let o3 = OwnerToken::random();
    let t3 = granted(b.try_acquire("m2", &o3, LONG).await);
    assert!(t3 > t2);
    let k3 = lock_keys(&p, "m2").await;
    assert_eq!(
        keys_on_lease(k3[0].lease()).await,
        vec![k3[0].key().to_vec()]
    );
    assert!(b.release("m", &o2).await.unwrap());
    assert!(b.release("m2", &o3).await.unwrap());

    // Elections: a renewal with another TTL keeps the candidate.
    let e1 = OwnerToken::random();
    let term1 = granted(b.try_campaign("em", "node a 1", &e1, LONG).await);
    assert!(Election::renew(&*b, "em", &e1, short).await.unwrap());
    let leader = other.leader("em").await.unwrap().expect("a leader");
    assert_eq!(
        (leader.candidate.as_str(), leader.term.get()),
        ("node a 1", term1)
    );
    assert!(b.resign("em", &e1).await.unwrap());
    let e2 = OwnerToken::random();
    let term2 = granted(b.try_campaign("em", "node b", &e2, short).await);
    assert!(term2 > term1);
    assert!(!Election::renew(&*b, "em", &e1, short).await.unwrap());
    assert!(!b.resign("em", &e1).await.unwrap());
    let leader = other.leader("em").await.unwrap().expect("a leader");
    assert_eq!(
        (leader.candidate.as_str(), leader.term.get()),
        ("node b", term2)
    );
    assert!(b.resign("em", &e2).await.unwrap());
    assert!(all_keys(&p).await.is_empty());
}
