//! At the instant a claim expires, every view of the in-memory store
//! agrees that it is gone.

use std::time::Duration;

use coord_core::{Attempt, Election, Listed, Lister, OwnerToken};
use coord_memory::MemoryBackend;

#[tokio::test(start_paused = true)]
async fn a_leader_whose_term_ends_now_is_neither_leader_nor_listed() {
    let m = MemoryBackend::new();
    let ttl = Duration::from_millis(100);
    let won = m
        .try_campaign("e", "me", OwnerToken::random().step(), ttl)
        .await
        .unwrap();
    assert!(matches!(won, Attempt::Granted(_)), "{won:?}");
    assert_eq!(m.names(Listed::Election, "", 10).await.unwrap(), ["e"]);
    tokio::time::advance(ttl).await;
    assert_eq!(m.leader("e").await.unwrap(), None);
    assert!(
        m.names(Listed::Election, "", 10).await.unwrap().is_empty(),
        "listed as held at the instant its term ended"
    );
}

/// A permit whose TTL ends now is gone: its owner's release finds no live
/// grant, and neither does a force release.
#[tokio::test(start_paused = true)]
async fn a_permit_whose_ttl_ends_now_is_neither_released_nor_forced() {
    use coord_core::{PermitRequest, Semaphore};
    let m = MemoryBackend::new();
    let ttl = Duration::from_millis(100);
    let request = PermitRequest {
        permits: 1,
        total: 2,
        ttl,
        queue: false,
    };
    let o = OwnerToken::random();
    for name in ["released", "forced"] {
        let g = m.try_acquire(name, o.step(), &request).await.unwrap();
        assert!(matches!(g, Attempt::Granted(_)), "{g:?}");
    }
    tokio::time::advance(ttl).await;
    assert!(
        !m.release("released", o.step()).await.unwrap(),
        "released a grant whose TTL ended"
    );
    assert!(
        !m.force_release("forced").await.unwrap(),
        "forced a grant whose TTL ended"
    );
}
