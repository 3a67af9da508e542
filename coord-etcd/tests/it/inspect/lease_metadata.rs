//! A named lease's metadata follows the owner's lease key and goes with a
//! revoke or an expiry.

use std::time::Duration;

use conformance::testkit::etcd;
use coord_core::{Attempt, Lease, OwnerToken};
use etcd_client::GetOptions;
use tokio::time::sleep;

use super::{LONG, backend, granted, one, prefix};

/// The raw value of `key` (under no prefix).
async fn raw_value(key: &str) -> Option<Vec<u8>> {
    let mut raw = etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap();
    let mut resp = raw.get(key, None::<GetOptions>).await.unwrap();
    resp.take_kvs()
        .into_iter()
        .next()
        .map(|kv| kv.value().to_vec())
}

#[tokio::test]
async fn lease_metadata_follows_the_owner_hex_and_goes_with_revoke_and_expiry() {
    let p = prefix("lease");
    let b = backend(&p).await;
    let other = backend(&p).await;
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let m = br#"{"worker": 7}"#;
    assert!(
        Lease::inspect(&*other, "n")
            .await
            .unwrap()
            .holders
            .is_empty()
    );
    let t = granted(
        Lease::grant_with_metadata(&*b, "n", a.step(), LONG, m)
            .await
            .unwrap(),
    );
    let mut want = format!("{} ", a.to_hex()).into_bytes();
    want.extend_from_slice(m);
    assert_eq!(raw_value(&format!("{p}lease/n")).await, Some(want));
    let r = Lease::inspect(&*other, "n").await.unwrap();
    let h = one(&r);
    assert_eq!(
        (h.owner, h.token, h.permits, h.metadata.as_deref()),
        (a, t, 1, Some(&m[..]))
    );
    assert!(
        h.remaining.is_some_and(|r| r <= LONG && r > LONG / 2),
        "{h:?}"
    );
    assert_eq!(r.waiters, None);
    // Another owner is refused; the holder's own retry keeps its grant.
    assert!(matches!(
        Lease::grant(&*other, "n", c.step(), LONG).await.unwrap(),
        Attempt::Held { .. }
    ));
    assert_eq!(
        granted(
            Lease::grant_with_metadata(&*b, "n", a.step(), LONG, b"2")
                .await
                .unwrap()
        ),
        t
    );
    assert_eq!(
        one(&Lease::inspect(&*other, "n").await.unwrap())
            .metadata
            .as_deref(),
        Some(&m[..])
    );
    // A renewal of another TTL moves the key, keeping its value.
    assert!(Lease::renew(&*b, "n", a.step(), LONG * 2).await.unwrap());
    assert_eq!(
        one(&Lease::inspect(&*other, "n").await.unwrap())
            .metadata
            .as_deref(),
        Some(&m[..])
    );
    // remaining() and an owner-checked revoke still read the value.
    assert!(Lease::remaining(&*other, "n").await.unwrap().is_some());
    assert!(Lease::revoke(&*other, "n", a.step()).await.unwrap());
    assert!(
        Lease::inspect(&*other, "n")
            .await
            .unwrap()
            .holders
            .is_empty()
    );

    // Without metadata: the hex alone, none shown.
    granted(Lease::grant(&*b, "n", c.step(), LONG).await.unwrap());
    assert_eq!(
        raw_value(&format!("{p}lease/n")).await,
        Some(c.to_hex().into_bytes())
    );
    assert_eq!(
        one(&Lease::inspect(&*other, "n").await.unwrap()).metadata,
        None
    );
    assert!(Lease::revoke(&*b, "n", c.step()).await.unwrap());

    // Expired: gone.
    let short = b.capabilities().min_ttl;
    granted(
        Lease::grant_with_metadata(&*b, "e", a.step(), short, m)
            .await
            .unwrap(),
    );
    sleep(short + Duration::from_millis(1500)).await;
    assert!(
        Lease::inspect(&*other, "e")
            .await
            .unwrap()
            .holders
            .is_empty()
    );
}
