//! Every algorithm admits exactly its limit: it says when to retry, its
//! windows pass and free again, a check is one round trip, a quota change
//! never grants a fresh allowance, extreme quotas are exact or refused, and
//! a fixed window admits no more in its last millisecond.

use crate::common;
use std::time::Duration;

use common::{SEC, backend, php_backend, unique};
use conformance::testkit::redis::{self as kit, CountingProxy, Resp};
use coord_core::{Algorithm, Limiter, Quota};

use super::{micros, pair};

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

/// Every check is one command, and 3 per 10 s admit the first 3 of 5.
/// A fixed window is aligned to the clock: a run of checks that a new
/// window began in the middle of (its reset time jumped up) says nothing
/// of the count, and is run again on a fresh key (at most 3 times).
#[tokio::test]
async fn a_limiter_check_costs_exactly_one_round_trip() {
    let proxy = CountingProxy::start(kit::server().port());
    let b = backend(&proxy.url()).await;
    for algorithm in Algorithm::ALL {
        let q = Quota::new(3, 10 * SEC, algorithm);
        let mut runs = 0;
        let decisions = loop {
            runs += 1;
            let key = unique("limiter-rt");
            let mut decisions = Vec::new();
            for _ in 0..5 {
                let before = proxy.commands();
                decisions.push(b.check(&key, &q, 1).await.unwrap());
                assert_eq!(proxy.commands() - before, 1, "{algorithm:?}");
            }
            let new_window = algorithm == Algorithm::FixedWindow
                && decisions
                    .windows(2)
                    .any(|w| w[1].reset_after > w[0].reset_after);
            if !new_window || runs == 3 {
                break decisions;
            }
        };
        for (i, d) in decisions.iter().enumerate() {
            assert_eq!(d.allowed, i < 3, "{algorithm:?} #{i}: {d:?}");
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
