//! Every extend also compares the key's lease, and legitimate holders keep
//! renewing: adopted and moved claims, watchdog guards extended to other
//! TTLs, and concurrent extends that never answer true for a removed lock.

use crate::claim_support;
use std::time::Duration;

use conformance::testkit::etcd;
use conformance::testkit::proxy::FaultProxy;
use coord_core::{Attempt, Election, Lease, Lock, OwnerToken};
use tokio::time::{Instant, sleep};

use claim_support::{all_keys, claim_keys, client, client_at, granted, unique};

use super::{TTL, lease_kv, lease_state, refused};

// ---------------------------------------------------------------------
// Compare::lease on every extend: legitimate holders keep renewing
// ---------------------------------------------------------------------

/// A lock whose attempt's reply was lost (the write landed on a spare),
/// adopted by the retry, then extended with the same TTL, another TTL
/// (moving the key) and back, and an election renewed likewise: every
/// renewal of the holder succeeds, the token never changes, and the
/// moved-from leases end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopted_and_moved_claims_keep_renewing() {
    let prefix = unique("adopt");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let c1 = client_at(proxy.port(), &prefix, 1500).await;
    let c3 = client(&prefix).await;
    // A spare of this TTL, so the next attempt is one txn.
    let warm = OwnerToken::random();
    granted(Lock::try_acquire(&*c1, "warm", warm.step(), TTL).await);
    assert!(Lock::release(&*c1, "warm", warm.step()).await.unwrap());
    let owner = OwnerToken::random();
    let dir = format!("{prefix}lock/x/").into_bytes();
    proxy.deliver_late(
        move |b| b.windows(dir.len()).any(|w| w == dir.as_slice()),
        Duration::from_millis(50),
        Duration::from_millis(400),
    );
    let (r, ()) = tokio::join!(Lock::try_acquire(&*c1, "x", owner.step(), TTL), async {
        let end = Instant::now() + Duration::from_secs(3);
        while proxy.held() == 0 && Instant::now() < end {
            sleep(Duration::from_millis(2)).await;
        }
        proxy.blackhole();
    });
    assert!(r.is_err(), "the attempt with a lost reply answered {r:?}");
    assert_eq!(proxy.delivered(), 1);
    proxy.heal();
    let keys = claim_keys(&prefix, "lock", "x").await;
    assert_eq!(keys.len(), 1, "the lost attempt's write did not land");
    let t = granted(Lock::try_acquire(&*c1, "x", owner.step(), TTL).await);
    assert_eq!(t, keys[0].create_revision() as u64, "not adopted");
    for ttl in [
        TTL,
        TTL,
        Duration::from_secs(20),
        Duration::from_secs(20),
        TTL,
    ] {
        assert!(
            Lock::extend(&*c1, "x", owner.step(), ttl).await.unwrap(),
            "the holder's extend ({ttl:?}) failed"
        );
        let now = claim_keys(&prefix, "lock", "x").await;
        assert_eq!(now.len(), 1);
        assert_eq!(now[0].create_revision() as u64, t);
        assert!(
            lease_state(now[0].lease()).await.0 > 0,
            "the key's lease ended"
        );
        refused(
            Lock::try_acquire(&*c3, "x", OwnerToken::random().step(), TTL).await,
            "another owner",
        );
    }
    assert!(Lock::release(&*c1, "x", owner.step()).await.unwrap());
    // An election: renew, renew with another TTL, renew again.
    let cand = OwnerToken::random();
    let term = granted(Election::try_campaign(&*c1, "e", "me", cand.step(), TTL).await);
    for ttl in [TTL, Duration::from_secs(20), Duration::from_secs(20), TTL] {
        assert!(Election::renew(&*c1, "e", cand.step(), ttl).await.unwrap());
        let keys = claim_keys(&prefix, "election", "e").await;
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].create_revision() as u64, term);
    }
    assert!(Election::resign(&*c1, "e", cand.step()).await.unwrap());
    assert!(all_keys(&prefix).await.is_empty());
}

/// Guards with the watchdog at a short TTL, extended to another TTL and
/// back while the watchdog runs (locks, named leases, leadership): never
/// lost, never another holder, the key's create revision constant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_guards_extended_to_other_ttls_stay_held() {
    let prefix = unique("watchdog");
    let (c1, c3) = (client(&prefix).await, client(&prefix).await);
    let coord = c1.coord();
    let short = Duration::from_secs(2);
    let mut lock = coord
        .locks()
        .unwrap()
        .try_acquire("x", short)
        .await
        .unwrap()
        .unwrap();
    lock.keep_alive();
    let mut lease = coord
        .leases()
        .unwrap()
        .grant("job", short)
        .await
        .unwrap()
        .unwrap();
    lease.keep_alive();
    let lock_rev = claim_keys(&prefix, "lock", "x").await[0].create_revision();
    let lease_rev = lease_kv(&prefix, "job").await.unwrap().create_revision();
    for (i, ttl) in [3, 2, 4, 2].into_iter().enumerate() {
        let ttl = Duration::from_secs(ttl);
        lock.extend(ttl).await.unwrap();
        lease.extend(ttl).await.unwrap();
        sleep(Duration::from_millis(2500)).await;
        assert!(lock.is_valid(), "step {i}: the lock guard is not valid");
        assert!(lease.is_valid(), "step {i}: the lease guard is not valid");
        let keys = claim_keys(&prefix, "lock", "x").await;
        assert_eq!(keys.len(), 1, "step {i}");
        assert_eq!(keys[0].create_revision(), lock_rev, "step {i}");
        assert_eq!(
            lease_kv(&prefix, "job").await.unwrap().create_revision(),
            lease_rev,
            "step {i}"
        );
        refused(
            Lock::try_acquire(&*c3, "x", OwnerToken::random().step(), short).await,
            "another lock owner",
        );
        refused(
            Lease::grant(&*c3, "job", OwnerToken::random().step(), short).await,
            "another lease owner",
        );
    }
    lock.release().await.unwrap();
    lease.release().await.unwrap();
    assert!(all_keys(&prefix).await.is_empty());
}

/// Two extends of one lock at once through its client (a raw-trait caller
/// renewing from two tasks), one with the lock's TTL, one with another:
/// whatever each answers, an extend that answered `true` must leave the
/// lock held on the server. Without one call per claim at a time in a
/// client (`same_owner_one_client.rs`), the same-TTL extend, whose check
/// also compares the key's lease, found the key moved by the other
/// extend, answered false and dropped the entry, revoking the entry's
/// lease, which by then was the one the other extend moved the key to (it
/// answered true): the key was gone and another owner got the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_extends_never_answer_true_for_a_removed_lock() {
    let prefix = unique("extends");
    let (c1, c3) = (client(&prefix).await, client(&prefix).await);
    let mut bad = Vec::new();
    for round in 0..40u64 {
        let name = format!("x{round}");
        let owner = OwnerToken::random();
        granted(Lock::try_acquire(&*c1, &name, owner.step(), TTL).await);
        let other = Duration::from_secs(20 + round % 3);
        let delay = Duration::from_micros(round * 100);
        let (a, b) = tokio::join!(Lock::extend(&*c1, &name, owner.step(), other), async {
            sleep(delay).await;
            Lock::extend(&*c1, &name, owner.step(), TTL).await
        });
        let (a, b) = (a.unwrap(), b.unwrap());
        sleep(Duration::from_millis(300)).await;
        let keys = claim_keys(&prefix, "lock", &name).await;
        let held = keys.len() == 1 && lease_state(keys[0].lease()).await.0 > 0;
        if (a || b) && !held {
            // The name is free to others while the owner was just told it
            // holds it for 20 s or more.
            let other = Lock::try_acquire(&*c3, &name, OwnerToken::random().step(), TTL).await;
            bad.push((round, a, b, matches!(other, Ok(Attempt::Granted(_)))));
            let _ = Lock::force_release(&*c3, &name).await;
        }
        let _ = Lock::release(&*c1, &name, owner.step()).await;
    }
    assert!(
        bad.is_empty(),
        "rounds (round, other-TTL extend, same-TTL extend, another owner granted) answered \
         true with the lock gone: {bad:?}"
    );
}
