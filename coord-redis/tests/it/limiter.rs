//! Limiter scripts on a real Redis: cost does not cost time or memory, GCRA
//! is exact at high rates, a sliding log stays exact however long a key is
//! busy, and a quota change never grants a fresh allowance.

use crate::common;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{SEC, backend, php_backend, unique};
use conformance::testkit::redis::{self as kit, CountingProxy, Resp};
use coord_core::{Algorithm, Limiter, Quota};
use coord_redis::{RedisBackend, RedisOptions};

/// Sum of `MEMORY USAGE` over every key under `prefix`.
fn memory_under(server: &kit::RedisServer, prefix: &str) -> (usize, i64) {
    let Resp::Array(Some(keys)) = server.command(&["KEYS", &format!("{prefix}*")]) else {
        panic!("KEYS reply");
    };
    let mut total = 0;
    for k in &keys {
        total += server
            .command(&["MEMORY", "USAGE", k.as_str().unwrap()])
            .as_int()
            .unwrap_or(0);
    }
    (keys.len(), total)
}

#[tokio::test]
async fn a_sliding_log_check_of_large_cost_is_fast_and_small() {
    let server = kit::server();
    let prefix = format!("{}:", unique("logcost"));
    let b = RedisBackend::connect(RedisOptions::new(&server.url()).prefix(&prefix))
        .await
        .unwrap();
    let key = unique("big");
    // One entry per unit of cost would take Redis many seconds for
    // 10,000,000; one call well under 2 s on a loaded machine.
    const COST: u64 = 10_000_000;
    let q = Quota::new(2 * COST, 60 * SEC, Algorithm::SlidingLog);
    let started = Instant::now();
    let d = b.check(&key, &q, COST).await.unwrap();
    let took = started.elapsed();
    assert!(d.allowed, "{d:?}");
    assert_eq!(d.remaining, COST);
    let (n, bytes) = memory_under(server, &prefix);
    assert!(
        took < Duration::from_secs(2),
        "a check of cost {COST} took {took:?}"
    );
    assert!(
        bytes < 4096,
        "a check of cost {COST} left {n} keys of {bytes} bytes"
    );
    let d = b.check(&key, &q, COST).await.unwrap();
    assert!(d.allowed && d.remaining == 0, "{d:?}");
    let d = b.check(&key, &q, 1).await.unwrap();
    assert!(!d.allowed && d.remaining == 0, "{d:?}");
    assert!(
        d.retry_after > 59 * SEC && d.retry_after <= 60 * SEC,
        "{d:?}"
    );
    assert!(
        d.reset_after > 59 * SEC && d.reset_after <= 60 * SEC,
        "{d:?}"
    );
}

#[tokio::test]
async fn sliding_log_costs_expire_with_their_requests() {
    let b = backend(&kit::url()).await;
    const ROUNDS: usize = 3;
    for _ in 0..ROUNDS {
        if sliding_log_round(&b, &unique("logexpire")).await {
            return;
        }
    }
    panic!("each of {ROUNDS} rounds was answered too late to decide anything");
}

/// One round of `sliding_log_costs_expire_with_their_requests` on `key`:
/// false if a refusal it checks was answered a window or more after the
/// request it counts on was sent (that request may have left the window
/// legitimately: nothing proved).
async fn sliding_log_round(b: &RedisBackend, key: &str) -> bool {
    let window = 3 * SEC;
    let q = Quota::new(10, window, Algorithm::SlidingLog);
    let sent7 = Instant::now();
    assert!(b.check(key, &q, 7).await.unwrap().allowed);
    tokio::time::sleep(window / 2).await;
    let sent3 = Instant::now();
    assert!(b.check(key, &q, 3).await.unwrap().allowed);
    let d = b.check(key, &q, 1).await.unwrap();
    if sent7.elapsed() >= window {
        return false;
    }
    assert!(!d.allowed, "{d:?}");
    // The cost-7 request expires first: 7 units free up at once.
    assert!(d.retry_after <= window / 2, "{d:?}");
    tokio::time::sleep(d.retry_after + Duration::from_millis(5)).await;
    let d = b.check(key, &q, 7).await.unwrap();
    assert!(d.allowed, "{d:?}");
    let d = b.check(key, &q, 1).await.unwrap();
    if sent3.elapsed() >= window {
        return false;
    }
    assert!(!d.allowed, "{d:?}");
    true
}

/// The RESP bytes of one check of `key` under `q` (cost 1), as the backend
/// sends them, captured through a proxy.
async fn captured_check(proxy: &CountingProxy, key: &str, q: &Quota) -> Vec<u8> {
    let b = backend(&proxy.url()).await;
    b.check(key, q, 1).await.unwrap();
    let cmd = proxy.last_command();
    assert!(cmd.windows(7).any(|w| w == b"EVALSHA"), "captured {cmd:?}");
    cmd
}

/// Replace every `from` in `bytes` with `to` (same length).
fn replace(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let mut out = bytes.to_vec();
    let mut i = 0;
    while i + from.len() <= out.len() {
        if &out[i..i + from.len()] == from.as_bytes() {
            out[i..i + from.len()].copy_from_slice(to.as_bytes());
            i += from.len();
        } else {
            i += 1;
        }
    }
    out
}

/// Run `n` copies of `check` in one pipeline between two `TIME`s: the
/// server runs them back to back. Returns (admitted, server µs elapsed).
fn pipelined_burst(server: &kit::RedisServer, check: &[u8], n: usize) -> (u64, u64) {
    let time = kit::encode(&["TIME"]);
    let mut payload = time.clone();
    for _ in 0..n {
        payload.extend_from_slice(check);
    }
    payload.extend_from_slice(&time);
    let replies = server.pipeline(payload, n + 2).unwrap();
    let admitted = replies[1..=n]
        .iter()
        .filter(|r| match r {
            Resp::Array(Some(a)) => a[0] == Resp::Int(1),
            other => panic!("check reply {other:?}"),
        })
        .count() as u64;
    (admitted, micros(&replies[n + 1]) - micros(&replies[0]))
}

/// A `TIME` reply in µs.
fn micros(r: &Resp) -> u64 {
    let Resp::Array(Some(t)) = r else {
        panic!("TIME reply {r:?}")
    };
    let s: u64 = t[0].as_str().unwrap().parse().unwrap();
    let us: u64 = t[1].as_str().unwrap().parse().unwrap();
    s * 1_000_000 + us
}

/// Two distinct names of the same length.
fn pair(case: &str) -> (String, String) {
    let (a, b) = (unique(case), unique(case));
    (format!("{a:0>48}"), format!("{b:0>48}"))
}

/// GCRA's theoretical arrival time stays exact to the last fraction of a
/// µs over a long burst, and the burst admits exactly the quota. The
/// emission interval T = window / limit has a sub-µs part (0.1237 µs); a
/// TAT kept as an absolute µs double (ulp 0.25 µs at today's clock) rounds
/// it away on every admission, so over 10,000 admissions the TAT falls
/// behind by about a millisecond and a fast enough burst is admitted too
/// much. The window is days long, so the server's speed and clock cannot
/// change what is admitted: the check is the exact stored TAT, which must
/// move by exactly (limit - 1) * T from the first admission to the last.
/// The checks are the backend's own `EVALSHA`, captured and replayed in
/// one pipeline.
#[tokio::test]
async fn gcra_keeps_its_arrival_time_exact_over_a_burst_of_the_whole_quota() {
    let server = kit::server();
    let proxy = CountingProxy::start(server.port());
    let prefix = format!("{}:", unique("gcra-exact"));
    let limit = 10_000u64;
    // T = 100,000,000.1237 µs: the burst ends long before one more is due.
    let window_us = 100_000_000 * limit + 1_237;
    let q = Quota::new(limit, Duration::from_micros(window_us), Algorithm::Gcra);
    let b = RedisBackend::connect(RedisOptions::new(&proxy.url()).prefix(&prefix))
        .await
        .unwrap();
    let name = unique("burst");
    // The first admission, through the backend; its bytes are replayed.
    assert!(b.check(&name, &q, 1).await.unwrap().allowed);
    let check = proxy.last_command();
    assert!(
        check.windows(7).any(|w| w == b"EVALSHA"),
        "captured {check:?}"
    );
    let Resp::Array(Some(keys)) = server.command(&["KEYS", &format!("{prefix}*")]) else {
        panic!("KEYS reply");
    };
    assert_eq!(keys.len(), 1, "one key per GCRA limiter: {keys:?}");
    let key = keys[0].as_str().unwrap().to_owned();
    // The stored TAT as (µs, 1/limit µs).
    let tat = || {
        let Resp::Array(Some(f)) = server.command(&["HMGET", &key, "t", "r"]) else {
            panic!("HMGET reply");
        };
        let int = |r: &Resp| r.as_int().unwrap_or_else(|| panic!("field {r:?}")) as i128;
        (int(&f[0]), int(&f[1]))
    };
    let (t1, r1) = tat();
    assert_eq!(r1, 1_237, "after one admission the TAT is now + T");
    let extra = 50;
    let (admitted, _) = pipelined_burst(server, &check, limit as usize - 1 + extra);
    assert_eq!(
        admitted,
        limit - 1,
        "a burst within one emission interval admits exactly the quota"
    );
    let (tn, rn) = tat();
    let moved = (tn - t1) * limit as i128 + (rn - r1);
    assert_eq!(
        moved,
        (limit as i128 - 1) * window_us as i128,
        "the TAT moved by {moved}/{limit} µs over {} admissions of T = {window_us}/{limit} µs",
        limit - 1
    );
}

#[tokio::test]
async fn gcra_slow_rate_is_exact() {
    let b = backend(&kit::url()).await;
    let key = unique("gcra-slow");
    let q = Quota::new(3, 10 * SEC, Algorithm::Gcra);
    let mut admitted = 0;
    // When the first check was sent and answered: the store decided it
    // between the two.
    let mut first = None;
    for _ in 0..10 {
        let sent = std::time::Instant::now();
        let d = b.check(&key, &q, 1).await.unwrap();
        first.get_or_insert((sent, std::time::Instant::now()));
        if d.allowed {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 3);
    let (first_sent, first_answered) = first.unwrap();
    let sent = std::time::Instant::now();
    let d = b.check(&key, &q, 1).await.unwrap();
    let answered = std::time::Instant::now();
    // The next emission is due 10/3 s after the first admission: as
    // this check saw it, that much less the time between the two
    // decisions, which lies between `sent - first_answered` and
    // `answered - first_sent`.
    let earliest = Duration::from_micros(3_333_333).saturating_sub(answered - first_sent);
    let latest = Duration::from_millis(3_334).saturating_sub(sent - first_answered);
    assert!(
        d.retry_after >= earliest && d.retry_after <= latest,
        "{d:?}: retry_after outside {earliest:?}..={latest:?}"
    );
    assert_eq!(d.remaining, 0);
}

/// A quota change carries the key's state over, for every algorithm:
/// 1000 checks alternating 10/600s and 11/600s admit at most 11; after 15
/// admitted under 20/600s, a check under 10/600s is denied; after 10
/// admitted under 10/600s, a shorter window (10/60s) does not start
/// afresh either.
#[tokio::test]
async fn a_quota_change_never_grants_a_fresh_allowance() {
    let b = backend(&kit::url()).await;
    let mut wrong = Vec::new();
    for alg in Algorithm::ALL {
        let key = unique("alternate");
        let a = Quota::new(10, 600 * SEC, alg);
        let c = Quota::new(11, 600 * SEC, alg);
        let mut admitted = 0;
        for i in 0..1000 {
            let q = if i % 2 == 0 { a } else { c };
            if b.check(&key, &q, 1).await.unwrap().allowed {
                admitted += 1;
            }
        }
        if admitted > 11 {
            wrong.push(format!(
                "{alg:?}: alternating 10/600s and 11/600s admitted {admitted}"
            ));
        }

        let key = unique("shrink");
        let big = Quota::new(20, 600 * SEC, alg);
        for _ in 0..15 {
            assert!(b.check(&key, &big, 1).await.unwrap().allowed, "{alg:?}");
        }
        let d = b
            .check(&key, &Quota::new(10, 600 * SEC, alg), 1)
            .await
            .unwrap();
        if d.allowed {
            wrong.push(format!(
                "{alg:?}: after 15 under 20/600s, 10/600s admitted: {d:?}"
            ));
        }

        // A shorter window does not start afresh either.
        let key = unique("shorter");
        let long = Quota::new(10, 600 * SEC, alg);
        for _ in 0..10 {
            assert!(b.check(&key, &long, 1).await.unwrap().allowed, "{alg:?}");
        }
        let d = b
            .check(&key, &Quota::new(10, 60 * SEC, alg), 1)
            .await
            .unwrap();
        if d.allowed {
            wrong.push(format!(
                "{alg:?}: after 10 under 10/600s, 10/60s admitted: {d:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// The sliding log keeps entries for the largest window the key was
/// checked with, so a check with a short window does not make a later
/// check with the long window forget what it admitted.
#[tokio::test]
async fn sliding_log_retains_entries_for_the_largest_window() {
    let b = backend(&kit::url()).await;
    let key = unique("retain");
    let long = Quota::new(8, 10 * SEC, Algorithm::SlidingLog);
    let short = Quota::new(5, Duration::from_millis(100), Algorithm::SlidingLog);
    for _ in 0..5 {
        assert!(b.check(&key, &long, 1).await.unwrap().allowed);
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    for i in 0..5 {
        let d = b.check(&key, &short, 1).await.unwrap();
        assert!(d.allowed, "short window #{i}: {d:?}");
    }
    // 10 admitted within 10 s: the long quota (8) is over.
    let d = b.check(&key, &long, 1).await.unwrap();
    assert!(!d.allowed, "{d:?}");
    assert_eq!(d.remaining, 0);
}

#[tokio::test]
async fn a_limiter_check_costs_exactly_one_round_trip() {
    let proxy = CountingProxy::start(kit::server().port());
    let b = backend(&proxy.url()).await;
    for algorithm in Algorithm::ALL {
        let key = unique("limiter-rt");
        let q = Quota::new(3, 10 * SEC, algorithm);
        for i in 0..5 {
            let before = proxy.commands();
            let d = b.check(&key, &q, 1).await.unwrap();
            assert_eq!(d.allowed, i < 3, "{algorithm:?} #{i}: {d:?}");
            assert_eq!(proxy.commands() - before, 1, "{algorithm:?}");
        }
    }
}

#[tokio::test]
async fn limiters_admit_exactly_the_limit_and_say_when_to_retry() {
    let b = backend(&kit::url()).await;
    for layout_php in [false, true] {
        let b = if layout_php {
            php_backend(&kit::url()).await
        } else {
            backend(&kit::url()).await
        };
        for algorithm in Algorithm::ALL {
            let key = unique("limit");
            let q = Quota::new(5, 60 * SEC, algorithm);
            let mut admitted = 0;
            for _ in 0..8 {
                let d = b.check(&key, &q, 1).await.unwrap();
                if d.allowed {
                    admitted += 1;
                    assert_eq!(d.retry_after, Duration::ZERO);
                    assert_eq!(d.remaining, 5 - admitted, "{algorithm:?} {d:?}");
                } else {
                    assert!(d.retry_after > Duration::ZERO, "{algorithm:?} {d:?}");
                    // (A sliding-window counter may need part of the next window too.)
                    assert!(d.retry_after <= 120 * SEC, "{algorithm:?} {d:?}");
                    assert_eq!(d.remaining, 0, "{algorithm:?} {d:?}");
                    assert!(d.reset_after > Duration::ZERO, "{algorithm:?} {d:?}");
                }
            }
            assert_eq!(admitted, 5, "{algorithm:?}");
            // Cost counts.
            let key = unique("cost");
            assert!(b.check(&key, &q, 5).await.unwrap().allowed);
            assert!(!b.check(&key, &q, 1).await.unwrap().allowed);
        }
    }
    drop(b);
}

#[tokio::test]
async fn limiter_windows_pass_and_free_again() {
    let b = backend(&kit::url()).await;
    for algorithm in Algorithm::ALL {
        let key = unique("window");
        let q = Quota::new(2, Duration::from_millis(200), algorithm);
        // Check until denied (a fixed window may roll over meanwhile).
        let mut d = b.check(&key, &q, 1).await.unwrap();
        let mut n = 0;
        while d.allowed {
            n += 1;
            assert!(n <= 6, "{algorithm:?} never denies");
            d = b.check(&key, &q, 1).await.unwrap();
        }
        tokio::time::sleep(d.retry_after + Duration::from_millis(5)).await;
        let d2 = b.check(&key, &q, 1).await.unwrap();
        assert!(
            d2.allowed,
            "{algorithm:?}: after retry_after {d:?} -> {d2:?}"
        );
    }
}

#[tokio::test]
async fn php_sliding_log_counts_the_php_entries_and_uses_unique_members() {
    let server = kit::server();
    let b = php_backend(&server.url()).await;
    let key = unique("api");
    // What PHP's checkRateLimit leaves behind: score = member = now in
    // seconds (microtime(true)).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let php = format!("{now:.4}");
    server.command(&["ZADD", &key, &php, &php]);
    let q = Quota::per(3, 10 * SEC);
    let mut admitted = 0;
    // Concurrent checks: each gets its own member.
    let b = Arc::new(b);
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let (b, key) = (b.clone(), key.clone());
        tasks.push(tokio::spawn(
            async move { b.check(&key, &q, 1).await.unwrap() },
        ));
    }
    for t in tasks {
        if t.await.unwrap().allowed {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 2, "the PHP entry counts against the limit");
    assert_eq!(server.command(&["ZCARD", &key]).as_int(), Some(3));
    // Scores are seconds, like PHP's.
    if let Resp::Array(Some(items)) = server.command(&["ZRANGE", &key, "0", "-1", "WITHSCORES"]) {
        for pair in items.chunks(2) {
            let score: f64 = pair[1].as_str().unwrap().parse().unwrap();
            assert!((score - now).abs() < 60.0, "{score} vs {now}");
        }
    } else {
        panic!("ZRANGE reply");
    }
}

/// The largest quotas the scripts count exactly work; larger ones are a
/// typed refusal before any I/O.
#[tokio::test]
async fn extreme_quotas_are_exact_or_refused() {
    let b = backend(&kit::url()).await;
    let max = (1u64 << 49) - 1;
    for alg in Algorithm::ALL {
        let key = unique("extreme");
        let q = Quota::new(max, 300 * 24 * 3600 * SEC, alg);
        let d = b.check(&key, &q, 1).await.unwrap();
        assert!(d.allowed, "{alg:?} {d:?}");
        assert_eq!(d.remaining, max - 1, "{alg:?} {d:?}");
        let d = b.check(&key, &q, max - 1).await.unwrap();
        assert!(d.allowed, "{alg:?} {d:?}");
        // (GCRA refills ~22 requests per µs at this rate.)
        if alg != Algorithm::Gcra {
            assert_eq!(d.remaining, 0, "{alg:?} {d:?}");
            let d = b.check(&key, &q, 1).await.unwrap();
            assert!(!d.allowed, "{alg:?} {d:?}");
        }
        let r = b.check(&key, &Quota::new(1 << 49, SEC, alg), 1).await;
        assert!(
            matches!(
                r,
                Err(coord_core::Error::InvalidArgument { field: "limit", .. })
            ),
            "{alg:?} {r:?}"
        );
    }
}

/// A GCRA key in the older string layout (the TAT as a decimal µs string,
/// before the state became a hash) is carried over: its backlog still
/// counts, and it becomes the hash.
#[tokio::test]
async fn a_gcra_key_of_the_string_layout_keeps_its_backlog() {
    let server = kit::server();
    let prefix = format!("{}:", unique("gcraold"));
    let b = RedisBackend::connect(RedisOptions::new(&server.url()).prefix(&prefix))
        .await
        .unwrap();
    let key = unique("old");
    let redis_key = format!("{prefix}limiter:{{{key}}}:gcra");
    // A TAT 50 s ahead of the server clock: the 10-per-60 s quota has 1
    // request of room left (its burst window is 60 s).
    let Resp::Array(Some(t)) = server.command(&["TIME"]) else {
        panic!("TIME")
    };
    let now: u64 = t[0].as_str().unwrap().parse::<u64>().unwrap() * 1_000_000
        + t[1].as_str().unwrap().parse::<u64>().unwrap();
    let tat = (now + 50_000_000).to_string();
    server.command(&["SET", &redis_key, &tat, "PX", "60000"]);
    let q = Quota::new(10, 60 * SEC, Algorithm::Gcra);
    assert!(b.check(&key, &q, 1).await.unwrap().allowed);
    let d = b.check(&key, &q, 1).await.unwrap();
    assert!(!d.allowed, "the old backlog was forgotten: {d:?}");
    assert_eq!(
        server.command(&["TYPE", &redis_key]),
        Resp::Simple("hash".into())
    );
}

/// A fixed window's state must outlive the window: Redis expires keys on
/// its millisecond clock, so the TTL is rounded up (`ceil(left / 1000)`
/// ms, and Redis treats a key as expired only after that ms), never
/// ending before the window does; else a check in the window's last
/// fraction of a millisecond would find no state and admit again. 20,000
/// checks of a 4.7 ms window (limit 1, so window ends fall anywhere in a
/// millisecond), each after a `TIME`, run back to back: no window whose
/// checks are placed without doubt may admit two.
#[tokio::test]
async fn a_fixed_window_admits_no_more_in_its_last_millisecond() {
    let server = kit::server();
    let proxy = CountingProxy::start(server.port());
    // Not a whole number of ms, so window ends fall anywhere in a ms.
    let window_us = 4_700u64;
    let q = Quota::new(1, Duration::from_micros(window_us), Algorithm::FixedWindow);
    let (a, b) = pair("fixed-last-ms");
    let check = replace(&captured_check(&proxy, &a, &q).await, &a, &b);
    let time = kit::encode(&["TIME"]);
    let n = 20_000;
    let mut payload = Vec::new();
    for _ in 0..n {
        payload.extend_from_slice(&time);
        payload.extend_from_slice(&check);
    }
    payload.extend_from_slice(&time);
    let replies = server.pipeline(payload, 2 * n + 1).unwrap();
    let mut per_window = std::collections::BTreeMap::<u64, u32>::new();
    for i in 0..n {
        let (before, after) = (micros(&replies[2 * i]), micros(&replies[2 * i + 2]));
        let admitted = match &replies[2 * i + 1] {
            Resp::Array(Some(r)) => r[0] == Resp::Int(1),
            other => panic!("check reply {other:?}"),
        };
        // Windows are aligned to multiples of the window on the server
        // clock; count only checks that surely ran inside one window.
        if admitted && before / window_us == after / window_us {
            *per_window.entry(before / window_us).or_default() += 1;
        }
    }
    let doubled: Vec<_> = per_window.iter().filter(|(_, c)| **c > 1).collect();
    assert!(
        doubled.is_empty(),
        "{} of {} windows admitted twice with limit 1 (state expired before its window ended): {:?}",
        doubled.len(),
        per_window.len(),
        &doubled[..doubled.len().min(5)]
    );
}

/// The members of a sorted set with their scores.
fn zrange(server: &kit::RedisServer, key: &str) -> Vec<(String, f64)> {
    let Resp::Array(Some(items)) = server.command(&["ZRANGE", key, "0", "-1", "WITHSCORES"]) else {
        panic!("ZRANGE reply");
    };
    items
        .chunks(2)
        .map(|p| {
            let score = p[1].as_str().unwrap().parse().unwrap();
            (p[0].as_str().unwrap().to_owned(), score)
        })
        .collect()
}

/// A sliding-log key kept busy for ever never admits over its limit, and
/// every total its script stores stays an exact integer. The script keeps
/// a running total of the extra cost (cost - 1) of the key's admissions,
/// which only grows while the key is busy; past 2^53 a double no longer
/// holds it exactly, and the window's count (a difference of two such
/// totals) can come out short and admit more than the limit. Rather than
/// run for years, the key starts where years of full-quota traffic would
/// leave it: one admission of half the quota through the backend, then
/// every stored total (the state's `x` and `xb`, and the total each cost
/// member carries) raised by the same offset, which leaves what the
/// window holds unchanged, to four admissions short of 2^53. Each round
/// then moves the log half a window into the past (what the script sees
/// of half a window passing), admits the other half of the quota, and
/// probes with one unit more, which the full window must deny. The window
/// is ten minutes long, so the test's own speed cannot change a decision.
#[tokio::test]
async fn a_sliding_log_key_busy_for_ever_never_admits_over_its_limit() {
    let server = kit::server();
    let prefix = format!("{}:", unique("logbusy"));
    let b = RedisBackend::connect(RedisOptions::new(&server.url()).prefix(&prefix))
        .await
        .unwrap();
    let name = unique("busy");
    let (log, costs, state) = (
        format!("{prefix}limiter:{{{name}}}:log"),
        format!("{prefix}limiter:{{{name}}}:logc"),
        format!("{prefix}limiter:{{{name}}}:logs"),
    );
    let limit = (1u64 << 49) - 2;
    let half = limit / 2;
    let window = 600 * SEC;
    let q = Quota::new(limit, window, Algorithm::SlidingLog);
    assert!(b.check(&name, &q, half).await.unwrap().allowed);
    for k in [&log, &costs, &state] {
        assert_eq!(server.command(&["EXISTS", k]).as_int(), Some(1), "{k}");
    }

    // Raise every stored total by the same offset.
    let offset = (1u64 << 53) - 5 * (half - 1);
    let Resp::Array(Some(f)) = server.command(&["HMGET", &state, "x", "xb"]) else {
        panic!("HMGET reply");
    };
    let field = |r: &Resp| r.as_int().unwrap_or(0) as u64;
    let (x, xb) = (field(&f[0]) + offset, field(&f[1]) + offset);
    server.command(&["HSET", &state, "x", &x.to_string(), "xb", &xb.to_string()]);
    for (member, score) in zrange(server, &costs) {
        let (id, total) = member.rsplit_once('*').unwrap();
        let total: u64 = total.parse().unwrap();
        server.command(&["ZREM", &costs, &member]);
        let raised = format!("{id}*{}", total + offset);
        server.command(&["ZADD", &costs, &format!("{score}"), &raised]);
    }

    let half_window = window.as_micros() as f64 / 2.0;
    let mut previous = half;
    let mut over = Vec::new();
    let mut refused = Vec::new();
    for round in 0..12 {
        // Half a window passes: the previous admission is half a window
        // old, the one before it leaves the window.
        for key in [&log, &costs] {
            for (member, score) in zrange(server, key) {
                let moved = format!("{}", score - half_window);
                server.command(&["ZADD", key, "XX", &moved, &member]);
            }
        }
        let mut admitted = 0;
        if b.check(&name, &q, half).await.unwrap().allowed {
            admitted += half;
        } else {
            refused.push(round);
        }
        let probe = b.check(&name, &q, 1).await.unwrap();
        if probe.allowed {
            admitted += 1;
        }
        if previous + admitted > limit {
            over.push(format!(
                "round {round}: the window holds {} over its limit of {limit}",
                previous + admitted - limit
            ));
        }
        previous = admitted;
    }
    assert!(over.is_empty(), "{over:#?}");
    assert!(
        refused.is_empty(),
        "half the quota was refused with half the window free in rounds {refused:?}"
    );

    // Every total the script keeps is still an exact integer.
    let exact = 1u64 << 53;
    let Resp::Array(Some(f)) = server.command(&["HMGET", &state, "x", "xb"]) else {
        panic!("HMGET reply");
    };
    let mut totals = vec![field(&f[0]), field(&f[1])];
    for (member, _) in zrange(server, &costs) {
        totals.push(member.rsplit_once('*').unwrap().1.parse().unwrap());
    }
    assert!(
        totals.iter().all(|t| *t < exact),
        "stored totals {totals:?} reach 2^53"
    );
}

/// A sliding-log key whose kept entries come near 2^51 units of extra
/// cost (only a key mixing a long window with short windows of huge
/// limits can keep that many) admits no request that would take its
/// totals past exact integers: it says to retry once the oldest entry
/// has left the long window, and a smaller request still fits.
#[tokio::test]
async fn a_sliding_log_key_keeping_2_pow_51_units_waits_for_the_oldest_to_leave() {
    let server = kit::server();
    let prefix = format!("{}:", unique("logroom"));
    let b = RedisBackend::connect(RedisOptions::new(&server.url()).prefix(&prefix))
        .await
        .unwrap();
    let name = unique("mixed");
    let (log, costs, state) = (
        format!("{prefix}limiter:{{{name}}}:log"),
        format!("{prefix}limiter:{{{name}}}:logc"),
        format!("{prefix}limiter:{{{name}}}:logs"),
    );
    let long = Quota::new((1 << 49) - 1, 600 * SEC, Algorithm::SlidingLog);
    let short = Quota::new(100, SEC, Algorithm::SlidingLog);
    assert!(b.check(&name, &long, 1).await.unwrap().allowed);
    // An entry of 2^51 - 9 units, admitted (under short windows) five
    // minutes ago: the key keeps 2^51 - 10 units of extra cost.
    let now = micros(&server.command(&["TIME"]));
    let then = (now - 300_000_000).to_string();
    let kept = (1u64 << 51) - 10;
    server.command(&["ZADD", &log, &then, &format!("old*{}", kept + 1)]);
    server.command(&["ZADD", &costs, &then, &format!("old*{kept}")]);
    server.command(&["HSET", &state, "x", &kept.to_string(), "xb", "0"]);

    let d = b.check(&name, &short, 20).await.unwrap();
    assert!(!d.allowed, "{d:?}");
    assert!(
        d.retry_after > 299 * SEC && d.retry_after <= 300 * SEC,
        "{d:?}"
    );
    let d = b.check(&name, &short, 10).await.unwrap();
    assert!(d.allowed, "{d:?}");
    let x = server.command(&["HGET", &state, "x"]).as_int().unwrap();
    assert_eq!(x as u64, kept + 9);
}
