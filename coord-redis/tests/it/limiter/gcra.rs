//! GCRA: its theoretical arrival time stays exact over a burst of the
//! whole quota and at slow rates, and a key of the older string layout
//! keeps its backlog.

use crate::common;
use std::time::Duration;

use common::{SEC, backend, unique};
use conformance::testkit::redis::{self as kit, CountingProxy, Resp};
use coord_core::{Algorithm, Limiter, Quota};
use coord_redis::{RedisBackend, RedisOptions};

use super::micros;

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
