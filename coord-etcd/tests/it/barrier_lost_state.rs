//! A barrier key whose lease ran out (its waiter was cut off longer than
//! the grace), made again by a later arrival at a higher revision: a
//! waiter of the lost generation neither passes nor sees it complete.

use conformance::testkit::etcd;
use coord_core::{Barrier, Error, OwnerToken};
use coord_etcd::{EtcdBackend, EtcdOptions};
use etcd_client::GetOptions;

/// p1 waits at a barrier of 3; the barrier key's lease is revoked (as its
/// expiry would); p2 arrives and makes the barrier again. p1's check of
/// its generation says its arrival was lost (it must not pass with 2 of 3
/// ever arrived), and its withdraw says withdrawn, never passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_lost_with_its_lease_neither_passes_nor_completes() {
    let b = EtcdBackend::connect(EtcdOptions::parse(&etcd::shared().url()).unwrap())
        .await
        .unwrap();
    let name = format!("lease-lost-{}", std::process::id());
    let p1 = OwnerToken::random();
    let first = b.arrive(&name, 3, "p1", &p1).await.unwrap();
    assert!(!first.complete);
    let mut raw = etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap();
    let all = raw
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .unwrap();
    let kv = all
        .kvs()
        .iter()
        .find(|kv| kv.key().ends_with(name.as_bytes()))
        .expect("the barrier's key");
    assert_ne!(kv.lease(), 0, "a barrier key is on a lease");
    raw.lease_revoke(kv.lease()).await.unwrap();
    let again = b
        .arrive(&name, 3, "p2", &OwnerToken::random())
        .await
        .unwrap();
    assert!(!again.complete, "p1's lost arrival still counted");
    assert!(again.generation > first.generation);
    let check = b.is_complete(&name, first.generation).await;
    assert!(
        matches!(check, Err(Error::ArrivalLost { .. })),
        "a lost generation checked as {check:?}, not as a lost arrival"
    );
    assert!(
        b.withdraw(&name, first.generation, "p1", &p1)
            .await
            .unwrap(),
        "the withdraw of a lost generation said it passed"
    );
}
