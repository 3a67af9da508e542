//! An operator's force release removes the claim it found, never another
//! one: a lease outlives the claim it carried (a released claim's lease is
//! kept as a spare and carries the client's next claim of the same TTL),
//! so the force release must not end whatever the lease carries by the
//! time its request lands.
//!
//! The operator's client goes through a real TCP proxy with latency, so
//! its read of the holder and its removal reach the server far apart;
//! between them the holder releases and takes another lock on the same
//! lease.

use std::time::Duration;

use conformance::testkit::etcd::EtcdServer;
use conformance::testkit::proxy::FaultProxy;
use tokio::time::sleep;

/// How long the proxy holds every chunk each way.
const LATENCY: Duration = Duration::from_millis(400);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_release_never_ends_the_next_claim_on_the_holders_lease() {
    let server = EtcdServer::start();
    let proxy = FaultProxy::start(server.client_port());
    let holder = coord_etcd::connect(&server.url()).await.unwrap();
    let operator = coord_etcd::connect(&format!(
        "etcd://127.0.0.1:{}?timeout_ms=10000",
        proxy.port()
    ))
    .await
    .unwrap();
    let (hl, ol) = (holder.locks().unwrap(), operator.locks().unwrap());
    let ttl = Duration::from_secs(20);
    // Warm the operator's connection.
    assert!(!ol.force_release("nothing-here").await.unwrap());

    let first = hl.try_acquire("first", ttl).await.unwrap().unwrap();
    proxy.latency(LATENCY);
    let force = tokio::spawn(async move { ol.force_release("first").await });
    // The operator's read of `first`'s holder reaches the server at about
    // LATENCY, its removal not before 3 x LATENCY. In between: the holder
    // releases `first` and locks `second`, on the lease `first` had.
    sleep(LATENCY + LATENCY / 2).await;
    first.release().await.unwrap();
    let second = hl.try_acquire("second", ttl).await.unwrap().unwrap();
    let removed = force.await.unwrap().unwrap();
    proxy.latency(Duration::ZERO);

    assert!(
        second.is_valid(),
        "the second lock's guard is not valid after the force release"
    );
    let other = coord_etcd::connect(&server.url()).await.unwrap();
    assert!(
        other
            .locks()
            .unwrap()
            .try_acquire("second", ttl)
            .await
            .unwrap()
            .is_none(),
        "a force release of `first` ended `second`, a lock it was never asked \
         to remove (it revoked the lease `first` had when it looked)"
    );
    assert!(
        !removed,
        "the force release reports removing `first`, which its holder had released"
    );
    assert!(
        second.extend(ttl).await.is_ok(),
        "the second lock cannot be extended after the force release"
    );
    second.release().await.unwrap();
}
