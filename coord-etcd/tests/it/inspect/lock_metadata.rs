//! A lock's metadata lives in its key and goes with a release, an expiry
//! or a force release; lock waiters are counted, and a waiter keeps its
//! metadata once granted.

use std::time::Duration;

use conformance::testkit::etcd;
use coord_core::{Attempt, Lock, OwnerToken};
use etcd_client::GetOptions;
use tokio::time::sleep;

use super::{LONG, backend, granted, one, prefix};

/// The value of owner `o`'s key in the queue `dir` (under no prefix): a
/// claim key is named by its lease, its value is `<owner hex>` and then
/// ` <metadata>` if any.
async fn owner_value(dir: &str, o: &OwnerToken) -> Option<Vec<u8>> {
    let mut raw = etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap();
    let mut resp = raw
        .get(dir, Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let hex = o.to_hex().into_bytes();
    resp.take_kvs()
        .into_iter()
        .map(|kv| kv.value().to_vec())
        .find(|v| v.starts_with(&hex) && matches!(v.get(hex.len()), None | Some(b' ')))
}

#[tokio::test]
async fn lock_metadata_lives_in_the_key_and_goes_with_release_expiry_and_force_release() {
    let p = prefix("lock");
    let b = backend(&p).await;
    let other = backend(&p).await;
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let m1 = br#"{"host":"web-3"}"#;

    // Free: no holder, no waiter.
    let r = Lock::inspect(&*other, "l").await.unwrap();
    assert!(r.holders.is_empty() && r.waiters == Some(0), "{r:?}");

    // Held with metadata: the key's value is the owner's hex, then the
    // metadata.
    let t = granted(
        Lock::try_acquire_with_metadata(&*b, "l", a.step(), LONG, m1)
            .await
            .unwrap(),
    );
    assert_eq!(
        owner_value(&format!("{p}lock/l/"), &a).await,
        Some([format!("{} ", a.to_hex()).as_bytes(), &m1[..]].concat())
    );
    let r = Lock::inspect(&*other, "l").await.unwrap();
    let h = one(&r);
    assert_eq!(
        (h.owner, h.token, h.permits, h.metadata.as_deref()),
        (a, t, 1, Some(&m1[..]))
    );
    let left = h.remaining.expect("etcd tells a lease's TTL");
    assert!(left <= LONG && left > LONG / 2, "{left:?}");
    assert_eq!(r.waiters, Some(0));

    // A retry by the same owner (other metadata) keeps the grant as it is.
    let again = Lock::try_acquire_with_metadata(&*b, "l", a.step(), LONG, br#"{"host":"other"}"#)
        .await
        .unwrap();
    assert_eq!(granted(again), t);
    let r = Lock::inspect(&*other, "l").await.unwrap();
    assert_eq!(one(&r).metadata.as_deref(), Some(&m1[..]));

    // Released: gone, and a later grant without metadata shows none.
    assert!(Lock::release(&*b, "l", a.step()).await.unwrap());
    assert!(
        Lock::inspect(&*other, "l")
            .await
            .unwrap()
            .holders
            .is_empty()
    );
    let t2 = granted(Lock::try_acquire(&*b, "l", c.step(), LONG).await.unwrap());
    let r = Lock::inspect(&*other, "l").await.unwrap();
    assert_eq!((one(&r).owner, one(&r).token), (c, t2));
    assert_eq!(
        one(&r).metadata,
        None,
        "an earlier grant's metadata was kept"
    );

    // Force released: gone.
    assert!(Lock::force_release(&*other, "l").await.unwrap());
    assert!(
        Lock::inspect(&*other, "l")
            .await
            .unwrap()
            .holders
            .is_empty()
    );
    let _ = Lock::release(&*b, "l", c.step()).await;

    // Expired: gone with its lease.
    let short = b.capabilities().min_ttl;
    granted(
        Lock::try_acquire_with_metadata(&*b, "x", a.step(), short, m1)
            .await
            .unwrap(),
    );
    assert_eq!(Lock::inspect(&*other, "x").await.unwrap().holders.len(), 1);
    sleep(short + Duration::from_millis(1500)).await;
    let r = Lock::inspect(&*other, "x").await.unwrap();
    assert!(r.holders.is_empty(), "expired, still shown: {r:?}");
    let _ = Lock::release(&*b, "x", a.step()).await;
}

#[tokio::test]
async fn lock_waiters_are_counted_and_a_waiter_keeps_its_metadata_once_granted() {
    let p = prefix("waiters");
    let b = backend(&p).await;
    let (a, w1, w2) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    granted(Lock::try_acquire(&*b, "l", a.step(), LONG).await.unwrap());
    // A waiter's first attempt writes nothing; its next one queues a key.
    for w in [&w1, &w2] {
        for _ in 0..2 {
            let r =
                Lock::try_acquire_with_metadata(&*b, "l", w.step(), LONG, br#"{"waiter":true}"#)
                    .await
                    .unwrap();
            assert!(matches!(r, Attempt::Held { .. }), "{r:?}");
        }
    }
    let r = Lock::inspect(&*b, "l").await.unwrap();
    assert_eq!(one(&r).owner, a);
    assert_eq!(one(&r).metadata, None);
    assert_eq!(r.waiters, Some(2), "{r:?}");

    // The holder goes: the first waiter holds, with the metadata it queued
    // with (its later attempts keep its key as it is).
    assert!(Lock::release(&*b, "l", a.step()).await.unwrap());
    let t = granted(
        Lock::try_acquire_with_metadata(&*b, "l", w1.step(), LONG, br#"{"later":1}"#)
            .await
            .unwrap(),
    );
    let r = Lock::inspect(&*b, "l").await.unwrap();
    let h = one(&r);
    assert_eq!(
        (h.owner, h.token, h.metadata.as_deref()),
        (w1, t, Some(&br#"{"waiter":true}"#[..]))
    );
    assert_eq!(r.waiters, Some(1));
    for o in [&w1, &w2] {
        let _ = Lock::release(&*b, "l", o.step()).await;
    }
    let r = Lock::inspect(&*b, "l").await.unwrap();
    assert!(r.holders.is_empty() && r.waiters == Some(0), "{r:?}");
}
