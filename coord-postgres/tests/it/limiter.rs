//! Rate limiters on the real server: admissions across window boundaries
//! under heavy concurrency, and quota changes carrying the state over.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use conformance::testkit::postgres::cluster;
use coord_core::{Algorithm, Limiter, Quota};
use coord_postgres::PostgresBackend;

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

async fn backend(pool: usize) -> Arc<PostgresBackend> {
    coord_postgres::builder(&cluster().url())
        .pool_size(pool)
        .call_timeout(Duration::from_secs(10))
        .listen(false)
        .connect_backend()
        .await
        .expect("connect to the test cluster")
}

/// Microseconds since the Unix epoch on this host's wall clock, which is
/// the clock `clock_timestamp()` reads (the server runs on this host).
fn wall_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros() as i64
}

/// One admission, bracketed by the wall clock before the request was sent
/// and after the reply came: the server decided somewhere in between.
#[derive(Debug, Clone, Copy)]
struct Admission {
    sent: i64,
    replied: i64,
}

/// 32 clients check one key in bursts that straddle window boundaries
/// (aligned to the epoch, as the server aligns fixed windows), from up to
/// 8 ms before a boundary until half a window after it. Bursts hit every second
/// boundary, so the window before each burst still has room when the
/// burst starts. Meanwhile another session plays a slow client: it takes
/// the key's row lock 10 ms before the boundary, makes a check of its own
/// in the same transaction 5 ms after the boundary and commits 15 ms after
/// it. Requests that entered before the boundary wait for that lock across
/// it: they must decide on the state and clock they find after the wait.
/// Returns every admission.
async fn hammer(algorithm: Algorithm, limit: u64, window: Duration) -> (String, Vec<Admission>) {
    const CLIENTS: usize = 32;
    const ROUNDS: i64 = 8;
    let b = backend(CLIENTS).await;
    install_audit();
    let key = unique("boundary");
    let quota = Quota::new(limit, window, algorithm);
    let w = window.as_micros() as i64;
    // The first boundary at least two windows ahead, at an even index.
    let first = ((wall_us() / w) + 2) / 2 * 2 * w + 2 * w;
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let (b, key) = (b.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for r in 0..ROUNDS {
                let boundary = first + r * 2 * w;
                let lead = 8_000 * (c as i64) / CLIENTS as i64;
                let wait = boundary - lead - wall_us();
                if wait > 0 {
                    tokio::time::sleep(Duration::from_micros(wait as u64)).await;
                }
                while wall_us() < boundary + w / 2 {
                    let sent = wall_us();
                    let d = b.check(&key, &quota, 1).await.expect("check");
                    let replied = wall_us();
                    if d.allowed {
                        got.push(Admission { sent, replied });
                    }
                }
            }
            got
        }));
    }
    let slow = backend(1).await;
    let algo = match algorithm {
        Algorithm::FixedWindow => "fixed_window",
        Algorithm::SlidingWindow => "sliding_window",
        Algorithm::SlidingLog => "sliding_log",
        _ => "gcra",
    };
    let staller = tokio::spawn({
        let key = key.clone();
        async move {
            let client = slow.pool().get().await.expect("a connection");
            let sleep_until = |t: i64| async move {
                let d = t - wall_us();
                if d > 0 {
                    tokio::time::sleep(Duration::from_micros(d as u64)).await;
                }
            };
            let mut got = Vec::new();
            for r in 0..ROUNDS {
                let boundary = first + r * 2 * w;
                sleep_until(boundary - 10_000).await;
                client.batch_execute("BEGIN").await.unwrap();
                client
                    .execute(
                        "SELECT 1 FROM coord.limiter_state WHERE algorithm = $1 AND key = $2 FOR UPDATE",
                        &[&algo, &key],
                    )
                    .await
                    .unwrap();
                sleep_until(boundary + 5_000).await;
                let sent = wall_us();
                let row = client
                    .query_one(
                        "SELECT allowed FROM coord.limiter_check($1, $2, $3, $4, 1)",
                        &[&algo, &key, &(limit as i64), &w],
                    )
                    .await
                    .unwrap();
                sleep_until(boundary + 15_000).await;
                client.batch_execute("COMMIT").await.unwrap();
                let replied = wall_us();
                if row.get::<_, bool>(0) {
                    got.push(Admission { sent, replied });
                }
            }
            got
        }
    });
    let mut all = staller.await.unwrap();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    (key, all)
}

/// Record every write of a limiter state row with the server clock at that
/// moment (an AFTER UPDATE trigger, so while the writer still holds the row
/// lock), in write order.
fn install_audit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
    cluster().psql(
        "postgres",
        "CREATE TABLE IF NOT EXISTS public.limiter_audit (id bigserial PRIMARY KEY, key text, at bigint, state text); \
         CREATE OR REPLACE FUNCTION public.limiter_audit() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN INSERT INTO public.limiter_audit (key, at, state) \
               VALUES (NEW.key, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, \
                       concat_ws(' ', NEW.window_start, NEW.q_window, NEW.cur, NEW.prev, pg_backend_pid(), txid_current())); \
               RETURN NEW; END $$; \
         CREATE OR REPLACE TRIGGER limiter_audit AFTER UPDATE ON coord.limiter_state \
         FOR EACH ROW EXECUTE FUNCTION public.limiter_audit();",
    );
    });
}

/// The server times at which the admissions of `key` were written, in
/// write (= row lock) order.
fn audit(key: &str) -> Vec<i64> {
    cluster()
        .psql(
            "postgres",
            &format!("SELECT at FROM public.limiter_audit WHERE key = '{key}' ORDER BY id"),
        )
        .lines()
        .map(|l| l.trim().parse().expect("a time"))
        .collect()
}

/// Admissions are serialized by the row lock: admission i decided after
/// admission i-1 wrote (it waited for that lock) and before it wrote
/// itself, so it lies in (write[i-1], write[i]]. Those whose whole bracket
/// lies inside one aligned window are certainly counted in it; per window
/// they must not exceed the limit. Brackets spanning a boundary are left
/// out, so this never blames a limiter that decides on the clock it reads
/// under the lock. Returns, per admission, its window if certain.
fn assert_per_window(
    what: &str,
    key: &str,
    writes: &[i64],
    limit: u64,
    window: Duration,
) -> Vec<Option<i64>> {
    let w = window.as_micros() as i64;
    let mut per: std::collections::BTreeMap<i64, u64> = Default::default();
    let mut certain = Vec::new();
    for (i, &t) in writes.iter().enumerate() {
        // The first admission's decision has no lower bound here.
        let from = if i == 0 { i64::MIN } else { writes[i - 1] + 1 };
        let (a, b) = (from.div_euclid(w), t.div_euclid(w));
        if a == b {
            *per.entry(a).or_default() += 1;
            certain.push(Some(a));
        } else {
            certain.push(None);
        }
    }
    assert!(
        per.len() >= 5,
        "{what}: the run must cover several windows: {per:?}"
    );
    let worst = per.values().copied().max().unwrap_or(0);
    assert!(
        worst <= limit,
        "{what}: {worst} admissions certainly inside one {window:?} window, limit {limit}; \
         per window: {per:?}; the writes (time, window start, window, count, prev, pid, xid):\n{}",
        cluster().psql(
            "postgres",
            &format!("SELECT at, state FROM public.limiter_audit WHERE key = '{key}' ORDER BY id LIMIT 40"),
        )
    );
    certain
}

/// Fixed window, limit 3 per 250 ms, 32 concurrent checkers in bursts
/// across 8 boundaries: no window admits more than 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fixed_window_never_exceeds_the_limit_across_boundaries() {
    let (limit, window) = (3, Duration::from_millis(250));
    let (key, got) = hammer(Algorithm::FixedWindow, limit, window).await;
    let writes = audit(&key);
    assert_eq!(writes.len(), got.len(), "every admission is written once");
    assert_per_window("fixed window", &key, &writes, limit, window);
}

/// Sliding-window counter, limit 3 per 250 ms: at every admission, the
/// previous window's count weighted by the part of it still inside the
/// sliding window, plus the current window's count, stays within 3
/// (computed from lower bounds: only admissions certainly in a window).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sliding_window_never_exceeds_the_limit_across_boundaries() {
    let (limit, window) = (3, Duration::from_millis(250));
    let (key, got) = hammer(Algorithm::SlidingWindow, limit, window).await;
    let writes = audit(&key);
    assert_eq!(writes.len(), got.len(), "every admission is written once");
    let certain = assert_per_window("sliding window", &key, &writes, limit, window);
    let w = window.as_micros() as i64;
    let mut count: std::collections::BTreeMap<i64, u64> = Default::default();
    for (i, c) in certain.iter().enumerate() {
        let Some(j) = *c else { continue };
        let prev = count.get(&(j - 1)).copied().unwrap_or(0) as f64;
        let cur = count.get(&j).copied().unwrap_or(0) as f64;
        // Decided at or before writes[i]: the previous window weighs at
        // least this much then.
        let weight = (w - (writes[i] - j * w)) as f64 / w as f64;
        let estimate = prev * weight + cur + 1.0;
        assert!(
            estimate <= limit as f64 + 1e-9,
            "sliding window: admission {i} in window {j} with estimate >= {estimate:.3} \
             (previous window {prev}, weight {weight:.3}, current {cur}), limit {limit}"
        );
        *count.entry(j).or_default() += 1;
    }
}

/// Sliding log, limit 3 per 250 ms: no interval of one window length holds
/// more than 3 admissions (counting those whose bracket lies inside it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sliding_log_never_exceeds_the_limit_in_any_window() {
    let (limit, window) = (3u64, Duration::from_millis(250));
    let (_, got) = hammer(Algorithm::SlidingLog, limit, window).await;
    let w = window.as_micros() as i64;
    assert!(got.len() as u64 > 5 * limit, "too few admissions: {got:?}");
    for a in &got {
        let start = a.sent;
        let inside = got
            .iter()
            .filter(|b| b.sent >= start && b.replied < start + w)
            .count() as u64;
        assert!(
            inside <= limit,
            "sliding log: {inside} admissions inside one window from {start}, limit {limit}"
        );
    }
}

/// Fixed windows of 600 s are aligned to the epoch: keep the quota-change
/// tests off a boundary (a new window may rightly admit afresh).
async fn away_from_a_600s_boundary() {
    let into = wall_us().rem_euclid(600_000_000);
    if into > 600_000_000 - 20_000_000 {
        tokio::time::sleep(Duration::from_micros((600_000_000 - into) as u64 + 100_000)).await;
    }
}

fn quota(algorithm: Algorithm, limit: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(600), algorithm)
}

const ALL: [Algorithm; 4] = [
    Algorithm::SlidingLog,
    Algorithm::SlidingWindow,
    Algorithm::FixedWindow,
    Algorithm::Gcra,
];

/// 1000 checks alternating 10/600s and 11/600s admit at most 11 in total,
/// for every algorithm: a quota change never grants a fresh allowance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alternating_quotas_admit_at_most_the_larger_limit() {
    let b = backend(2).await;
    away_from_a_600s_boundary().await;
    for algorithm in ALL {
        let key = unique("alternate");
        let mut admitted = 0;
        for i in 0..1000 {
            let q = quota(algorithm, if i % 2 == 0 { 10 } else { 11 });
            if b.check(&key, &q, 1).await.unwrap().allowed {
                admitted += 1;
            }
        }
        assert!(
            (10..=11).contains(&admitted),
            "{algorithm:?}: {admitted} admitted alternating 10/600s and 11/600s"
        );
    }
}

/// 15 admitted under 20/600s; then a check under 10/600s is denied, for
/// every algorithm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_smaller_quota_after_use_denies() {
    let b = backend(2).await;
    away_from_a_600s_boundary().await;
    for algorithm in ALL {
        let key = unique("shrink");
        for i in 0..15 {
            let d = b.check(&key, &quota(algorithm, 20), 1).await.unwrap();
            assert!(d.allowed, "{algorithm:?}: check {i} under 20/600s denied");
        }
        let d = b.check(&key, &quota(algorithm, 10), 1).await.unwrap();
        assert!(
            !d.allowed,
            "{algorithm:?}: 15 used under 20/600s, then 10/600s admitted: {d:?}"
        );
    }
}

/// A window change: 5 admitted under 10/600s, then under 10/60s the
/// estimate carries over (at most 5 more), for every algorithm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_change_carries_the_count_over() {
    let b = backend(2).await;
    away_from_a_600s_boundary().await;
    for algorithm in ALL {
        let key = unique("rewindow");
        for _ in 0..5 {
            assert!(
                b.check(&key, &quota(algorithm, 10), 1)
                    .await
                    .unwrap()
                    .allowed
            );
        }
        let short = Quota::new(10, Duration::from_secs(60), algorithm);
        let mut more = 0;
        for _ in 0..20 {
            if b.check(&key, &short, 1).await.unwrap().allowed {
                more += 1;
            }
        }
        assert!(
            more <= 5,
            "{algorithm:?}: 5 used under 10/600s, then {more} more under 10/60s"
        );
    }
}

/// A backend on a schema of its own (so triggers installed for a test
/// touch no other test), with or without prepared statements, no sweep.
async fn own_backend(tag: &str, prepared: bool, pool: usize) -> Arc<PostgresBackend> {
    let b = coord_postgres::builder(&cluster().url())
        .schema(unique(tag))
        .pool_size(pool)
        .prepared_statements(prepared)
        .sweep_every(None)
        .call_timeout(Duration::from_secs(10))
        .listen(false)
        .connect_backend()
        .await
        .expect("connect to the test cluster");
    assert_eq!(b.prepared_statements(), prepared);
    b
}

fn algorithm_name(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => "fixed_window",
        Algorithm::SlidingWindow => "sliding_window",
        Algorithm::SlidingLog => "sliding_log",
        _ => "gcra",
    }
}

/// One query on a connection of its own; the rows' columns as text.
async fn sql(query: &str) -> Vec<Vec<Option<String>>> {
    let (client, connection) = tokio_postgres::connect(&cluster().url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let mut out = Vec::new();
    for m in client.simple_query(query).await.expect(query) {
        if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
            out.push((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect());
        }
    }
    out
}

/// The GCRA decision time of a key whose state had run out before the
/// check: the check wrote tat x limit = now x limit + cost x window.
async fn gcra_decided_at(schema: &str, key: &str, window_us: i64, cost: i64) -> i64 {
    let rows = sql(&format!(
        "SELECT ((tat_x - {cost}::numeric * {window_us}) / q_limit)::int8 FROM \"{schema}\".limiter_state \
          WHERE algorithm = 'gcra' AND key = '{key}'"
    ))
    .await;
    rows[0][0]
        .as_deref()
        .expect("a GCRA state")
        .parse()
        .expect("a time")
}

/// Another session holds the row lock of a key's state for 300 ms while
/// a GCRA check of the key comes in: the check waits and decides on the
/// clock it reads once it has the lock (its recorded decision time is
/// after the holder's commit), with and without prepared statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_decides_on_the_clock_after_the_row_lock() {
    for prepared in [true, false] {
        let b = own_backend("gcra_lock", prepared, 2).await;
        let s = b.schema().to_string();
        let key = unique("locked");
        let quota = Quota::new(1000, Duration::from_secs(1), Algorithm::Gcra);
        for _ in 0..3 {
            assert!(b.check(&key, &quota, 1).await.unwrap().allowed);
        }
        // The state runs out (3 ms of backlog).
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (holder, connection) = tokio_postgres::connect(&cluster().url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        holder.batch_execute("BEGIN").await.unwrap();
        let locked = holder
            .execute(
                &format!(
                    "SELECT 1 FROM \"{s}\".limiter_state WHERE algorithm = 'gcra' AND key = $1 FOR UPDATE"
                ),
                &[&key],
            )
            .await
            .unwrap();
        assert_eq!(locked, 1);
        let check = tokio::spawn({
            let (b, key) = (b.clone(), key.clone());
            async move { b.check(&key, &quota, 1).await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!check.is_finished(), "the check waits for the row lock");
        let released = wall_us();
        holder.batch_execute("COMMIT").await.unwrap();
        let d = check.await.unwrap();
        assert!(d.allowed, "prepared {prepared}: {d:?}");
        assert_eq!(d.remaining, 999, "prepared {prepared}: {d:?}");
        let at = gcra_decided_at(&s, &key, 1_000_000, 1).await;
        assert!(
            at >= released,
            "prepared {prepared}: decided at {at}, {} µs before the lock was released",
            released - at
        );
    }
}

/// The sweep race: a key's state row is deleted (as the sweep deletes an
/// idle one) by a session that held its lock while a check waited for
/// it. The check decides like on no state, on the clock after the
/// deletion, and records its admission in a new row; every algorithm,
/// with and without prepared statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_row_deleted_while_a_check_waits_is_made_again() {
    for prepared in [true, false] {
        let b = own_backend("swept", prepared, 2).await;
        let s = b.schema().to_string();
        for algorithm in ALL {
            let algo = algorithm_name(algorithm);
            let key = unique("swept");
            let quota = Quota::new(10, Duration::from_secs(1), algorithm);
            assert!(b.check(&key, &quota, 1).await.unwrap().allowed);
            tokio::time::sleep(Duration::from_millis(20)).await;
            let (holder, connection) =
                tokio_postgres::connect(&cluster().url(), tokio_postgres::NoTls)
                    .await
                    .unwrap();
            tokio::spawn(connection);
            holder.batch_execute("BEGIN").await.unwrap();
            let locked = holder
                .execute(
                    &format!(
                        "SELECT 1 FROM \"{s}\".limiter_state WHERE algorithm = $1 AND key = $2 FOR UPDATE"
                    ),
                    &[&algo, &key],
                )
                .await
                .unwrap();
            assert_eq!(locked, 1);
            let check = tokio::spawn({
                let (b, key) = (b.clone(), key.clone());
                async move { b.check(&key, &quota, 1).await.unwrap() }
            });
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(
                !check.is_finished(),
                "{algo}: the check waits for the row lock"
            );
            holder
                .execute(
                    &format!("DELETE FROM \"{s}\".limiter_state WHERE algorithm = $1 AND key = $2"),
                    &[&algo, &key],
                )
                .await
                .unwrap();
            holder
                .execute(
                    &format!("DELETE FROM \"{s}\".limiter_log WHERE key = $1"),
                    &[&key],
                )
                .await
                .unwrap();
            let deleted = wall_us();
            holder.batch_execute("COMMIT").await.unwrap();
            let d = check.await.unwrap();
            assert!(d.allowed, "prepared {prepared}, {algo}: {d:?}");
            assert_eq!(
                d.remaining, 9,
                "prepared {prepared}, {algo}: like on no state: {d:?}"
            );
            let rows = sql(&format!(
                "SELECT coalesce(q_window, retain) FROM \"{s}\".limiter_state WHERE algorithm = '{algo}' AND key = '{key}'"
            ))
            .await;
            assert_eq!(
                rows.len(),
                1,
                "prepared {prepared}, {algo}: the row is made again"
            );
            assert_eq!(
                rows[0][0].as_deref(),
                Some("1000000"),
                "prepared {prepared}, {algo}: the admission is recorded"
            );
            if algorithm == Algorithm::Gcra {
                let at = gcra_decided_at(&s, &key, 1_000_000, 1).await;
                assert!(
                    at >= deleted,
                    "prepared {prepared}: decided at {at}, {} µs before the deletion committed",
                    deleted - at
                );
            }
        }
    }
}

/// A denial writes nothing: once a key is used up, 100 denied checks
/// leave its state row as it was (no new version, no row lock: xmin, xmax
/// and ctid unchanged) and add no sliding-log entry; every algorithm,
/// with and without prepared statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denials_write_nothing() {
    for prepared in [true, false] {
        let b = own_backend("denials", prepared, 2).await;
        let s = b.schema().to_string();
        away_from_a_600s_boundary().await;
        for algorithm in ALL {
            let algo = algorithm_name(algorithm);
            let key = unique("denied");
            for _ in 0..2 {
                assert!(
                    b.check(&key, &quota(algorithm, 2), 1)
                        .await
                        .unwrap()
                        .allowed
                );
            }
            let state = format!(
                "SELECT xmin::text, xmax::text, ctid::text, \
                        (SELECT count(*) FROM \"{s}\".limiter_log l WHERE l.key = x.key) \
                   FROM \"{s}\".limiter_state x WHERE algorithm = '{algo}' AND key = '{key}'"
            );
            let before = sql(&state).await;
            assert_eq!(before.len(), 1);
            for i in 0..100 {
                // The same quota, and a smaller one (another path).
                let q = quota(algorithm, if i % 2 == 0 { 2 } else { 1 });
                let d = b.check(&key, &q, 1).await.unwrap();
                assert!(!d.allowed, "prepared {prepared}, {algo}: check {i}: {d:?}");
            }
            let after = sql(&state).await;
            assert_eq!(before, after, "prepared {prepared}, {algo}: denials wrote");
        }
    }
}

/// Limiter decisions commit without waiting for the WAL flush
/// (`synchronous_commit = off` in the check's own transaction), whatever
/// the session's setting (coord raises it to `on` for grants): a trigger
/// records the setting at every write of a state row or log entry.
/// Fresh keys, repeated checks and quota changes, every algorithm, with
/// and without prepared statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limiter_commits_are_asynchronous() {
    for prepared in [true, false] {
        let b = own_backend("async", prepared, 2).await;
        let s = b.schema().to_string();
        sql(&format!(
            "CREATE TABLE \"{s}\".commit_audit (tbl text, setting text); \
             CREATE FUNCTION \"{s}\".commit_audit() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN INSERT INTO \"{s}\".commit_audit VALUES (TG_TABLE_NAME, current_setting('synchronous_commit')); \
                   RETURN NULL; END $$; \
             CREATE TRIGGER commit_audit AFTER INSERT OR UPDATE ON \"{s}\".limiter_state \
             FOR EACH ROW EXECUTE FUNCTION \"{s}\".commit_audit(); \
             CREATE TRIGGER commit_audit AFTER INSERT OR UPDATE ON \"{s}\".limiter_log \
             FOR EACH ROW EXECUTE FUNCTION \"{s}\".commit_audit();"
        ))
        .await;
        for algorithm in ALL {
            let key = unique("async");
            for i in 0..6 {
                let q = quota(algorithm, if i < 4 { 100 } else { 101 });
                assert!(b.check(&key, &q, 1).await.unwrap().allowed);
            }
        }
        let rows = sql(&format!(
            "SELECT tbl, setting, count(*) FROM \"{s}\".commit_audit GROUP BY 1, 2 ORDER BY 1, 2"
        ))
        .await;
        let writes: i64 = rows
            .iter()
            .map(|r| r[2].as_deref().unwrap().parse::<i64>().unwrap())
            .sum();
        assert!(writes >= 24, "prepared {prepared}: {rows:?}");
        assert!(
            rows.iter().all(|r| r[1].as_deref() == Some("off")),
            "prepared {prepared}: limiter writes under {rows:?}"
        );
    }
}
