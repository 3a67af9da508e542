//! Stale owners of a key named by a lease that was reused or ended: their
//! release and extend report not held and change nothing, also a slow
//! release or resignation by owner token that arrives after the reuse.

use crate::claim_support;
use std::sync::Arc;
use std::time::Duration;

use conformance::testkit::etcd;
use conformance::testkit::proxy::FaultProxy;
use coord_core::{Election, Error, Lock, OwnerToken};
use coord_etcd::EtcdBackend;
use tokio::time::sleep;

use claim_support::{all_keys, claim_keys, client, client_at, granted, owner_of, raw_etcd, unique};

use super::{LONG, hex, lock_keys, refused, snap, until_keys};

fn not_held<T: std::fmt::Debug>(r: coord_core::Result<T>, what: &str) {
    match r {
        Err(Error::NotHeld { .. }) => {}
        r => panic!("{what}: expected NotHeld, got {r:?}"),
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
    let t1 = granted(b.try_acquire("n1", o1.step(), LONG).await);
    let k = lock_keys(&p, "n1").await;
    assert_eq!(k.len(), 1);
    let (key1, lease1) = (k[0].key().to_vec(), k[0].lease());
    assert!(
        String::from_utf8_lossy(&key1).ends_with(&format!("/{lease1:x}")),
        "the key is not named by its lease: {:?}",
        String::from_utf8_lossy(&key1)
    );
    assert!(b.release("n1", o1.step()).await.unwrap());

    // Same name, same client: the spare lease writes the same key.
    let o2 = OwnerToken::random();
    let t2 = granted(b.try_acquire("n1", o2.step(), LONG).await);
    assert!(t2 > t1, "token {t2} after {t1}");
    let k = lock_keys(&p, "n1").await;
    assert_eq!(k.len(), 1);
    assert_eq!(k[0].key(), &key1[..], "the scenario needs the key reused");
    assert_eq!(owner_of(&k[0]), hex(&o2));
    let before = snap(&k[0]);

    assert!(
        !b.release("n1", o1.step()).await.unwrap(),
        "stale release said held"
    );
    assert!(
        !b.extend("n1", o1.step(), LONG).await.unwrap(),
        "stale extend said held"
    );
    assert!(!other.release("n1", o1.step()).await.unwrap());
    assert!(!other.extend("n1", o1.step(), LONG).await.unwrap());
    // The stale owner trying again is refused (o2 holds) ...
    refused(b.try_acquire("n1", o1.step(), LONG).await);
    // ... and leaves nothing behind once it gives up.
    assert!(!b.release("n1", o1.step()).await.unwrap());
    let k = lock_keys(&p, "n1").await;
    assert_eq!(k.len(), 1);
    assert_eq!(
        snap(&k[0]),
        before,
        "a stale owner changed the holder's key"
    );
    assert!(b.extend("n1", o2.step(), LONG).await.unwrap());
    assert!(b.release("n1", o2.step()).await.unwrap());

    // Another name, same client: the lease (the key's suffix) is reused.
    let o3 = OwnerToken::random();
    let t3 = granted(b.try_acquire("n2", o3.step(), LONG).await);
    assert!(t3 > t2);
    let k2 = lock_keys(&p, "n2").await;
    assert_eq!(k2.len(), 1);
    assert_eq!(k2[0].lease(), lease1, "the scenario needs the lease reused");
    let before2 = snap(&k2[0]);
    for (name, o) in [("n1", &o1), ("n1", &o2), ("n2", &o1), ("n2", &o2)] {
        assert!(
            !b.release(name, o.step()).await.unwrap(),
            "{name}: stale release"
        );
        assert!(
            !b.extend(name, o.step(), LONG).await.unwrap(),
            "{name}: stale extend"
        );
        assert!(
            !other.release(name, o.step()).await.unwrap(),
            "{name}: other release"
        );
    }
    assert!(lock_keys(&p, "n1").await.is_empty());
    let k2 = lock_keys(&p, "n2").await;
    assert_eq!(k2.len(), 1);
    assert_eq!(snap(&k2[0]), before2, "a stale owner changed n2's key");
    let r = Lock::inspect(&*other, "n2").await.unwrap();
    assert_eq!((r.holders[0].owner, r.holders[0].token.get()), (o3, t3));
    assert!(b.extend("n2", o3.step(), LONG).await.unwrap());
    assert!(b.release("n2", o3.step()).await.unwrap());
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
    let t1 = granted(b.try_acquire("x", o1.step(), short).await);
    until_keys(&p, "x", 0, Duration::from_secs(10)).await;
    let o2 = OwnerToken::random();
    let t2 = granted(b.try_acquire("x", o2.step(), short).await);
    assert!(t2 > t1);
    let before = snap(&lock_keys(&p, "x").await[0]);
    assert!(!b.extend("x", o1.step(), short).await.unwrap());
    assert!(!b.release("x", o1.step()).await.unwrap());
    assert!(!other.release("x", o1.step()).await.unwrap());
    let k = lock_keys(&p, "x").await;
    assert_eq!(k.len(), 1);
    assert_eq!(snap(&k[0]), before);
    assert!(b.release("x", o2.step()).await.unwrap());

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
    assert!(
        !slow
            .release("warm", OwnerToken::random().step())
            .await
            .unwrap()
    );
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
    let t1 = granted(b.try_acquire(name, o1.step(), LONG).await);
    let key = lock_keys(p, name).await[0].key().to_vec();
    proxy.latency(SLOW_LINK);
    let (s, n) = (slow.clone(), name.to_string());
    let late = tokio::spawn(async move { s.release(&n, o1.step()).await });
    sleep(SLOW_LINK + SLOW_LINK / 2).await;
    if !b.release(name, o1.step()).await.unwrap() {
        let released = late.await.unwrap().unwrap();
        proxy.latency(Duration::ZERO);
        assert!(released, "{name}: neither release found the owner holding");
        assert!(lock_keys(p, name).await.is_empty(), "{name}: a key left");
        return false;
    }
    let o2 = OwnerToken::random();
    let t2 = granted(b.try_acquire(name, o2.step(), LONG).await);
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
    assert!(b.extend(name, o2.step(), LONG).await.unwrap());
    assert!(b.release(name, o2.step()).await.unwrap());
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
    let term1 = granted(b.try_campaign(name, "cand one", e1.step(), LONG).await);
    let ekey = claim_keys(p, "election", name).await[0].key().to_vec();
    proxy.latency(SLOW_LINK);
    let (s, n) = (slow.clone(), name.to_string());
    let late = tokio::spawn(async move { s.resign(&n, e1.step()).await });
    sleep(SLOW_LINK + SLOW_LINK / 2).await;
    if !b.resign(name, e1.step()).await.unwrap() {
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
    let term2 = granted(b.try_campaign(name, "cand two", e2.step(), LONG).await);
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
    assert!(Election::renew(&**b, name, e2.step(), LONG).await.unwrap());
    assert!(b.resign(name, e2.step()).await.unwrap());
    true
}
