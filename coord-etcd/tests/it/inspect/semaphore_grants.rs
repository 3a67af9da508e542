//! A semaphore's grants are listed with their permits, and its waiters
//! are counted.

use conformance::testkit::etcd;
use coord_core::{Attempt, OwnerToken, PermitRequest, Semaphore};
use etcd_client::GetOptions;

use super::{LONG, backend, granted, prefix};

/// The values of every key under `prefix`.
async fn raw_prefix_values(prefix: &str) -> Vec<Vec<u8>> {
    let mut raw = etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap();
    let mut resp = raw
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    resp.take_kvs()
        .into_iter()
        .map(|kv| kv.value().to_vec())
        .collect()
}

fn req(permits: u32, queue: bool) -> PermitRequest {
    PermitRequest {
        permits,
        total: 3,
        ttl: LONG,
        queue,
    }
}

#[tokio::test]
async fn semaphore_grants_are_listed_with_permits_and_waiters_counted() {
    let p = prefix("sem");
    let b = backend(&p).await;
    let other = backend(&p).await;
    let (a, c, w) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let r = Semaphore::inspect(&*other, "s").await.unwrap();
    assert!(r.holders.is_empty() && r.waiters == Some(0), "{r:?}");
    let m = br#"{"job": "a b c"}"#;
    let ta = granted(
        Semaphore::try_acquire_with_metadata(&*b, "s", a.step(), &req(2, false), m)
            .await
            .unwrap(),
    );
    // The grant's value: owner, permits, total, slots, then the metadata
    // (its key is named by its lease: the one holder's key under `h/`).
    let v = raw_prefix_values(&format!("{p}sem/s/h/")).await;
    assert_eq!(v.len(), 1, "{v:?}");
    let v = String::from_utf8(v[0].clone()).unwrap();
    assert!(
        v.starts_with(&format!("{} 2 3 ", a.to_hex())) && v.ends_with(r#" {"job": "a b c"}"#),
        "{v}"
    );
    let tc = granted(
        Semaphore::try_acquire(&*b, "s", c.step(), &req(1, false))
            .await
            .unwrap(),
    );
    // A retry by the same owner keeps the grant as it is.
    assert_eq!(
        granted(
            Semaphore::try_acquire_with_metadata(&*b, "s", a.step(), &req(2, false), b"1")
                .await
                .unwrap()
        ),
        ta
    );
    // A waiter that does not fit queues.
    let r = Semaphore::try_acquire_with_metadata(&*b, "s", w.step(), &req(1, true), b"3")
        .await
        .unwrap();
    assert!(matches!(r, Attempt::Held { .. }), "{r:?}");

    let mut r = Semaphore::inspect(&*other, "s").await.unwrap();
    r.holders.sort_by_key(|h| h.token);
    assert_eq!(r.holders.len(), 2, "{r:?}");
    assert_eq!(r.waiters, Some(1));
    let (h0, h1) = (&r.holders[0], &r.holders[1]);
    assert_eq!(
        (h0.owner, h0.token, h0.permits, h0.metadata.as_deref()),
        (a, ta, 2, Some(&m[..]))
    );
    assert_eq!(
        (h1.owner, h1.token, h1.permits, h1.metadata.as_deref()),
        (c, tc, 1, None)
    );
    assert!(
        h0.remaining.is_some_and(|d| d <= LONG && d > LONG / 2),
        "{h0:?}"
    );

    // Released: that grant goes; the waiter, once granted, has the
    // metadata of its granting attempt.
    assert!(Semaphore::release(&*b, "s", a.step()).await.unwrap());
    let tw = granted(
        Semaphore::try_acquire_with_metadata(&*b, "s", w.step(), &req(1, true), b"4")
            .await
            .unwrap(),
    );
    let mut r = Semaphore::inspect(&*other, "s").await.unwrap();
    r.holders.sort_by_key(|h| h.token);
    assert_eq!(r.waiters, Some(0));
    assert_eq!(
        r.holders
            .iter()
            .map(|h| (h.owner, h.token, h.metadata.clone()))
            .collect::<Vec<_>>(),
        vec![(c, tc, None), (w, tw, Some(b"4".to_vec()))]
    );
    // A renewal of another TTL moves the grant, keeping its value.
    assert!(
        Semaphore::extend(&*b, "s", w.step(), LONG * 2)
            .await
            .unwrap()
    );
    let r = Semaphore::inspect(&*other, "s").await.unwrap();
    let hw = r.holders.iter().find(|h| h.owner == w).unwrap();
    assert_eq!((hw.token, hw.metadata.as_deref()), (tw, Some(&b"4"[..])));

    // Force released: nothing left.
    assert!(Semaphore::force_release(&*other, "s").await.unwrap());
    assert!(
        Semaphore::inspect(&*other, "s")
            .await
            .unwrap()
            .holders
            .is_empty()
    );
    for o in [&c, &w] {
        let _ = Semaphore::release(&*b, "s", o.step()).await;
    }
}
