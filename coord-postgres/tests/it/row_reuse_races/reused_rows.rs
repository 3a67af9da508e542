//! What a reused row carries over: election terms keep rising and
//! observers hear them, a force release or revoke leaves no handle on it,
//! and no metadata survives.

use crate::support;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conformance::testkit::postgres::cluster;
use coord_core::{Attempt, Election, Lease, Lock, OwnerToken};
use futures::StreamExt;
use support::{granted, raw, unique};

use super::{backend, row};

/// Elections on reused rows: every new leadership's term is higher (after a
/// resign, after an expiry, after a second resign by the same candidate),
/// a stale leader's renew and resign change nothing, and an observer
/// (polling every 60 s, so woken by NOTIFY alone) sees every new term
/// within a few seconds, never a term going back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_terms_rise_over_reused_rows_and_observers_hear_them() {
    let schema = unique("rv_el");
    let b = backend(&schema).await;
    let url = format!("{}&coord_schema={schema}", cluster().url());
    let watcher = coord_postgres::connect(&url)
        .await
        .unwrap()
        .with_poll_interval(Duration::from_secs(60));
    let elections = watcher.elections().unwrap();
    let mut stream = Box::pin(elections.observe("office").unwrap());
    let first = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("the first state")
        .unwrap()
        .unwrap();
    assert!(first.is_none());
    let seen: Arc<Mutex<Vec<Option<u64>>>> = Arc::default();
    let collector = tokio::spawn({
        let seen = seen.clone();
        async move {
            while let Some(item) = stream.next().await {
                let item = item.unwrap();
                seen.lock().unwrap().push(item.map(|l| l.term.get()));
            }
        }
    });
    let wait_seen = |term: u64| {
        let seen = seen.clone();
        async move {
            let start = Instant::now();
            loop {
                if seen.lock().unwrap().contains(&Some(term)) {
                    return;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "the observer never saw term {term}: {:?}",
                    seen.lock().unwrap()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let long = Duration::from_secs(30);
    let (a, bb, c) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let t1 = granted(b.try_campaign("office", "a", a.step(), long).await.unwrap());
    wait_seen(t1.get()).await;
    assert!(b.resign("office", a.step()).await.unwrap());
    assert!(b.leader("office").await.unwrap().is_none());
    let t2 = granted(
        b.try_campaign("office", "b", bb.step(), Duration::from_millis(300))
            .await
            .unwrap(),
    );
    assert!(t2 > t1);
    wait_seen(t2.get()).await;
    // a is stale: its renew and resign change nothing.
    assert!(
        !Election::renew(&*b, "office", a.step(), long)
            .await
            .unwrap()
    );
    assert!(!b.resign("office", a.step()).await.unwrap());
    assert_eq!(b.leader("office").await.unwrap().unwrap().term, t2);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let t3 = granted(b.try_campaign("office", "c", c.step(), long).await.unwrap());
    assert!(t3 > t2);
    wait_seen(t3.get()).await;
    // b expired and was replaced: stale.
    assert!(
        !Election::renew(&*b, "office", bb.step(), long)
            .await
            .unwrap()
    );
    assert!(!b.resign("office", bb.step()).await.unwrap());
    let l = b.leader("office").await.unwrap().unwrap();
    assert_eq!((l.candidate.as_str(), l.term), ("c", t3));
    // A repeat by the live leader keeps its term.
    assert_eq!(
        granted(b.try_campaign("office", "c", c.step(), long).await.unwrap()),
        t3
    );
    assert!(b.resign("office", c.step()).await.unwrap());
    let t4 = granted(b.try_campaign("office", "c", c.step(), long).await.unwrap());
    assert!(t4 > t3, "a new term after resigning: {t4:?} after {t3:?}");
    wait_seen(t4.get()).await;
    collector.abort();
    let seen = seen.lock().unwrap().clone();
    let terms: Vec<u64> = seen.iter().flatten().copied().collect();
    for w in terms.windows(2) {
        assert!(w[1] >= w[0], "terms went back: {seen:?}");
    }
}

/// Leases and force release on reused rows: a force-released lock's former
/// holder cannot release, extend or take back the row's next grant; a
/// revoked lease's owner cannot renew after another's grant of the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_and_revoke_leave_no_handle_on_the_reused_row() {
    let schema = unique("rv_fr");
    let b = backend(&schema).await;
    let long = Duration::from_secs(30);
    let (a, n) = (OwnerToken::random(), OwnerToken::random());
    let t1 = granted(b.try_acquire("f", a.step(), long).await.unwrap());
    assert!(b.force_release("f").await.unwrap());
    assert!(
        !b.force_release("f").await.unwrap(),
        "a free row force-released"
    );
    let t2 = granted(b.try_acquire("f", n.step(), long).await.unwrap());
    assert!(t2 > t1);
    let settled = row(&schema, "f");
    assert!(!Lock::extend(&*b, "f", a.step(), long).await.unwrap());
    assert!(!Lock::release(&*b, "f", a.step()).await.unwrap());
    assert!(matches!(
        b.try_acquire("f", a.step(), long).await.unwrap(),
        Attempt::Held { .. }
    ));
    assert_eq!(row(&schema, "f"), settled);
    let l1 = granted(b.grant("l", a.step(), long).await.unwrap());
    assert!(b.revoke("l", a.step()).await.unwrap());
    assert!(
        !Lease::renew(&*b, "l", a.step(), long).await.unwrap(),
        "renewed a revoked lease"
    );
    assert!(b.remaining("l").await.unwrap().is_none());
    let l2 = granted(b.grant("l", n.step(), long).await.unwrap());
    assert!(l2 > l1);
    assert!(!Lease::renew(&*b, "l", a.step(), long).await.unwrap());
    assert!(!b.revoke("l", a.step()).await.unwrap());
    assert!(b.remaining("l").await.unwrap().unwrap() > Duration::from_secs(20));
}

/// Metadata and candidates never carry over a reused row: a takeover of an
/// expired holder's row (by the one-statement take and by claim_acquire, a
/// waiting client's path) and a grant of a freed row show none of the
/// earlier holder's metadata.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_metadata_survives_a_reused_row() {
    let schema = unique("rv_md");
    let b = backend(&schema).await;
    let short = Duration::from_millis(200);
    for path in ["take", "acquire", "freed"] {
        let name = format!("md_{path}");
        let a = OwnerToken::random();
        granted(
            b.try_acquire_with_metadata(&name, a.step(), short, b"secret")
                .await
                .unwrap(),
        );
        if path == "freed" {
            assert!(Lock::release(&*b, &name, a.step()).await.unwrap());
        } else {
            tokio::time::sleep(short + Duration::from_millis(100)).await;
        }
        let n = OwnerToken::random();
        if path == "acquire" {
            let c = raw().await;
            let o: &[u8] = n.as_bytes();
            let r = c
                .query_one(
                    &format!(
                        "SELECT granted FROM \"{schema}\".claim_acquire($1::text, $2::text, \
                         $3::bytea, NULL::text, $4::int8, 'ch', false, true, NULL::bytea, NULL::int8)"
                    ),
                    &[&"lock", &name, &o, &30_000_000i64],
                )
                .await
                .unwrap();
            assert!(r.get::<_, Option<i64>>(0).is_some());
        } else {
            granted(
                b.try_acquire(&name, n.step(), Duration::from_secs(30))
                    .await
                    .unwrap(),
            );
        }
        let h = Lock::inspect(&*b, &name).await.unwrap().holders;
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].owner, n);
        assert_eq!(
            h[0].metadata, None,
            "{path}: the earlier holder's metadata carried over"
        );
    }
}
