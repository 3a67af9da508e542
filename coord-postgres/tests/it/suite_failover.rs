//! PostgreSQL primary failover: a primary and a streaming standby
//! (asynchronous replication) from the test kit
//! (`conformance::testkit::postgres_failover`), and clients on a
//! multi-host URL
//! (`postgres://h1:p1,h2:p2/db?target_session_attrs=read-write`).
//!
//! - The whole shared conformance suite through the multi-host URL, on a
//!   pair that is never failed over, with the polling fallback at 60 s so
//!   that every prompt wake-up comes from LISTEN/NOTIFY.
//! - Fencing tokens of every source (lock and lease grants, semaphore
//!   permits, election terms, barrier generations, `FencingSource::next`,
//!   queue deliveries), and queue message ids, never repeat across a
//!   failover to a standby that missed the newest WAL: the replication
//!   link is cut, more tokens are drawn than a sequence logs ahead (32),
//!   the primary is killed with `SIGKILL` and the standby promoted.
//! - A lock workload (the fenced-register judge of `conformance::faults`)
//!   runs while the primary is killed and the standby promoted, with the
//!   link cut first (the tail the standby missed is lost for real): locks
//!   exclude, tokens rise, every client follows to the new primary (pool
//!   and LISTEN: a waiter of a client connected before the failover is
//!   woken by NOTIFY) within the bound.
//!
//! Each failover test starts its own pair and runs alone (`SERIAL`).

use std::collections::BTreeMap;
use std::time::Duration;

use conformance::faults::{FaultLog, LockWorkload, run_lock_workload};
use conformance::testkit::postgres_failover::{PgFailover, failover_pair};
use coord_core::{Coord, OwnerToken};
use tokio::time::{Instant, sleep};

async fn make_coord() -> Coord {
    let url = blocking(|| failover_pair().url()).await;
    let coord = coord_postgres::connect(&url)
        .await
        .expect("connect to the test pair through its multi-host URL");
    assert!(
        coord.capabilities().notifications,
        "a direct connection must LISTEN"
    );
    assert_eq!(
        coord.capabilities().deployment,
        coord_core::Deployment::PrimaryStandby
    );
    coord.with_poll_interval(Duration::from_secs(60))
}

conformance::suite!(make_coord);

/// One failover test at a time (each kills a primary, and its time bounds
/// assume the other is not also starting servers).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const TTL: Duration = Duration::from_secs(1);
/// How long after the promotion the workload (and every client) may take
/// to make progress, beyond the TTL: a call on a dead pooled connection
/// fails (500 ms call timeout), a new connection tries the dead primary
/// (refused) and logs in to the new one (500 ms connect timeout), and a
/// waiter is woken by its poll or by its LISTEN connection, which
/// reconnects with a backoff of up to 2 s.
const SLACK: Duration = Duration::from_secs(2);

/// Run `f` (a blocking kit call) off the async workers.
async fn blocking<T: Send + 'static, F: FnOnce() -> T + Send + 'static>(f: F) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("a kit call panicked")
}

/// A client of `url` with the short timeouts of a service using 1 s TTLs.
async fn client(url: &str) -> Coord {
    client_with(url, Duration::from_millis(500)).await
}

/// A client of the pair whose calls and connects time out after `limit`.
async fn client_with(url: &str, limit: Duration) -> Coord {
    coord_postgres::builder(url)
        .call_timeout(limit)
        .connect_timeout(limit)
        .pool_size(4)
        .connect()
        .await
        .expect("connect to the test pair")
}

/// Draw one token from every source coord-postgres has, each on its own
/// name; `(source, token)`.
async fn draw_every_token(c: &Coord) -> coord_core::Result<Vec<(&'static str, u64)>> {
    let ttl = Duration::from_secs(30);
    let mut out = Vec::new();
    let g = c.locks()?.try_acquire("tok-lock", ttl).await?;
    let g = g.expect("the lock is free");
    out.push(("lock", g.fencing_token().get()));
    g.release().await?;
    let g = c.leases()?.grant("tok-lease", ttl).await?;
    let g = g.expect("the lease is free");
    out.push(("lease", g.fencing_token().get()));
    g.revoke().await?;
    let p = c.semaphores()?.try_acquire("tok-sem", 2, ttl).await?;
    let p = p.expect("a permit is free");
    out.push(("semaphore", p.fencing_token().get()));
    p.release().await?;
    let l = c
        .elections()?
        .try_campaign("tok-election", "me", ttl)
        .await?;
    let l = l.expect("nobody leads");
    out.push(("election", l.term().get()));
    l.resign().await?;
    let a = c
        .raw_barrier()?
        .arrive("tok-barrier", 1, "p", &OwnerToken::random())
        .await?;
    out.push(("barrier", a.generation));
    out.push(("fencing", c.fencing()?.next("tok-resource").await?.get()));
    let q = c.queues()?;
    out.push(("queue message id", q.push("tok-queue", b"m").await?.0));
    let d = q.pop("tok-queue", ttl, Duration::ZERO).await?;
    let d = d.expect("the message just pushed");
    out.push(("queue", d.fencing_token().get()));
    d.ack().await?;
    Ok(out)
}

/// Tokens drawn on the old primary after the standby stopped receiving its
/// WAL are lost with it; the new primary must still never hand out one of
/// them again (nor a lower one) for the same name. Fails with a sequence
/// alone: the standby's copy of it is behind what the old primary issued.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_never_repeat_across_a_failover_that_lost_the_tail() {
    let _serial = SERIAL.lock().await;
    let pair = std::sync::Arc::new(blocking(PgFailover::start).await);
    let url = {
        let p = pair.clone();
        blocking(move || p.create_database("tokens")).await
    };
    // Every draw before the kill must be answered (a step whose reply
    // timed out may still hold its name, and the next draw would find it
    // taken): a call timeout that a loaded machine does not outlast. The
    // killed primary refuses at once, so it does not slow the failover.
    let c = client_with(&url, Duration::from_secs(3)).await;
    draw_every_token(&c).await.expect("draw before the cut");
    let p = pair.clone();
    blocking(move || p.wait_caught_up()).await;
    pair.cut_replication();
    let mut issued: BTreeMap<&str, u64> = BTreeMap::new();
    for _ in 0..40 {
        for (source, t) in draw_every_token(&c).await.expect("draw after the cut") {
            let max = issued.entry(source).or_default();
            *max = (*max).max(t);
        }
    }
    let p = pair.clone();
    blocking(move || {
        p.kill_primary();
        p.promote_standby();
    })
    .await;
    // The same client, which must find the new primary by itself.
    let deadline = Instant::now() + Duration::from_secs(15);
    let after = loop {
        match draw_every_token(&c).await {
            Ok(t) => break t,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("no token from the promoted standby: {e}"),
        }
    };
    let mut repeated = Vec::new();
    for (source, t) in after {
        let before = issued[source];
        println!("{source}: {t} after the failover, {before} the highest before");
        if t <= before {
            repeated.push(format!(
                "{source}: {t} after the failover, {before} issued before"
            ));
        }
    }
    assert!(
        repeated.is_empty(),
        "tokens went back after the failover: {repeated:?}"
    );
}

/// A waiter of `waiter` (a client connected before the failover) is woken
/// by a release of another client through its LISTEN connection, now on
/// the new primary, not by its 30 s poll.
async fn assert_woken_by_notify(url: &str, waiter: Coord, scenario: &str) {
    let holder = client(url).await;
    let name = conformance::unique("wake-probe");
    let long = Duration::from_secs(30);
    let held = holder.locks().unwrap().acquire(&name, long, TTL).await;
    let held = held.expect("the probe lock is free");
    let n = name.clone();
    let waiting = tokio::spawn(async move {
        let locks = waiter.with_poll_interval(long).locks().unwrap();
        let g = locks.acquire(&n, long, long).await;
        (g, Instant::now())
    });
    sleep(Duration::from_millis(300)).await;
    held.release().await.unwrap();
    let released = Instant::now();
    let (g, at) = waiting.await.unwrap();
    let g = g.expect("the waiter acquires once the holder released");
    g.release().await.unwrap();
    let took = at.saturating_duration_since(released);
    println!("{scenario}: waiter woken {took:?} after the release's reply");
    // The waiter polls every 30 s (15 s at the soonest, jittered), so 3 s
    // still tells a wake-up from a poll on a loaded machine.
    assert!(
        took < Duration::from_secs(3),
        "{scenario}: the waiter was woken {took:?} after the release's reply: its LISTEN connection did not move to the new primary"
    );
}

/// The old primary is not killed but fenced read-only (as failover
/// managers do to a primary they cannot stop: `default_transaction_read_only`),
/// and the standby promoted. A client whose pooled connections and LISTEN
/// connection are on the old primary gets "read-only transaction"
/// (SQLSTATE 25006) there: that must be a retryable `Unavailable`, the
/// connection dropped, the next call on the new primary, and its LISTEN
/// connection must move too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_primary_fenced_read_only_is_left_for_the_promoted_standby() {
    let _serial = SERIAL.lock().await;
    let pair = std::sync::Arc::new(blocking(PgFailover::start).await);
    let url = {
        let p = pair.clone();
        blocking(move || p.create_database("fenced")).await
    };
    let c = client(&url).await;
    let locks = c.locks().unwrap();
    // Warm the pool before the fence. On a loaded machine a fresh
    // connection's first call can outlast the 500 ms call timeout: try
    // again while the error is retryable (the test has not begun); a
    // timed-out attempt that landed holds the lock until the core's
    // cleanup releases it.
    let warm_until = Instant::now() + Duration::from_secs(20);
    let g = loop {
        let r = locks.try_acquire("fenced", TTL).await;
        match r {
            Ok(Some(g)) => break g,
            Err(ref e) if !e.is_retryable() => panic!("the warm-up acquire failed: {e}"),
            _ if Instant::now() < warm_until => sleep(Duration::from_millis(50)).await,
            other => panic!("the warm-up acquire never got the lock: {other:?}"),
        }
    };
    g.release().await.unwrap();
    let p = pair.clone();
    blocking(move || {
        p.wait_caught_up();
        let primary = p.primary();
        primary.psql(
            "postgres",
            "ALTER SYSTEM SET default_transaction_read_only = on",
        );
        primary.psql("postgres", "SELECT pg_reload_conf()");
        p.promote_standby();
    })
    .await;
    // Every pooled connection on the old primary fails once at most.
    let mut failures = Vec::new();
    let got = loop {
        match locks.try_acquire("fenced", TTL).await {
            Ok(g) => break g,
            Err(e) => {
                assert!(
                    e.is_retryable(),
                    "a read-only server must be a retryable error: {e}"
                );
                failures.push(e.to_string());
                assert!(
                    failures.len() <= 4,
                    "still failing after every pooled connection failed once: {failures:?}"
                );
            }
        }
    };
    println!("failed {} times first: {failures:?}", failures.len());
    got.expect("the lock is free on the new primary")
        .release()
        .await
        .unwrap();
    assert_woken_by_notify(&url, c, "fenced-read-only").await;
}

/// A lock workload (4 clients, 1 s TTL, watchdog on, fenced register)
/// while the primary fails: the replication link is cut (the standby
/// misses every grant from then on), another client draws 100 tokens, and
/// 500 ms later the primary is killed with SIGKILL, and the standby is
/// promoted one TTL later (with asynchronous replication, promoting no
/// sooner than the longest TTL after the old primary stopped is what keeps
/// locks exclusive: every guard it acknowledged has lapsed by then, lost
/// grants and extends included). Locks exclude throughout, tokens rise,
/// every client works on the new primary within TTL + 2 s, and a client
/// connected before the failover is woken by NOTIFY on the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn locks_exclude_and_clients_follow_a_failover() {
    let _serial = SERIAL.lock().await;
    let pair = std::sync::Arc::new(blocking(PgFailover::start).await);
    let url = {
        let p = pair.clone();
        blocking(move || p.create_database("failover")).await
    };
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(&url).await);
    }
    let waiter = client(&url).await;
    let other = client(&url).await;
    let workload = LockWorkload {
        ttl: TTL,
        // At most half the recovery bound (see `LockWorkload::wait`).
        wait: Duration::from_secs(1),
        watchdog: true,
        work: Duration::from_millis(20),
        duration: Duration::from_secs(9),
    };
    let p = pair.clone();
    let fault = async move {
        sleep(Duration::from_secs(2)).await;
        p.cut_replication();
        // More tokens than the sequence logs ahead (32), so the standby's
        // copy of it is behind for sure; then grants of the workload.
        let fencing = other.fencing().unwrap();
        for _ in 0..100 {
            fencing.next("side").await.expect("a token before the kill");
        }
        sleep(Duration::from_millis(500)).await;
        let k = p.clone();
        blocking(move || k.kill_primary()).await;
        sleep(TTL + Duration::from_millis(100)).await;
        let k = p.clone();
        blocking(move || k.promote_standby()).await;
        FaultLog::healed_now(1)
    };
    let (report, log) = run_lock_workload(clients, "failover", workload, fault).await;
    report.assert_ok("primary-failover", "postgres", log.injected, TTL + SLACK);
    report.assert_every_client_recovered("primary-failover", "postgres", TTL + SLACK);
    assert_woken_by_notify(&url, waiter, "primary-failover").await;
}
