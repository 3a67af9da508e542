//! The sliding log: a check of large cost is fast and small, costs expire
//! with their requests, entries are kept for the largest window, the PHP
//! entries are counted, and a key busy for ever or keeping near 2^51
//! units never admits over its limit.

use crate::common;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{SEC, backend, php_backend, unique};
use conformance::testkit::redis::{self as kit, Resp};
use coord_core::{Algorithm, Limiter, Quota};
use coord_redis::{RedisBackend, RedisOptions};

use super::micros;

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
