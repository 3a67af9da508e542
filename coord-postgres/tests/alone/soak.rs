//! Bounded state: the rows of names that went idle are deleted. The soak
//! touches 100,000 distinct names (locks released and left to expire,
//! leases left to expire, limiter keys of every algorithm, barriers
//! completed, withdrawn and abandoned, elections resigned and left to
//! expire), lets their TTL, window and grace pass, and then finds every
//! coord table back near its baseline.
//!
//! `COORD_SOAK_SCALE` scales the counts (default 1.0: 100,000 names, about
//! a minute on two cores; `0.05` for a quick look).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use conformance::testkit::postgres::cluster;
use coord_core::{Algorithm, Barrier, Election, Lease, Limiter, Lock, OwnerToken, Quota};
use coord_postgres::PostgresBackend;
use futures::StreamExt;

const TABLES: [&str; 4] = ["claims", "limiter_state", "limiter_log", "barriers"];
/// Short enough that idle names are past it quickly.
const TTL: Duration = Duration::from_millis(500);
const WINDOW: Duration = Duration::from_millis(500);
const GRACE: Duration = Duration::from_millis(500);

fn scaled(n: usize) -> usize {
    let scale: f64 = std::env::var("COORD_SOAK_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    ((n as f64 * scale) as usize).max(4)
}

fn rows(db: &str, table: &str) -> u64 {
    cluster()
        .psql(db, &format!("SELECT count(*) FROM coord.{table}"))
        .trim()
        .parse()
        .expect("a count")
}

/// Run `f(i)` for `i in 0..n`, 64 at a time.
async fn each<F, Fut>(n: usize, f: F)
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    futures::stream::iter(0..n)
        .map(f)
        .buffer_unordered(64)
        .collect::<()>()
        .await;
}

/// Until what was touched is gone: the sweep, run like a writer would
/// (after the TTL, window and grace have passed).
async fn settle(b: &Arc<PostgresBackend>) -> u64 {
    tokio::time::sleep(TTL.max(WINDOW) + GRACE + Duration::from_millis(200)).await;
    b.sweep().await.expect("sweep")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_names_cost_nothing_in_the_store() {
    let _alone = crate::ALONE.lock().await;
    let db = format!("soak_{}", std::process::id());
    let url = cluster().create_database(&db);
    let b = coord_postgres::builder(&url)
        .pool_size(64)
        .idle_grace(GRACE)
        .barrier_abandon_after(Duration::from_secs(1))
        .connect_backend()
        .await
        .unwrap();
    let baseline: Vec<u64> = TABLES.iter().map(|t| rows(&db, t)).collect();
    let touched = Arc::new(AtomicU64::new(0));
    let t0 = std::time::Instant::now();

    // Locks: half released at once, half left to expire.
    let locks = scaled(40_000);
    each(locks, |i| {
        let (b, touched) = (b.clone(), touched.clone());
        async move {
            let owner = OwnerToken::random();
            let name = format!("order:{i}");
            let sent = std::time::Instant::now();
            let got = Lock::try_acquire(&*b, &name, owner.step(), TTL)
                .await
                .unwrap();
            assert!(matches!(got, coord_core::Attempt::Granted(_)));
            if i % 2 == 0 {
                // Released at once; on a slow machine the release can come
                // after the TTL, when the lock is already free.
                let released = Lock::release(&*b, &name, owner.step()).await.unwrap();
                assert!(
                    released || sent.elapsed() >= TTL,
                    "order:{i}: the release found the lock not held {:?} after it was asked for",
                    sent.elapsed()
                );
            }
            touched.fetch_add(1, Ordering::Relaxed);
        }
    })
    .await;
    // Leases, left to expire.
    each(scaled(20_000), |i| {
        let (b, touched) = (b.clone(), touched.clone());
        async move {
            let owner = OwnerToken::random();
            let got = b
                .grant(&format!("worker:{i}"), owner.step(), TTL)
                .await
                .unwrap();
            assert!(matches!(got, coord_core::Attempt::Granted(_)));
            touched.fetch_add(1, Ordering::Relaxed);
        }
    })
    .await;
    // Limiter keys, every algorithm (two checks each: the second on the
    // stored state).
    let algorithms = [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::Gcra,
    ];
    each(scaled(38_000), |i| {
        let (b, touched) = (b.clone(), touched.clone());
        async move {
            let quota = Quota::new(5, WINDOW, algorithms[i % 4]);
            let key = format!("user:{i}");
            for _ in 0..2 {
                assert!(b.check(&key, &quota, 1).await.unwrap().allowed);
            }
            touched.fetch_add(1, Ordering::Relaxed);
        }
    })
    .await;
    // Barriers: completed (one party), withdrawn, abandoned (an arrival of
    // two parties that never completes nor withdraws).
    each(scaled(1_000), |i| {
        let (b, touched) = (b.clone(), touched.clone());
        async move {
            let name = format!("batch:{i}");
            let arrival = OwnerToken::random();
            match i % 3 {
                0 => assert!(b.arrive(&name, 1, "p", &arrival).await.unwrap().complete),
                1 => {
                    let a = b.arrive(&name, 2, "p", &arrival).await.unwrap();
                    assert!(
                        b.withdraw(&name, a.generation, "p", &arrival)
                            .await
                            .unwrap()
                    );
                }
                _ => assert!(!b.arrive(&name, 2, "p", &arrival).await.unwrap().complete),
            }
            touched.fetch_add(1, Ordering::Relaxed);
        }
    })
    .await;
    // Elections: half resigned, half left to expire.
    each(scaled(1_000), |i| {
        let (b, touched) = (b.clone(), touched.clone());
        async move {
            let owner = OwnerToken::random();
            let name = format!("shard:{i}");
            let sent = std::time::Instant::now();
            let got = b
                .try_campaign(&name, "me", owner.step(), TTL)
                .await
                .unwrap();
            assert!(matches!(got, coord_core::Attempt::Granted(_)));
            if i % 2 == 0 {
                // A term resigns while it lasts (past its TTL, on a loaded
                // machine, it may be over).
                let resigned = b.resign(&name, owner.step()).await.unwrap();
                assert!(
                    resigned || sent.elapsed() >= TTL,
                    "a live term did not resign"
                );
            }
            touched.fetch_add(1, Ordering::Relaxed);
        }
    })
    .await;
    let touched = touched.load(Ordering::Relaxed);
    let grown: Vec<u64> = TABLES.iter().map(|t| rows(&db, t)).collect();
    eprintln!(
        "touched {touched} names in {:?}; rows per table {TABLES:?}: baseline {baseline:?}, \
         after touching {grown:?}",
        t0.elapsed()
    );

    let swept = settle(&b).await;
    let after: Vec<u64> = TABLES.iter().map(|t| rows(&db, t)).collect();
    eprintln!(
        "after TTL, window and grace: {after:?} ({swept} rows swept; total {:?})",
        t0.elapsed()
    );
    for ((table, base), now) in TABLES.iter().zip(&baseline).zip(&after) {
        assert!(
            now.saturating_sub(*base) <= touched / 100,
            "{table}: {now} rows, baseline {base}, after touching {touched} names \
             (more than 1 % left)"
        );
    }
    // A name used again after its row was deleted still gets a higher
    // fencing token than every earlier grant.
    let owner = OwnerToken::random();
    let coord_core::Attempt::Granted(t) = Lock::try_acquire(&*b, "order:0", owner.step(), TTL)
        .await
        .unwrap()
    else {
        panic!("order:0 is free")
    };
    let max_seen: u64 = cluster()
        .psql(&db, "SELECT last_value FROM coord.fencing")
        .trim()
        .parse()
        .unwrap();
    assert_eq!(t.get(), max_seen, "a fresh token from the sequence");
    assert!(t.get() > touched / 2, "tokens never restart");
}
