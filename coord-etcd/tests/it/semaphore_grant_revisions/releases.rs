//! Releases found by value: a queued owner's release under churn is never
//! unavailable, and a client with a stale record still answers for the
//! owner's live grant.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use coord_core::{Attempt, OwnerToken};
use tokio::time::sleep;

use crate::semaphore_support;
use semaphore_support::*;

/// The release that reads first (a queued owner, whose place is on
/// record) gives up after 5 rounds only if the owner's own keys keep
/// changing: ordinary contention (other owners granted, queued and
/// released on the same name through the same clients) must never make a
/// legitimate release fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_of_queued_owners_under_churn_never_unavailable() {
    let p = unique("fix-rounds");
    let (ca, cb) = (coord(&p).await, coord(&p).await);
    let (a, b) = (raw(&ca), raw(&cb));
    let n = "r";
    let total = 2;
    let stop = Arc::new(AtomicBool::new(false));
    let obs = observer(p.clone(), n.into(), total, stop.clone());
    let mut churn = Vec::new();
    for t in 0..3u64 {
        let (s, stop) = (if t % 2 == 0 { a.clone() } else { b.clone() }, stop.clone());
        churn.push(tokio::spawn(async move {
            let mut rng = Rng(77 + t);
            while !stop.load(Ordering::Relaxed) {
                let o = OwnerToken::random();
                if let Ok(Attempt::Granted(_)) =
                    s.try_acquire(n, o.step(), &req(1, total, LONG, true)).await
                {
                    sleep(Duration::from_millis(rng.below(5))).await;
                }
                s.release(n, o.step()).await.unwrap();
            }
        }));
    }
    let mut failures = Vec::new();
    for i in 0..150u64 {
        let s = if i % 2 == 0 { &a } else { &b };
        let o = OwnerToken::random();
        let got = s.try_acquire(n, o.step(), &req(2, total, LONG, true)).await;
        // Sometimes a retry through the other client adopts the place.
        if i % 3 == 0 {
            let other = if i % 2 == 0 { &b } else { &a };
            let _ = other
                .try_acquire(n, o.step(), &req(2, total, LONG, true))
                .await;
        }
        match s.release(n, o.step()).await {
            Ok(r) => assert!(r || !matches!(got, Ok(Attempt::Granted(_))), "{i}: {got:?}"),
            Err(e) => failures.push(format!("{i}: {e}")),
        }
        // The other client's record (adopted place) released too.
        let other = if i % 2 == 0 { &b } else { &a };
        if let Err(e) = other.release(n, o.step()).await {
            failures.push(format!("{i} (other): {e}"));
        }
        let left = state(&p, n)
            .await
            .1
            .iter()
            .filter(|r| r.owner == o.to_hex())
            .count();
        assert_eq!(left, 0, "{i}: the released owner's place is left");
    }
    stop.store(true, Ordering::Relaxed);
    for c in churn {
        c.await.unwrap();
    }
    assert!(obs.await.unwrap() > 0);
    assert!(
        failures.is_empty(),
        "legitimate releases failed: {failures:?}"
    );
}

/// A client whose record of the owner's grant is stale (the grant was
/// released through another client, and the owner granted again there)
/// must still answer for the owner's live grant: the trait's extend is
/// true and release returns the permits iff the owner holds a live grant
/// (as on memory). The stale record (its create revision) must not
/// decide alone: if it did, extend would answer false, and release would
/// answer false and leave the grant and its permits held until its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_record_in_one_client_still_answers_for_the_live_grant() {
    let p = unique("fix-stale");
    let (ca, cb) = (coord(&p).await, coord(&p).await);
    let (a, b) = (raw(&ca), raw(&cb));
    // Release through the stale client.
    let (n, o) = ("s", OwnerToken::random());
    let t1 = granted(a.try_acquire(n, o.step(), &req(1, 2, LONG, false)).await);
    assert!(b.release(n, o.step()).await.unwrap());
    let t2 = granted(b.try_acquire(n, o.step(), &req(1, 2, LONG, false)).await);
    assert!(t2 > t1);
    let rel = a.release(n, o.step()).await.unwrap();
    let left = has_grant(&p, n, &o).await;
    // Extend through the stale client (another name, the same steps).
    let (m, q) = ("s2", OwnerToken::random());
    granted(a.try_acquire(m, q.step(), &req(1, 2, LONG, false)).await);
    assert!(b.release(m, q.step()).await.unwrap());
    granted(b.try_acquire(m, q.step(), &req(1, 2, LONG, false)).await);
    let ext = a.extend(m, q.step(), LONG).await.unwrap();
    let _ = b.release(n, o.step()).await;
    let _ = b.release(m, q.step()).await;
    assert!(
        ext && rel && !left,
        "A's extend of the live grant: {ext}; A's release: {rel}; grant still in etcd after \
         that release: {left}"
    );
}
