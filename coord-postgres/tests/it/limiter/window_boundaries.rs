//! Admissions across window boundaries under heavy concurrency, checked
//! against the server times the state rows were written at: a fixed
//! window, a sliding window and a sliding log never exceed the limit.

use std::time::Duration;

use conformance::testkit::postgres::cluster;
use coord_core::{Algorithm, Limiter, Quota};

use super::{backend, unique, wall_us};

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
