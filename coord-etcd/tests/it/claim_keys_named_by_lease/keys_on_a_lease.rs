//! What a claim's lease carries: only its own key across primitives, and
//! after an extend with another TTL moved the key, the moved lease's
//! reuse.

use crate::claim_support;
use std::time::Duration;

use conformance::testkit::wait::until;
use coord_core::{Election, Lock, OwnerToken};
use etcd_client::LeaseTimeToLiveOptions;

use claim_support::{all_keys, claim_keys, client, granted, owner_of, raw_etcd, unique};

use super::{LONG, hex, lock_keys, snap};

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
    let t1 = granted(b.try_acquire("m", o1.step(), LONG).await);
    let k = lock_keys(&p, "m").await;
    let (key1, lease1) = (k[0].key().to_vec(), k[0].lease());
    assert!(b.extend("m", o1.step(), short).await.unwrap());
    let k = lock_keys(&p, "m").await;
    assert_eq!((k[0].key(), k[0].create_revision() as u64), (&key1[..], t1));
    let moved = k[0].lease();
    assert_ne!(moved, lease1, "another TTL moves the key to another lease");
    assert_eq!(owner_of(&k[0]), hex(&o1));
    assert_eq!(keys_on_lease(moved).await, vec![key1.clone()]);
    assert!(b.release("m", o1.step()).await.unwrap());

    let o2 = OwnerToken::random();
    let t2 = granted(b.try_acquire("m", o2.step(), short).await);
    assert!(t2 > t1);
    let k = lock_keys(&p, "m").await;
    assert_eq!(k.len(), 1);
    assert_eq!(keys_on_lease(k[0].lease()).await, vec![k[0].key().to_vec()]);
    let before = snap(&k[0]);
    assert!(!b.release("m", o1.step()).await.unwrap());
    assert!(!b.extend("m", o1.step(), short).await.unwrap());
    assert!(!b.extend("m", o1.step(), LONG).await.unwrap());
    assert!(!other.release("m", o1.step()).await.unwrap());
    assert_eq!(snap(&lock_keys(&p, "m").await[0]), before);
    // And back to the first TTL, then a claim of that TTL on another name.
    assert!(b.extend("m", o2.step(), LONG).await.unwrap());
    let k = lock_keys(&p, "m").await;
    assert_eq!(k[0].create_revision() as u64, t2);
    assert_eq!(keys_on_lease(k[0].lease()).await, vec![k[0].key().to_vec()]);
    let o3 = OwnerToken::random();
    let t3 = granted(b.try_acquire("m2", o3.step(), LONG).await);
    assert!(t3 > t2);
    let k3 = lock_keys(&p, "m2").await;
    assert_eq!(
        keys_on_lease(k3[0].lease()).await,
        vec![k3[0].key().to_vec()]
    );
    assert!(b.release("m", o2.step()).await.unwrap());
    assert!(b.release("m2", o3.step()).await.unwrap());

    // Elections: a renewal with another TTL keeps the candidate.
    let e1 = OwnerToken::random();
    let term1 = granted(b.try_campaign("em", "node a 1", e1.step(), LONG).await);
    assert!(Election::renew(&*b, "em", e1.step(), short).await.unwrap());
    let leader = other.leader("em").await.unwrap().expect("a leader");
    assert_eq!(
        (leader.candidate.as_str(), leader.term.get()),
        ("node a 1", term1)
    );
    assert!(b.resign("em", e1.step()).await.unwrap());
    let e2 = OwnerToken::random();
    let term2 = granted(b.try_campaign("em", "node b", e2.step(), short).await);
    assert!(term2 > term1);
    assert!(!Election::renew(&*b, "em", e1.step(), short).await.unwrap());
    assert!(!b.resign("em", e1.step()).await.unwrap());
    let leader = other.leader("em").await.unwrap().expect("a leader");
    assert_eq!(
        (leader.candidate.as_str(), leader.term.get()),
        ("node b", term2)
    );
    assert!(b.resign("em", e2.step()).await.unwrap());
    assert!(all_keys(&p).await.is_empty());
}
