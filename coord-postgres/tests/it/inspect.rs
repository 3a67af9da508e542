//! Holder metadata and inspection on the real server: the metadata is
//! stored with a new grant only, ends with it (release, expiry, force
//! release) and is kept by a retry of the live owner; a semaphore's grants
//! are listed with their permits and its queued waiters counted; the same
//! through PgBouncer in transaction mode; and a layout-8 schema is
//! upgraded keeping the grants it holds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use conformance::testkit::postgres::{cluster, pgbouncer};
use coord_core::{Attempt, ClaimRecord, Lease, Lock, OwnerToken, PermitRequest, Semaphore};
use coord_postgres::PostgresBackend;

const LONG: Duration = Duration::from_secs(60);
const SHORT: Duration = Duration::from_millis(300);

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

async fn backend(url: &str, schema: &str) -> Arc<PostgresBackend> {
    coord_postgres::builder(url)
        .schema(schema)
        .listen(false)
        .sweep_every(None)
        .connect_backend()
        .await
        .expect("connect to the test cluster")
}

fn granted(a: Attempt) -> u64 {
    match a {
        Attempt::Granted(t) => t.0,
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// The one holder's (owner, token, metadata), or `None`.
fn only(r: &ClaimRecord) -> Option<(OwnerToken, u64, Option<Vec<u8>>)> {
    assert!(r.holders.len() <= 1, "{r:?}");
    r.holders
        .first()
        .map(|h| (h.owner, h.token.0, h.metadata.clone()))
}

async fn lock_metadata_lifecycle(b: &PostgresBackend) {
    let name = unique("meta-lock");
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let m1 = br#"{"host":"web-3"}"#.to_vec();
    assert!(Lock::inspect(b, &name).await.unwrap().holders.is_empty());

    // A new grant stores it; a retry of the live owner keeps the grant as
    // it is (other metadata, or none).
    let t = granted(
        Lock::try_acquire_with_metadata(b, &name, a.step(), LONG, &m1)
            .await
            .unwrap(),
    );
    let r = Lock::inspect(b, &name).await.unwrap();
    assert_eq!(only(&r), Some((a, t, Some(m1.clone()))));
    let h = &r.holders[0];
    assert_eq!(h.permits, 1);
    assert!(
        h.remaining.is_some_and(|d| d <= LONG && d > LONG / 2),
        "{h:?}"
    );
    assert_eq!(r.waiters, None);
    let again = Lock::try_acquire_with_metadata(b, &name, a.step(), LONG, br#""other""#)
        .await
        .unwrap();
    assert_eq!(granted(again), t);
    assert_eq!(
        Lock::try_acquire(b, &name, a.step(), LONG).await.unwrap(),
        Attempt::Granted(coord_core::FencingToken(t))
    );
    assert_eq!(
        only(&Lock::inspect(b, &name).await.unwrap()),
        Some((a, t, Some(m1.clone())))
    );
    // Refused for another owner, which changes nothing.
    assert!(matches!(
        Lock::try_acquire_with_metadata(b, &name, c.step(), LONG, br#"2"#)
            .await
            .unwrap(),
        Attempt::Held { .. }
    ));
    assert_eq!(
        only(&Lock::inspect(b, &name).await.unwrap()),
        Some((a, t, Some(m1.clone())))
    );

    // Release: gone; the next plain grant shows none.
    assert!(Lock::release(b, &name, a.step()).await.unwrap());
    assert!(Lock::inspect(b, &name).await.unwrap().holders.is_empty());
    let t2 = granted(Lock::try_acquire(b, &name, c.step(), LONG).await.unwrap());
    assert_eq!(
        only(&Lock::inspect(b, &name).await.unwrap()),
        Some((c, t2, None))
    );

    // Force release: gone.
    assert!(Lock::force_release(b, &name).await.unwrap());
    assert!(Lock::inspect(b, &name).await.unwrap().holders.is_empty());

    // Expiry: not shown once lapsed (the row is still there), and a
    // takeover of the expired row, by another owner without metadata or
    // by the same owner, is a new grant with its own metadata only.
    granted(
        Lock::try_acquire_with_metadata(b, &name, a.step(), SHORT, &m1)
            .await
            .unwrap(),
    );
    tokio::time::sleep(SHORT * 2).await;
    assert!(Lock::inspect(b, &name).await.unwrap().holders.is_empty());
    let t3 = granted(Lock::try_acquire(b, &name, c.step(), SHORT).await.unwrap());
    assert_eq!(
        only(&Lock::inspect(b, &name).await.unwrap()),
        Some((c, t3, None))
    );
    tokio::time::sleep(SHORT * 2).await;
    let t4 = granted(
        Lock::try_acquire_with_metadata(b, &name, c.step(), LONG, br#"{"n":4}"#)
            .await
            .unwrap(),
    );
    assert!(t4 > t3);
    assert_eq!(
        only(&Lock::inspect(b, &name).await.unwrap()),
        Some((c, t4, Some(br#"{"n":4}"#.to_vec())))
    );
    assert!(Lock::release(b, &name, c.step()).await.unwrap());
}

async fn lease_metadata_lifecycle(b: &PostgresBackend) {
    let name = unique("meta-lease");
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let t = granted(
        b.grant_with_metadata(&name, a.step(), SHORT, br#"{"worker":7}"#)
            .await
            .unwrap(),
    );
    assert_eq!(
        only(&Lease::inspect(b, &name).await.unwrap()),
        Some((a, t, Some(br#"{"worker":7}"#.to_vec())))
    );
    // A lock of the same name is another claim.
    assert!(Lock::inspect(b, &name).await.unwrap().holders.is_empty());
    tokio::time::sleep(SHORT * 2).await;
    assert!(Lease::inspect(b, &name).await.unwrap().holders.is_empty());
    let t2 = granted(b.grant(&name, c.step(), LONG).await.unwrap());
    assert_eq!(
        only(&Lease::inspect(b, &name).await.unwrap()),
        Some((c, t2, None))
    );
    assert!(b.revoke(&name, c.step()).await.unwrap());
    assert!(Lease::inspect(b, &name).await.unwrap().holders.is_empty());
}

async fn semaphore_grants_and_waiters(b: &PostgresBackend) {
    let name = unique("meta-sem");
    let req = |permits, queue| PermitRequest {
        permits,
        total: 3,
        ttl: LONG,
        queue,
    };
    let (a, c, w) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let free = Semaphore::inspect(b, &name).await.unwrap();
    assert!(free.holders.is_empty(), "{free:?}");
    assert_eq!(free.waiters, Some(0));
    let ta = granted(
        Semaphore::try_acquire_with_metadata(b, &name, a.step(), &req(2, true), br#"{"n":1}"#)
            .await
            .unwrap(),
    );
    let tc = granted(
        Semaphore::try_acquire(b, &name, c.step(), &req(1, true))
            .await
            .unwrap(),
    );
    // A queued waiter (2 permits do not fit) is counted, not listed.
    assert!(matches!(
        Semaphore::try_acquire_with_metadata(b, &name, w.step(), &req(2, true), br#""w""#)
            .await
            .unwrap(),
        Attempt::Held { .. }
    ));
    // A single attempt leaves nothing behind.
    assert!(matches!(
        Semaphore::try_acquire(b, &name, OwnerToken::random().step(), &req(1, false))
            .await
            .unwrap(),
        Attempt::Held { .. }
    ));
    // A retry of a live grant keeps it as it is.
    assert_eq!(
        granted(
            Semaphore::try_acquire_with_metadata(b, &name, a.step(), &req(2, true), br#"{"n":9}"#)
                .await
                .unwrap()
        ),
        ta
    );
    let r = Semaphore::inspect(b, &name).await.unwrap();
    assert_eq!(r.waiters, Some(1), "{r:?}");
    let got: Vec<_> = r
        .holders
        .iter()
        .map(|h| (h.owner, h.token.0, h.permits, h.metadata.clone()))
        .collect();
    assert_eq!(
        got,
        [(a, ta, 2, Some(br#"{"n":1}"#.to_vec())), (c, tc, 1, None)]
    );
    assert!(
        r.holders
            .iter()
            .all(|h| h.remaining.is_some_and(|d| d <= LONG && d > LONG / 2))
    );

    // Released: its grant (and metadata) gone; the waiter is granted with
    // its own metadata.
    assert!(Semaphore::release(b, &name, a.step()).await.unwrap());
    let tw = granted(
        Semaphore::try_acquire_with_metadata(b, &name, w.step(), &req(2, true), br#""w""#)
            .await
            .unwrap(),
    );
    let r = Semaphore::inspect(b, &name).await.unwrap();
    assert_eq!(r.waiters, Some(0));
    let got: Vec<_> = r
        .holders
        .iter()
        .map(|h| (h.owner, h.token.0, h.permits, h.metadata.clone()))
        .collect();
    assert_eq!(
        got,
        [(c, tc, 1, None), (w, tw, 2, Some(br#""w""#.to_vec()))]
    );

    // Force release: every grant gone.
    assert!(Semaphore::force_release(b, &name).await.unwrap());
    assert!(
        Semaphore::inspect(b, &name)
            .await
            .unwrap()
            .holders
            .is_empty()
    );

    // Expiry: a lapsed grant is not shown; the owner's next grant is new.
    let short = PermitRequest {
        ttl: SHORT,
        ..req(1, false)
    };
    granted(
        Semaphore::try_acquire_with_metadata(b, &name, a.step(), &short, br#"1"#)
            .await
            .unwrap(),
    );
    tokio::time::sleep(SHORT * 2).await;
    assert!(
        Semaphore::inspect(b, &name)
            .await
            .unwrap()
            .holders
            .is_empty()
    );
    let t = granted(
        Semaphore::try_acquire(b, &name, a.step(), &req(1, false))
            .await
            .unwrap(),
    );
    let r = Semaphore::inspect(b, &name).await.unwrap();
    assert_eq!(
        r.holders
            .iter()
            .map(|h| (h.owner, h.token.0, h.metadata.clone()))
            .collect::<Vec<_>>(),
        [(a, t, None)]
    );
    assert!(Semaphore::release(b, &name, a.step()).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_metadata_ends_with_its_grant() {
    let b = backend(&cluster().url(), &unique("inspect")).await;
    lock_metadata_lifecycle(&b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_metadata_ends_with_its_grant() {
    let b = backend(&cluster().url(), &unique("inspect")).await;
    lease_metadata_lifecycle(&b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_inspect_lists_grants_with_permits_and_counts_waiters() {
    let b = backend(&cluster().url(), &unique("inspect")).await;
    semaphore_grants_and_waiters(&b).await;
}

/// The same through PgBouncer in transaction mode (no prepared
/// statements, every statement possibly on another server connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_works_through_pgbouncer() {
    let b = backend(&pgbouncer().url(), &unique("inspect_pgb")).await;
    assert!(!b.coord().capabilities().notifications);
    lock_metadata_lifecycle(&b).await;
    lease_metadata_lifecycle(&b).await;
    semaphore_grants_and_waiters(&b).await;
}
