//! A semaphore's holders are listed with their permits, tokens and
//! metadata, and lost or foreign entries are left out.

use crate::common;
use std::time::Duration;

use common::{SEC, granted};
use conformance::testkit::redis::RedisServer;
use coord_core::{Attempt, OwnerToken};
use coord_redis::Layout;
use tokio::time::sleep;

use super::{MS, backend_on, dbsize, dbsize_settles_at, one_holder, req, sem};

/// Every live grant of a semaphore is listed with its permits, token,
/// remaining time and metadata (none for a grant without), and the queued
/// waiters are counted; a holder's retry keeps its metadata; a released,
/// expired or force-released grant is not shown; metadata writes no key
/// and the name leaves nothing behind.
#[tokio::test]
async fn semaphore_holders_are_listed_with_permits_and_metadata() {
    let server = RedisServer::start();
    let b = backend_on(&server.url(), Layout::Coord).await;
    let [x, y, z, w] = [(); 4].map(|_| OwnerToken::random());
    let name = "pool";
    let empty = sem::Sem::inspect(&b, name).await.unwrap();
    assert_eq!((empty.holders.len(), empty.waiters), (0, Some(0)));

    let tx = granted(
        sem::Sem::try_acquire_with_metadata(
            &b,
            name,
            x.step(),
            &req(2, 5, 10 * SEC, true),
            br#"{"x":1}"#,
        )
        .await
        .unwrap(),
    );
    let keys_with_one = dbsize(&server);
    let ty = granted(
        sem::Sem::try_acquire(&b, name, y.step(), &req(1, 5, SEC, true))
            .await
            .unwrap(),
    );
    let tz = granted(
        sem::Sem::try_acquire_with_metadata(
            &b,
            name,
            z.step(),
            &req(2, 5, 10 * SEC, true),
            b"\"z\"",
        )
        .await
        .unwrap(),
    );
    assert_eq!(dbsize(&server), keys_with_one, "metadata wrote a key");
    // A waiter that does not fit queues.
    assert!(matches!(
        sem::Sem::try_acquire_with_metadata(&b, name, w.step(), &req(3, 5, 10 * SEC, true), b"{}")
            .await
            .unwrap(),
        Attempt::Held { .. }
    ));
    // The holder's retry, with other metadata, keeps its grant.
    let retry =
        sem::Sem::try_acquire_with_metadata(&b, name, x.step(), &req(2, 5, 10 * SEC, true), b"{}")
            .await
            .unwrap();
    assert_eq!(granted(retry), tx);

    let info = sem::Sem::inspect(&b, name).await.unwrap();
    assert_eq!(info.waiters, Some(1));
    let seen: Vec<_> = info
        .holders
        .iter()
        .map(|h| (h.owner, h.token.get(), h.permits, h.metadata.clone()))
        .collect();
    assert_eq!(
        seen,
        [
            (x, tx, 2, Some(br#"{"x":1}"#.to_vec())),
            (y, ty, 1, None),
            (z, tz, 2, Some(b"\"z\"".to_vec())),
        ]
    );
    for h in &info.holders {
        let left = h.remaining.unwrap();
        assert!(left <= 10 * SEC && left > Duration::ZERO, "{left:?}");
    }

    // y's grant expires: no longer shown, even before any step pruned it.
    sleep(Duration::from_millis(1100)).await;
    let info = sem::Sem::inspect(&b, name).await.unwrap();
    assert_eq!(
        info.holders.iter().map(|h| h.owner).collect::<Vec<_>>(),
        [x, z]
    );
    // A release.
    assert!(sem::Sem::release(&b, name, x.step()).await.unwrap());
    let info = sem::Sem::inspect(&b, name).await.unwrap();
    assert_eq!(
        info.holders.iter().map(|h| h.owner).collect::<Vec<_>>(),
        [z]
    );
    // The waiter leaves; a force release takes the rest.
    assert!(!sem::Sem::release(&b, name, w.step()).await.unwrap());
    assert!(sem::Sem::force_release(&b, name).await.unwrap());
    let info = sem::Sem::inspect(&b, name).await.unwrap();
    assert_eq!((info.holders.len(), info.waiters), (0, Some(0)));
    assert_eq!(dbsize(&server), 0, "keys left behind");

    // Metadata never outlives a grant that expires unreleased.
    granted(
        sem::Sem::try_acquire_with_metadata(&b, name, x.step(), &req(1, 2, 200 * MS, false), b"{}")
            .await
            .unwrap(),
    );
    sleep(Duration::from_millis(300)).await;
    assert!(
        sem::Sem::inspect(&b, name)
            .await
            .unwrap()
            .holders
            .is_empty()
    );
    assert_eq!(
        dbsize_settles_at(&server, 0).await,
        0,
        "an expired grant's metadata stayed"
    );
    // A later grant without metadata shows none.
    granted(
        sem::Sem::try_acquire(&b, name, x.step(), &req(1, 2, 10 * SEC, false))
            .await
            .unwrap(),
    );
    let info = sem::Sem::inspect(&b, name).await.unwrap();
    assert_eq!(one_holder(&info).metadata, None);
    assert!(sem::Sem::release(&b, name, x.step()).await.unwrap());
}

/// A lost holders entry (evicted, deleted by hand) makes its grant
/// invisible, as `repair` would drop it; an entry coord did not write is
/// skipped too. Neither panics nor shows anything of the entry.
#[tokio::test]
async fn a_semaphore_with_lost_or_foreign_entries_is_inspected_without_them() {
    let server = RedisServer::start();
    let b = backend_on(&server.url(), Layout::Coord).await;
    let (x, y) = (OwnerToken::random(), OwnerToken::random());
    granted(
        sem::Sem::try_acquire_with_metadata(&b, "s", x.step(), &req(1, 3, 10 * SEC, false), b"{}")
            .await
            .unwrap(),
    );
    let ty = granted(
        sem::Sem::try_acquire(&b, "s", y.step(), &req(1, 3, 10 * SEC, false))
            .await
            .unwrap(),
    );
    server.command(&[
        "HSET",
        "coord:semaphore:{s}:holders",
        &x.to_hex(),
        "garbage",
    ]);
    let info = sem::Sem::inspect(&b, "s").await.unwrap();
    assert_eq!(one_holder(&info).token.get(), ty);
    server.command(&["HDEL", "coord:semaphore:{s}:holders", &x.to_hex()]);
    let info = sem::Sem::inspect(&b, "s").await.unwrap();
    assert_eq!(one_holder(&info).owner, y);
}
