//! One owner token used through two clients (raw-trait callers retrying
//! from another process): a client must never end a lease it did not
//! create. A released claim's lease is a spare that carries its client's
//! next claim, so a lease revoked (or pooled and later swept) by another
//! client can take an unrelated claim down with it: the holder still
//! believes it holds while the store grants the name to someone else.

use crate::claim_support;
use std::time::Duration;

use coord_core::{Attempt, Lease, Lock, OwnerToken};
use etcd_client::GetOptions;

use claim_support::{client, granted, raw_etcd, unique};

const TTL: Duration = Duration::from_secs(30);

/// The lease carrying the one lock key of `name` under `prefix`.
async fn lock_lease(prefix: &str, name: &str) -> Option<i64> {
    let mut c = raw_etcd().await;
    let dir = format!("{prefix}lock/{name}/");
    let r = c
        .get(dir.as_bytes(), Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert!(r.kvs().len() <= 1, "{} lock keys", r.kvs().len());
    r.kvs().first().map(|kv| kv.lease())
}

/// A named lease granted through client 1, then granted again to the same
/// owner through client 2 (which finds client 1's key), released through
/// client 1 (whose lease becomes a spare and carries client 1's next lock),
/// then released through client 2: the lock must live on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_lease_released_through_two_clients_never_ends_the_others_next_claim() {
    let prefix = unique("lease");
    let (c1, c2, c3) = (
        client(&prefix).await,
        client(&prefix).await,
        client(&prefix).await,
    );
    let owner = OwnerToken::random();
    let t = granted(Lease::grant(&*c1, "job", owner.step(), TTL).await);
    assert_eq!(
        granted(Lease::grant(&*c2, "job", owner.step(), TTL).await),
        t
    );
    assert!(Lease::revoke(&*c1, "job", owner.step()).await.unwrap());
    // Client 1's next claim of the same TTL.
    let holder = OwnerToken::random();
    granted(Lock::try_acquire(&*c1, "x", holder.step(), TTL).await);
    let lease = lock_lease(&prefix, "x").await.expect("the lock's key");
    // Client 2's release of the owner it was granted: already released.
    assert!(!Lease::revoke(&*c2, "job", owner.step()).await.unwrap());
    // Give background revokes time to land.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        lock_lease(&prefix, "x").await,
        Some(lease),
        "client 2 ended client 1's lease: the lock held by client 1 is gone"
    );
    let other = OwnerToken::random();
    let a = Lock::try_acquire(&*c3, "x", other.step(), TTL)
        .await
        .unwrap();
    assert!(
        matches!(a, Attempt::Held { .. }),
        "a third client got the lock client 1 holds: {a:?}"
    );
    assert!(Lock::release(&*c1, "x", holder.step()).await.unwrap());
}

/// A release by owner through a client that has no record of the named
/// lease (it was granted through client 1) deletes the key; it must not
/// revoke the key's lease, which client 1 may be reusing by then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_lease_released_through_a_client_without_record_only_deletes_its_key() {
    let prefix = unique("unknown");
    let (c1, c2) = (client(&prefix).await, client(&prefix).await);
    let owner = OwnerToken::random();
    granted(Lease::grant(&*c1, "job", owner.step(), TTL).await);
    let mut raw = raw_etcd().await;
    let key = format!("{prefix}lease/job");
    let got = raw.get(key.as_bytes(), None).await.unwrap();
    let lease = got.kvs().first().expect("the named lease's key").lease();
    assert!(Lease::revoke(&*c2, "job", owner.step()).await.unwrap());
    let ttl = raw.lease_time_to_live(lease, None).await.unwrap().ttl();
    assert!(
        ttl > 0,
        "a release through another client revoked client 1's lease (ttl {ttl})"
    );
    assert_eq!(Lease::remaining(&*c1, "job").await.unwrap(), None);
    assert!(!Lease::renew(&*c1, "job", owner.step(), TTL).await.unwrap());
}

/// A named lease granted again to its owner through client 2 is carried by
/// client 2's lease from then on: client 1's renewal, which would refresh a
/// lease that no longer carries the key (and so let its local deadline
/// outrun the key), reports the lease lost; client 2 renews it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_grant_through_another_client_only_that_client_renews() {
    let prefix = unique("renew");
    let (c1, c2) = (client(&prefix).await, client(&prefix).await);
    let owner = OwnerToken::random();
    let t = granted(Lease::grant(&*c1, "job", owner.step(), TTL).await);
    assert_eq!(
        granted(Lease::grant(&*c2, "job", owner.step(), TTL).await),
        t
    );
    assert!(
        !Lease::renew(&*c1, "job", owner.step(), TTL).await.unwrap(),
        "client 1 renewed a lease whose key another client's lease carries"
    );
    assert!(Lease::renew(&*c2, "job", owner.step(), TTL).await.unwrap());
    assert!(Lease::revoke(&*c2, "job", owner.step()).await.unwrap());
    let next = OwnerToken::random();
    assert!(granted(Lease::grant(&*c1, "job", next.step(), TTL).await) > t);
}
