//! Lock attempts on the real server: a refused attempt costs the holder
//! nothing (no row lock, no transaction id, no WAL flush), so many polling
//! waiters on a small pool never starve the holder's extends. The cases
//! run one after the other (they count transaction ids server-wide).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use conformance::testkit::postgres::cluster;
use coord_core::{Attempt, Lock, OwnerToken};

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// 200 refused attempts on a held lock assign no transaction id (a row
/// lock or any write would need one, and its commit a WAL flush).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_attempt_takes_no_lock_and_writes_nothing() {
    let _alone = crate::ALONE.lock().await;
    let b = coord_postgres::builder(&cluster().url())
        .listen(false)
        .connect_backend()
        .await
        .unwrap();
    let name = unique("refused");
    let holder = OwnerToken::random();
    let got = b
        .try_acquire(&name, holder.step(), Duration::from_secs(60))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Granted(_)), "{got:?}");
    let xids = crate::XidCount::start().await;
    for i in 0..200 {
        let other = OwnerToken::random();
        let got = b
            .try_acquire(&name, other.step(), Duration::from_secs(60))
            .await
            .unwrap();
        assert!(matches!(got, Attempt::Held { .. }), "attempt {i}: {got:?}");
    }
    let used = xids.used();
    assert!(
        used <= 5,
        "200 refused attempts used {used} transaction ids (each one took the row lock)"
    );
    assert!(b.release(&name, holder.step()).await.unwrap());
}

/// 32 waiters poll every 2 ms for a lock through ONE client with a pool
/// of 2 connections and a 800 ms call timeout, while the holder (same
/// client) extends every 150 ms for 5 s: every extend succeeds in time and
/// the guard is never lost. The database flushes WAL like a slower disk
/// (`commit_delay` = 50 ms: each commit that must flush waits 50 ms first),
/// which is what a refused attempt that writes would pay while holding the
/// row lock and a pooled connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn polling_waiters_on_a_small_pool_never_starve_the_holder() {
    let _alone = crate::ALONE.lock().await;
    let db = unique("slowflush");
    let url = cluster().create_database(&db);
    cluster().psql(
        "postgres",
        &format!("ALTER DATABASE \"{db}\" SET commit_delay = 50000; ALTER DATABASE \"{db}\" SET commit_siblings = 0"),
    );
    let coord = coord_postgres::builder(&url)
        .pool_size(2)
        .call_timeout(Duration::from_millis(800))
        .connect()
        .await
        .unwrap()
        .with_poll_interval(Duration::from_millis(2));
    let locks = coord.locks().unwrap();
    let name = unique("starve");
    let ttl = Duration::from_secs(2);
    let guard = locks.try_acquire(&name, ttl).await.unwrap().expect("free");
    let xids = crate::XidCount::start().await;
    let run = Duration::from_secs(5);
    let stop = Instant::now() + run;
    let attempts = Arc::new(AtomicU64::new(0));
    let mut waiters = Vec::new();
    for _ in 0..32 {
        let (locks, name, attempts) = (locks.clone(), name.clone(), attempts.clone());
        waiters.push(tokio::spawn(async move {
            while Instant::now() < stop {
                attempts.fetch_add(1, Ordering::Relaxed);
                match locks.acquire(&name, ttl, Duration::from_millis(300)).await {
                    Ok(g) => panic!("a waiter got the held lock: {}", g.fencing_token()),
                    Err(e)
                        if e.is_retryable() || matches!(e, coord_core::Error::Timeout { .. }) => {}
                    Err(e) => panic!("waiter: {e}"),
                }
            }
        }));
    }
    let mut worst = Duration::ZERO;
    let mut extends = 0;
    while Instant::now() < stop {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let t = Instant::now();
        guard
            .extend(ttl)
            .await
            .unwrap_or_else(|e| panic!("extend {extends} failed after {:?}: {e}", t.elapsed()));
        worst = worst.max(t.elapsed());
        extends += 1;
        assert!(guard.is_valid(), "the guard was lost");
    }
    for w in waiters {
        w.await.unwrap();
    }
    eprintln!(
        "{extends} extends, slowest {worst:?}, {} waiter acquire calls, {} transaction ids",
        attempts.load(Ordering::Relaxed),
        xids.used()
    );
    guard.release().await.unwrap();
}

/// Statements of coord still running on the server (other than this one).
fn running_coord_statements() -> u64 {
    cluster()
        .psql(
            "postgres",
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' \
             AND query LIKE '%claim%' AND pid <> pg_backend_pid()",
        )
        .trim()
        .parse()
        .expect("a count")
}

/// Another session holds a lock's row (`SELECT ... FOR UPDATE` in an open
/// transaction): an attempt on it blocks, returns Unavailable within the
/// 500 ms call timeout, and its statement does not stay behind on the
/// server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_statement_times_out_and_is_cancelled_on_the_server() {
    let _alone = crate::ALONE.lock().await;
    let b = coord_postgres::builder(&cluster().url())
        .call_timeout(Duration::from_millis(500))
        .listen(false)
        .connect_backend()
        .await
        .unwrap();
    let name = unique("blocked");
    let owner = OwnerToken::random();
    // An expired row: the next attempt must lock it to take it over.
    let got = b
        .try_acquire(&name, owner.step(), Duration::from_millis(50))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Granted(_)), "{got:?}");
    tokio::time::sleep(Duration::from_millis(100)).await;

    let other = coord_postgres::builder(&cluster().url())
        .listen(false)
        .connect_backend()
        .await
        .unwrap();
    let blocker = other.pool().get().await.unwrap();
    blocker.batch_execute("BEGIN").await.unwrap();
    blocker
        .execute(
            "SELECT 1 FROM coord.claims WHERE kind = 'lock' AND name = $1 FOR UPDATE",
            &[&name],
        )
        .await
        .unwrap();

    for round in 0..3 {
        let t = Instant::now();
        let e = b
            .try_acquire(&name, OwnerToken::random().step(), Duration::from_secs(60))
            .await
            .expect_err("the row is locked by another session");
        let took = t.elapsed();
        assert!(
            matches!(e, coord_core::Error::Unavailable { .. }),
            "round {round}: {e:?}"
        );
        assert!(
            took < Duration::from_millis(900),
            "round {round}: took {took:?}"
        );
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            let left = running_coord_statements();
            if left == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: {left} statement(s) of coord still running on the server \
                 1 s after the client gave up"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    blocker.batch_execute("COMMIT").await.unwrap();
    // The client still works.
    let got = b
        .try_acquire(&name, owner.step(), Duration::from_secs(60))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Granted(_)), "{got:?}");
}

/// A renewal that waits for the row lock past the lease's expiry must not
/// resurrect it: an observer saw the lease gone while the renewal waited,
/// so the renewal reports NotHeld (false) and the lease stays gone. (It
/// decides on the clock it reads once it holds the row, not on the one
/// at the start of its statement.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_waited_past_expiry_resurrects_nothing() {
    use coord_core::Lease;
    let _alone = crate::ALONE.lock().await;
    let b = coord_postgres::builder(&cluster().url())
        .listen(false)
        .connect_backend()
        .await
        .unwrap();
    let name = unique("late_renew");
    let owner = OwnerToken::random();
    let got = b
        .grant(&name, owner.step(), Duration::from_millis(600))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Granted(_)), "{got:?}");

    let other = coord_postgres::builder(&cluster().url())
        .listen(false)
        .connect_backend()
        .await
        .unwrap();
    let blocker = other.pool().get().await.unwrap();
    blocker.batch_execute("BEGIN").await.unwrap();
    blocker
        .execute(
            "SELECT 1 FROM coord.claims WHERE kind = 'lease' AND name = $1 FOR UPDATE",
            &[&name],
        )
        .await
        .unwrap();
    let renew = {
        let (b, name, owner) = (b.clone(), name.clone(), owner);
        tokio::spawn(async move { b.renew(&name, owner.step(), Duration::from_secs(30)).await })
    };
    // The lease runs out while the renewal waits; an observer sees it gone.
    let deadline = Instant::now() + Duration::from_secs(3);
    while b.remaining(&name).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the lease never ran out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    blocker.batch_execute("COMMIT").await.unwrap();
    let renewed = renew.await.unwrap().unwrap();
    assert!(
        !renewed,
        "a renewal that took effect after the lease was observed expired resurrected it"
    );
    assert_eq!(b.remaining(&name).await.unwrap(), None);
}
