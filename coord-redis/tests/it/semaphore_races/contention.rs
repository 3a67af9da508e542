//! Many owners contending at once: clients taking mixed sizes with
//! cancellations stay within the total, a grant's expiry racing other
//! attempts never grants twice, and names with braces stay distinct and
//! are woken.

use crate::common;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use common::{SEC, granted};
use conformance::testkit::redis::RedisServer;
use conformance::testkit::wait::holds_within;
use coord_core::{Attempt, OwnerToken, Semaphore};
use tokio::time::{Instant, sleep, timeout};

use super::{MS, XorShift, backend, is_held, req};

fn dbsize(server: &RedisServer) -> i64 {
    server.command(&["DBSIZE"]).as_int().unwrap()
}

/// 32 tasks on 4 clients take 1, 2 or 3 of 4 permits, some waiting long,
/// some cancelled mid-wait by a short `timeout` dropping the future. The
/// permits held (counted on the client side, between grant and release)
/// never exceed the total; every task finishes (no waiter is stranded);
/// afterwards the whole total is grantable at once, nothing is queued and
/// the keys are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_mixed_sizes_with_cancellations_stay_within_total() {
    const TOTAL: u32 = 4;
    const TASKS: u64 = 32;
    const ROUNDS: u64 = 12;
    let server = RedisServer::start();
    let mut coords = Vec::new();
    for _ in 0..4 {
        coords.push(backend(&server.url()).await.into_coord());
    }
    let inside = Arc::new(AtomicI64::new(0));
    let most = Arc::new(AtomicI64::new(0));
    let grants = Arc::new(AtomicU64::new(0));
    let cancels = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let sem = coords[i as usize % 4].semaphores().unwrap();
        let (inside, most, grants, cancels) = (
            inside.clone(),
            most.clone(),
            grants.clone(),
            cancels.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ ((i + 1) * 0x1234_5677));
            for _ in 0..ROUNDS {
                let n = 1 + rng.below(3) as u32;
                let cancel_after = Duration::from_millis(5 + rng.below(120));
                let cancel = rng.below(3) == 0;
                let fut = sem.acquire_many("mixed", n, TOTAL, 5 * SEC, 20 * SEC);
                let permit = if cancel {
                    match timeout(cancel_after, fut).await {
                        Ok(p) => p.expect("acquire"),
                        Err(_) => {
                            cancels.fetch_add(1, Ordering::SeqCst);
                            continue;
                        }
                    }
                } else {
                    fut.await.expect("a waiting acquire was stranded")
                };
                let now = inside.fetch_add(n as i64, Ordering::SeqCst) + n as i64;
                most.fetch_max(now, Ordering::SeqCst);
                assert!(now <= TOTAL as i64, "{now} permits held of {TOTAL}");
                grants.fetch_add(1, Ordering::SeqCst);
                sleep(Duration::from_millis(rng.below(15))).await;
                inside.fetch_sub(n as i64, Ordering::SeqCst);
                permit.release().await.expect("release");
            }
        }));
    }
    let started = Instant::now();
    for t in tasks {
        timeout(120 * SEC, t)
            .await
            .expect("a task never finished: a waiter is stranded")
            .unwrap();
    }
    let took = started.elapsed();
    assert!(most.load(Ordering::SeqCst) <= TOTAL as i64);
    assert!(cancels.load(Ordering::SeqCst) > 0, "nothing was cancelled");
    assert!(grants.load(Ordering::SeqCst) > TASKS * ROUNDS / 2);
    // The cancelled waiters' cleanups run in the background. A place left
    // behind stays in the ZSET (it lapses after QUEUE_ENTRY_TTL, 30 s, and
    // only a script on the name prunes it, not this read).
    let queue = "coord:semaphore:{mixed}:queue";
    let emptied = holds_within(10 * SEC, || async {
        server.command(&["ZCARD", queue]).as_int() == Some(0)
    })
    .await;
    assert!(
        emptied.is_some(),
        "cancelled waiters left their places behind: {:?} in the queue",
        server.command(&["ZCARD", queue]).as_int()
    );
    let sem = coords[0].semaphores().unwrap();
    let all = sem
        .try_acquire_many("mixed", TOTAL, TOTAL, 5 * SEC)
        .await
        .unwrap()
        .expect("all permits should be free once everyone finished");
    all.release().await.unwrap();
    // A cancelled acquire whose attempt was in flight leaves a marker (so
    // its late copy takes nothing) for 10 s, and the name's state hash with
    // it; nothing else, and nothing without a TTL. Under load many
    // cancellations land mid-call; on an idle machine few do.
    let left = server.command(&["KEYS", "*"]);
    let conformance::testkit::redis::Resp::Array(Some(keys)) = left else {
        panic!("KEYS: {left:?}")
    };
    for k in keys {
        let conformance::testkit::redis::Resp::Bulk(Some(k)) = k else {
            panic!("a key: {k:?}")
        };
        let k = String::from_utf8_lossy(&k).to_string();
        assert!(
            [
                "coord:semaphore:{mixed}",
                "coord:semaphore:{mixed}:left",
                "coord:semaphore:{mixed}:left-at"
            ]
            .contains(&k.as_str()),
            "key left behind: {k}"
        );
        let ttl = server.command(&["PTTL", &k]).as_int().unwrap();
        assert!(
            ttl > 0 && ttl <= 30_000,
            "{k} left behind with PTTL {ttl} ms (only late-attempt markers, for at most 30 s)"
        );
    }
    eprintln!(
        "mixed: {} grants, {} cancels in {took:?}",
        grants.load(Ordering::SeqCst),
        cancels.load(Ordering::SeqCst)
    );
}

/// A grant's TTL ends while other owners keep attempting: whenever another
/// owner is granted the single permit, the first one's extend and release
/// fail (never two live holders of one permit), and the new token is above
/// the old.
#[tokio::test]
async fn grant_expiry_racing_other_attempts_never_double_grants() {
    let server = RedisServer::start();
    let (a, b) = (backend(&server.url()).await, backend(&server.url()).await);
    let mut double = Vec::new();
    for round in 0..60u64 {
        let name = format!("race{round}");
        let x = OwnerToken::random();
        let t1 = granted(
            a.try_acquire(&name, x.step(), &req(1, 1, 20 * MS, false))
                .await
                .unwrap(),
        );
        let y = OwnerToken::random();
        let started = Instant::now();
        // x extends with a tiny TTL for a varying while, then stops; y
        // attempts all along: both race the expiry.
        let extend_for = Duration::from_millis(round % 40);
        loop {
            let long = req(1, 1, 30 * SEC, false);
            let (ext, att) = if started.elapsed() < extend_for {
                let (e, a2) = tokio::join!(
                    a.extend(&name, x.step(), 3 * MS),
                    b.try_acquire(&name, y.step(), &long)
                );
                (Some(e.unwrap()), a2.unwrap())
            } else {
                (None, b.try_acquire(&name, y.step(), &long).await.unwrap())
            };
            if let Attempt::Granted(t2) = att {
                assert!(t2.get() > t1, "token did not rise");
                // x must be gone now.
                if a.extend(&name, x.step(), 30 * SEC).await.unwrap() {
                    double.push(round);
                }
                break;
            }
            if ext == Some(false) {
                // x's grant ended; y must get it at once.
                granted(
                    b.try_acquire(&name, y.step(), &req(1, 1, 30 * SEC, false))
                        .await
                        .unwrap(),
                );
                assert!(
                    !a.extend(&name, x.step(), 30 * SEC).await.unwrap(),
                    "resurrected"
                );
                break;
            }
            assert!(
                started.elapsed() < 5 * SEC,
                "y never got the expired permit"
            );
        }
        assert!(b.release(&name, y.step()).await.unwrap());
        assert!(!a.release(&name, x.step()).await.unwrap());
    }
    assert!(
        double.is_empty(),
        "two holders of one permit in rounds {double:?}"
    );
    assert_eq!(dbsize(&server), 0);
}

/// Names with braces, colons and a name that is a prefix of another are
/// distinct semaphores with their keys in one slot each, and a waiter on
/// such a name is woken (not just polled): with a 60 s poll interval it
/// is granted within a second of the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_with_braces_are_distinct_and_woken() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let names = ["{a}", "a", "{a", "a}", "}{", "x{y}z", "a:b", "a:b:c", "{}"];
    let mut owners = Vec::new();
    for n in names {
        let o = OwnerToken::random();
        granted(
            b.try_acquire(n, o.step(), &req(1, 1, 30 * SEC, false))
                .await
                .unwrap(),
        );
        owners.push(o);
    }
    // Each is full now, independently of the others.
    for n in names {
        assert!(is_held(
            &b.try_acquire(n, OwnerToken::random().step(), &req(1, 1, 30 * SEC, false))
                .await
                .unwrap()
        ));
    }
    // All keys of one name in one slot.
    let keys = match server.command(&["KEYS", "coord:semaphore:*"]) {
        conformance::testkit::redis::Resp::Array(Some(items)) => items
            .into_iter()
            .map(|k| k.as_str().unwrap().to_string())
            .collect::<Vec<_>>(),
        other => panic!("KEYS: {other:?}"),
    };
    // Redis Cluster's hash tag: between the first `{` and the first `}`
    // after it, if not empty.
    let tag = |k: &str| -> String {
        let open = k.find('{').expect("a hash tag");
        let close = k[open + 1..].find('}').expect("a closed hash tag") + open + 1;
        assert!(close > open + 1, "empty hash tag in {k}");
        k[open + 1..close].to_string()
    };
    let mut groups = std::collections::HashMap::<String, usize>::new();
    for k in &keys {
        *groups.entry(tag(k)).or_default() += 1;
    }
    assert_eq!(
        groups.len(),
        names.len(),
        "names share a slot tag: {keys:?}"
    );
    assert!(
        groups.values().all(|&n| n == 3),
        "a held name's state, grants and holders keys do not share one tag: {keys:?}"
    );
    for (n, o) in names.iter().zip(&owners) {
        let slow = backend(&server.url())
            .await
            .into_coord()
            .with_poll_interval(60 * SEC);
        let sem = slow.semaphores().unwrap();
        let name = n.to_string();
        let w = tokio::spawn(async move {
            let start = Instant::now();
            let p = sem.acquire(&name, 1, 30 * SEC, 20 * SEC).await.unwrap();
            let took = start.elapsed();
            p.release().await.unwrap();
            took
        });
        sleep(300 * MS).await;
        let released = Instant::now();
        assert!(b.release(n, o.step()).await.unwrap());
        let took = w.await.unwrap();
        assert!(
            released.elapsed() < 2 * SEC && took < 3 * SEC,
            "waiter on {n:?} not woken (took {took:?})"
        );
    }
    assert_eq!(dbsize(&server), 0);
}
