//! A barrier row the sweep deleted as abandoned, made again by a later
//! arrival at a higher generation: a waiter of the lost generation neither
//! passes nor sees it complete.

use std::time::Duration;

use conformance::testkit::postgres::cluster;
use coord_core::{Barrier, Error, OwnerToken};

/// p1 waits alone at a barrier of 2 longer than `barrier_abandon_after`;
/// the sweep deletes the row; p2 makes it again at a higher generation.
/// On a schema of its own: that sweep would delete the rows of every
/// barrier waited on longer than 200 ms in the schema, other tests' too.
/// p1's check of its generation says its arrival was lost, and its
/// withdraw (when it times out) says withdrawn, never passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_swept_as_abandoned_neither_passes_nor_completes() {
    let b = coord_postgres::builder(&cluster().url())
        .schema(crate::support::unique("barrier_swept"))
        .pool_size(2)
        .listen(false)
        .sweep_every(None)
        .barrier_abandon_after(Duration::from_millis(200))
        .connect_backend()
        .await
        .unwrap();
    let name = format!("swept_{}", std::process::id());
    let p1 = OwnerToken::random();
    let first = b.arrive(&name, 2, "p1", &p1).await.unwrap();
    assert!(!first.complete);
    tokio::time::sleep(Duration::from_millis(600)).await;
    b.sweep().await.unwrap();
    let again = b
        .arrive(&name, 2, "p2", &OwnerToken::random())
        .await
        .unwrap();
    assert!(!again.complete, "p1's swept arrival still counted");
    assert!(again.generation > first.generation);
    let check = b.is_complete(&name, first.generation).await;
    assert!(
        matches!(check, Err(Error::ArrivalLost { .. })),
        "a swept generation checked as {check:?}, not as a lost arrival"
    );
    assert!(
        b.withdraw(&name, first.generation, "p1", &p1)
            .await
            .unwrap(),
        "the withdraw of a swept generation said it passed"
    );
}
