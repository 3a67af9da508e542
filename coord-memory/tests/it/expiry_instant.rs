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
        .try_campaign("e", "me", &OwnerToken::random(), ttl)
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
