//! Waiting on a reused key: tokens rise over hundreds of contended and
//! expiring cycles, two local waiters are served in order, and a
//! cancelled wait leaves nothing behind.

use crate::claim_support;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::testkit::wait::until;
use tokio::time::{sleep, timeout};

use claim_support::{all_keys, claim_keys, client, owner_of, unique};

use super::{LONG, lock_keys, until_keys};

/// Hundreds of grants on one name from two clients (two tasks in one),
/// with 1 s TTLs and now and then a holder that walks away and lets its
/// lease lapse: at most one holder at a time, tokens strictly rising in
/// grant order, every other release succeeds, nothing left at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_over_hundreds_of_cycles_with_contention_and_expiry() {
    let p = unique("fence");
    let a = client(&p).await;
    let bc = client(&p).await;
    let ttl = Duration::from_secs(2);
    let busy = Arc::new(AtomicBool::new(false));
    let last = Arc::new(Mutex::new(0u64));
    let grants = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (who, backend) in [(0u32, a.clone()), (1, a.clone()), (2, bc.clone())] {
        let (busy, last, grants) = (busy.clone(), last.clone(), grants.clone());
        let locks = backend.coord().locks().unwrap();
        tasks.push(tokio::spawn(async move {
            for i in 0..100u32 {
                let g = locks
                    .acquire("fence", ttl, Duration::from_secs(60))
                    .await
                    .unwrap_or_else(|e| panic!("task {who} cycle {i}: {e}"));
                assert!(
                    !busy.swap(true, Ordering::AcqRel),
                    "task {who} cycle {i}: two holders at once"
                );
                let t = g.fencing_token().get();
                {
                    let mut l = last.lock().unwrap();
                    assert!(t > *l, "task {who} cycle {i}: token {t} after {}", *l);
                    *l = t;
                }
                grants.fetch_add(1, Ordering::AcqRel);
                busy.store(false, Ordering::Release);
                if i % 50 == 25 {
                    // Walk away: no release; the server ends it at its TTL.
                    std::mem::forget(g);
                } else {
                    g.release()
                        .await
                        .unwrap_or_else(|e| panic!("task {who} cycle {i}: release: {e}"));
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(grants.load(Ordering::Acquire), 300);
    until_keys(&p, "fence", 0, Duration::from_secs(10)).await;
}

/// Two owners of one client wait on one name behind a holder of that
/// client (guards, spares warmed first): distinct keys and leases, granted
/// in arrival order, each with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_local_waiters_are_served_in_order_through_guards() {
    let p = unique("fifo");
    let a = client(&p).await;
    let locks = a.coord().locks().unwrap();
    for _ in 0..4 {
        locks
            .try_acquire("q", LONG)
            .await
            .unwrap()
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let h = locks.try_acquire("q", LONG).await.unwrap().unwrap();
    let wait = Duration::from_secs(30);
    let l1 = locks.clone();
    let w1 = tokio::spawn(async move { l1.acquire("q", LONG, wait).await });
    until_keys(&p, "q", 2, Duration::from_secs(5)).await;
    let l2 = locks.clone();
    let w2 = tokio::spawn(async move { l2.acquire("q", LONG, wait).await });
    until_keys(&p, "q", 3, Duration::from_secs(5)).await;
    let k = lock_keys(&p, "q").await;
    let names: std::collections::HashSet<&[u8]> = k.iter().map(|kv| kv.key()).collect();
    let leases: std::collections::HashSet<i64> = k.iter().map(|kv| kv.lease()).collect();
    assert_eq!(
        (names.len(), leases.len()),
        (3, 3),
        "claims share a key or a lease"
    );
    let second_owner = owner_of(&k[1]);

    let th = h.fencing_token();
    h.release().await.unwrap();
    let g1 = timeout(Duration::from_secs(5), w1)
        .await
        .expect("the first waiter is granted")
        .unwrap()
        .unwrap();
    assert!(g1.fencing_token() > th);
    let k = lock_keys(&p, "q").await;
    assert_eq!(k.len(), 2);
    assert_eq!(
        owner_of(&k[0]),
        second_owner,
        "the first in line is not the holder"
    );
    assert_eq!(k[0].create_revision() as u64, g1.fencing_token().get());
    sleep(Duration::from_millis(300)).await;
    assert!(
        !w2.is_finished(),
        "the second waiter was granted while the first holds"
    );
    let t1 = g1.fencing_token();
    g1.release().await.unwrap();
    let g2 = timeout(Duration::from_secs(5), w2)
        .await
        .expect("the second waiter is granted")
        .unwrap()
        .unwrap();
    assert!(g2.fencing_token() > t1);
    g2.release().await.unwrap();
    assert!(all_keys(&p).await.is_empty());
}

/// An acquire dropped mid-wait leaves nothing in etcd: not while the
/// holder holds, not when the drop races the holder's release (the waiter
/// may have just been granted), and the same client and another one take
/// the name at once afterwards. A campaign dropped mid-wait likewise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_leaves_nothing_behind() {
    let p = unique("cancel");
    let a = client(&p).await;
    let other = client(&p).await;
    let locks = a.coord().locks().unwrap();
    let olocks = other.coord().locks().unwrap();
    let wait = Duration::from_secs(30);

    // Dropped while the holder holds.
    let h = locks.try_acquire("c", LONG).await.unwrap().unwrap();
    let l = locks.clone();
    let w = tokio::spawn(async move { l.acquire("c", LONG, wait).await });
    until_keys(&p, "c", 2, Duration::from_secs(5)).await;
    w.abort();
    let _ = w.await;
    until_keys(&p, "c", 1, Duration::from_secs(5)).await;
    h.release().await.unwrap();
    until_keys(&p, "c", 0, Duration::from_secs(5)).await;
    olocks
        .try_acquire("c", LONG)
        .await
        .unwrap()
        .expect("free for another client")
        .release()
        .await
        .unwrap();

    // Dropped as the holder releases.
    for i in 0..24u64 {
        let h = locks.try_acquire("c", LONG).await.unwrap().unwrap();
        let l = locks.clone();
        let w = tokio::spawn(async move { l.acquire("c", LONG, wait).await });
        until_keys(&p, "c", 2, Duration::from_secs(5)).await;
        let rel = tokio::spawn(h.release());
        sleep(Duration::from_millis(i % 8)).await;
        w.abort();
        let _ = w.await;
        rel.await.unwrap().unwrap();
        until(
            &format!("round {i}: nothing left"),
            Duration::from_secs(5),
            || async { lock_keys(&p, "c").await.is_empty() },
        )
        .await;
        let ours = locks
            .try_acquire("c", LONG)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("round {i}: the same client is refused"));
        ours.release().await.unwrap();
        olocks
            .try_acquire("c", LONG)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("round {i}: another client is refused"))
            .release()
            .await
            .unwrap();
    }

    // A campaign dropped mid-wait.
    let el = a.coord().elections().unwrap();
    let leader = el.try_campaign("ce", "lead", LONG).await.unwrap().unwrap();
    let e2 = el.clone();
    let w = tokio::spawn(async move { e2.campaign("ce", "next", LONG, wait).await });
    sleep(Duration::from_millis(300)).await;
    w.abort();
    let _ = w.await;
    leader.resign().await.unwrap();
    until("the election is vacant", Duration::from_secs(5), || async {
        claim_keys(&p, "election", "ce").await.is_empty()
    })
    .await;
    let oel = other.coord().elections().unwrap();
    oel.try_campaign("ce", "x", LONG)
        .await
        .unwrap()
        .expect("vacant for another client")
        .resign()
        .await
        .unwrap();
    assert!(all_keys(&p).await.is_empty());
}
