//! Rate limiter cases, each for every algorithm.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use coord_core::{Algorithm, Coord, Error, Quota};
use tokio::time::{Instant, sleep};

use super::ROUNDS;
use crate::{Factory, unique};

/// Sleep, if needed, so that a burst starting now fits inside one aligned
/// window: fixed windows reset on boundaries, and a sliding window
/// counter's estimate starts to decay at one (both align windows on
/// multiples of the window length since the epoch). Probe a scratch key
/// with a fixed window of the same length and use its `reset_after` (the
/// time to the next boundary); half the window, up to 10 s, of room is
/// enough for any burst here. Returns the earliest the window a burst
/// starting now is in can end (`None` for the other algorithms).
async fn early_in_window(c: &Coord, quota: Quota) -> Option<Instant> {
    if !matches!(
        quota.algorithm,
        Algorithm::FixedWindow | Algorithm::SlidingWindow
    ) {
        return None;
    }
    let probe = unique("probe");
    let aligned = Quota::new(quota.limit, quota.window, Algorithm::FixedWindow);
    // The store measured `reset_after` from a moment after `sent`.
    let sent = Instant::now();
    let d = c.limiter().unwrap().check(&probe, aligned).await.unwrap();
    let room = (quota.window / 2).min(Duration::from_secs(10));
    if d.reset_after < room {
        sleep(d.reset_after + Duration::from_millis(50)).await;
        Some(sent + d.reset_after + quota.window)
    } else {
        Some(sent + d.reset_after)
    }
}

/// The window of the sequential countdown: short, so that honouring a
/// denial's `retry_after` is quick, but long enough that the `limit + 1`
/// sequential checks fit in 2 s before any refill can admit one more. A
/// sliding log refills a whole window after its first entry, the windowed
/// algorithms have 2 s of room after [`early_in_window`]; GCRA refills
/// one request every window / limit, so its window is 20 s (one request per
/// 2 s; with 4 s it was one per 400 ms, which a loaded 3-node etcd cluster
/// took to serve the 11 checks, and the 11th was rightly admitted). A
/// check answered after the earliest refill is not judged: the countdown
/// starts again on a fresh key.
fn countdown_window(alg: Algorithm) -> Duration {
    match alg {
        Algorithm::Gcra => Duration::from_secs(20),
        _ => Duration::from_secs(4),
    }
}

/// A window long enough that GCRA's steady refill (one request per
/// window / limit) cannot add an admission while a burst is in flight on a
/// slow store.
const BURST_WINDOW: Duration = Duration::from_secs(600);

/// Of 3 x limit concurrent requests exactly `limit` are admitted in one
/// window; `remaining` counts down; a denial has `retry_after` > 0; after
/// it, requests are admitted again.
pub async fn limiter_admits_exactly_limit_of_concurrent_requests(f: &Factory) {
    if crate::cases::offered(f.client().await.limiter()).is_none() {
        return;
    }
    let clients = f.clients(4).await;
    for alg in Algorithm::ALL {
        const LIMIT: u64 = 10;
        let quota = Quota::new(LIMIT, BURST_WINDOW, alg);
        let key = unique(&format!("limit-{alg:?}"));
        early_in_window(&clients[0], quota).await;
        let admitted = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for i in 0..(3 * LIMIT) as usize {
            let c = clients[i % clients.len()].clone();
            let (k, a) = (key.clone(), admitted.clone());
            tasks.push(tokio::spawn(async move {
                let d = c.limiter().unwrap().check(&k, quota).await.unwrap();
                if d.allowed {
                    a.fetch_add(1, Ordering::SeqCst);
                } else {
                    assert!(
                        d.retry_after > Duration::ZERO,
                        "{alg:?}: denial without retry_after"
                    );
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(
            admitted.load(Ordering::SeqCst),
            LIMIT,
            "{alg:?}: admitted count"
        );

        // remaining counts down on a fresh key, with a short window.
        let quota = Quota::new(LIMIT, countdown_window(alg), alg);
        let lim = clients[1].limiter().unwrap();
        let mut judged = false;
        for _ in 0..ROUNDS {
            let key2 = unique(&format!("countdown-{alg:?}"));
            let boundary = early_in_window(&clients[0], quota).await;
            // The earliest a fresh allowance may come: a check answered
            // after it that finds one proves nothing (a loaded machine),
            // and the countdown starts again on a fresh key.
            let first_sent = Instant::now();
            let refill = match alg {
                Algorithm::SlidingLog => first_sent + quota.window,
                Algorithm::Gcra => first_sent + quota.window / LIMIT as u32,
                _ => boundary.expect("a windowed algorithm's boundary"),
            };
            if countdown(&lim, &key2, quota, LIMIT, refill).await {
                judged = true;
                break;
            }
            eprintln!(
                "{alg:?}: a countdown check was answered after a refill: again on a fresh key"
            );
        }
        assert!(
            judged,
            "{alg:?}: {ROUNDS} countdowns, each with a check answered too late to judge"
        );
    }
}

/// `limit` checks of a fresh `key` admitted with `remaining` counting down,
/// the next denied with a `retry_after`, and admitted again after it.
/// `false` when a check that found an allowance too many was answered at
/// or after `refill` (the earliest a fresh allowance may come): not judged.
async fn countdown(
    lim: &coord_core::RateLimiter,
    key: &str,
    quota: Quota,
    limit: u64,
    refill: Instant,
) -> bool {
    let alg = quota.algorithm;
    for expect in (0..limit).rev() {
        let d = lim.check(key, quota).await.unwrap();
        let late = Instant::now() >= refill;
        if !late {
            assert!(d.allowed, "{alg:?}: request within the limit denied");
            assert_eq!(d.remaining, expect, "{alg:?}: remaining");
        } else if !d.allowed || d.remaining != expect {
            return false;
        }
        // A sliding window counter forgets a window's count only after
        // the next window has passed too.
        let bound = if alg == Algorithm::SlidingWindow {
            quota.window * 2
        } else {
            quota.window
        };
        assert!(
            d.reset_after <= bound + Duration::from_millis(5),
            "{alg:?}: reset_after {:?}",
            d.reset_after
        );
    }
    let d = lim.check(key, quota).await.unwrap();
    if d.allowed && Instant::now() >= refill {
        return false;
    }
    assert!(!d.allowed, "{alg:?}: request over the limit admitted");
    assert!(
        d.retry_after > Duration::ZERO && d.retry_after <= quota.window * 2,
        "{alg:?}: retry_after {:?}",
        d.retry_after
    );
    // Honour retry_after: admitted again.
    sleep(d.retry_after + Duration::from_millis(100)).await;
    let d2 = lim.check(key, quota).await.unwrap();
    assert!(
        d2.allowed,
        "{alg:?}: still denied after retry_after ({:?}): {d2:?}",
        d.retry_after
    );
    true
}

/// A burst of 1,000 concurrent requests (the same millisecond, as near as
/// the store allows) admits exactly `limit`: no two requests collapse into
/// one record.
pub async fn limiter_burst_of_1000_admits_exactly_limit(f: &Factory) {
    if crate::cases::offered(f.client().await.limiter()).is_none() {
        return;
    }
    let clients = f.clients(8).await;
    for alg in Algorithm::ALL {
        const LIMIT: u64 = 100;
        let quota = Quota::new(LIMIT, BURST_WINDOW, alg);
        let key = unique(&format!("burst-{alg:?}"));
        early_in_window(&clients[0], quota).await;
        let start = Arc::new(tokio::sync::Barrier::new(clients.len()));
        let mut tasks = Vec::new();
        for c in &clients {
            let (c, k, s) = (c.clone(), key.clone(), start.clone());
            tasks.push(tokio::spawn(async move {
                let lim = c.limiter().unwrap();
                s.wait().await;
                let checks = (0..1000 / 8).map(|_| lim.check(&k, quota));
                futures::future::join_all(checks)
                    .await
                    .into_iter()
                    .filter(|d| d.as_ref().expect("limiter check").allowed)
                    .count() as u64
            }));
        }
        let mut admitted = 0;
        for t in tasks {
            admitted += t.await.unwrap();
        }
        assert_eq!(
            admitted, LIMIT,
            "{alg:?}: a burst of 1000 admitted {admitted}, limit {LIMIT}"
        );
    }
}

/// A cost above the limit is refused with a clear, non-retryable reason.
pub async fn limiter_cost_over_limit_is_refused(f: &Factory) {
    if crate::cases::offered(f.client().await.limiter()).is_none() {
        return;
    }
    let c = f.client().await;
    for alg in Algorithm::ALL {
        let quota = Quota::new(5, Duration::from_secs(10), alg);
        let key = unique("cost");
        let e = c
            .limiter()
            .unwrap()
            .check_cost(&key, quota, 6)
            .await
            .unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument { field: "cost", .. }),
            "{alg:?}: {e:?}"
        );
        assert!(!e.is_retryable());
        assert!(
            e.to_string().contains("never be admitted"),
            "{alg:?}: unclear reason: {e}"
        );
        let d = c
            .limiter()
            .unwrap()
            .check_cost(&key, quota, 5)
            .await
            .unwrap();
        assert!(
            d.allowed && d.remaining == 0,
            "{alg:?}: the refused request was recorded: {d:?}"
        );
    }
}

/// A quota change carries a key's state over: callers with different
/// quotas on one key (a rolling configuration change) never reset each
/// other, and a lowered limit counts what was already admitted.
pub async fn limiter_quota_change_grants_no_fresh_allowance(f: &Factory) {
    if crate::cases::offered(f.client().await.limiter()).is_none() {
        return;
    }
    let c = f.client().await;
    let lim = c.limiter().unwrap();
    for algorithm in Algorithm::ALL {
        let a = Quota::new(10, BURST_WINDOW, algorithm);
        let b = Quota::new(11, BURST_WINDOW, algorithm);
        early_in_window(&c, a).await;
        let key = unique("quota-change");
        let mut admitted = 0;
        for i in 0..200 {
            let q = if i % 2 == 0 { a } else { b };
            if lim.check(&key, q).await.unwrap().allowed {
                admitted += 1;
            }
        }
        assert!(
            (10..=11).contains(&admitted),
            "{algorithm:?}: alternating 10 and 11 per window admitted {admitted}"
        );

        let key = unique("quota-lowered");
        let big = Quota::new(20, BURST_WINDOW, algorithm);
        let small = Quota::new(10, BURST_WINDOW, algorithm);
        early_in_window(&c, big).await;
        for _ in 0..15 {
            assert!(lim.check(&key, big).await.unwrap().allowed, "{algorithm:?}");
        }
        let d = lim.check(&key, small).await.unwrap();
        assert!(
            !d.allowed,
            "{algorithm:?}: 15 admitted under 20, then 10 per window admitted more: {d:?}"
        );
        let more = {
            let mut n = 0;
            for _ in 0..10 {
                if lim.check(&key, big).await.unwrap().allowed {
                    n += 1;
                }
            }
            n
        };
        assert_eq!(more, 5, "{algorithm:?}: the larger quota lost count");
    }
}

/// The sliding algorithms do not reset at window boundaries, as a fixed
/// window does: after a burst of `limit`, the sliding log admits nothing
/// until the burst ages out, and the sliding-window counter re-admits
/// gradually (about one request per window / limit from the next window
/// boundary on), never a new burst.
///
/// Each admission is judged by when its reply came (the store decided it
/// before): a loaded machine only makes replies later, which the bounds
/// allow for, so a stall before a check is no false failure.
pub async fn limiter_sliding_algorithms_do_not_reset_at_window_boundaries(f: &Factory) {
    if crate::cases::offered(f.client().await.limiter()).is_none() {
        return;
    }
    let c = f.client().await;
    let lim = c.limiter().unwrap();
    let w = Duration::from_secs(2);
    const LIMIT: u64 = 10;
    // Store timestamps are whole milliseconds or finer, and the store's
    // clock may run a hair apart from this process's.
    let tick = Duration::from_millis(20);
    for algorithm in [Algorithm::SlidingLog, Algorithm::SlidingWindow] {
        let q = Quota::new(LIMIT, w, algorithm);
        let key = unique("boundary");
        // The next window boundary, at the earliest: a fixed window of the
        // same length is aligned as the counter's windows are, and its
        // `reset_after` runs from a moment after `probed`.
        let probed = tokio::time::Instant::now();
        let aligned = Quota::new(LIMIT, w, Algorithm::FixedWindow);
        let probe = lim.check(&unique("boundary-probe"), aligned).await.unwrap();
        let boundary = probed + probe.reset_after;
        let t0 = tokio::time::Instant::now();
        for _ in 0..LIMIT {
            assert!(lim.check(&key, q).await.unwrap().allowed, "{algorithm:?}");
        }
        let burst_end = t0.elapsed();
        // The reply instant of each admission after the burst.
        let mut admitted = Vec::new();
        // Past at least one window boundary of the store.
        while t0.elapsed() < w + Duration::from_millis(600) {
            if lim.check(&key, q).await.unwrap().allowed {
                admitted.push(tokio::time::Instant::now());
            }
            sleep(Duration::from_millis(20)).await;
        }
        let since_t0: Vec<_> = admitted.iter().map(|t| *t - t0).collect();
        match algorithm {
            Algorithm::SlidingLog => {
                // The burst's first entry was made after `t0`: nothing is
                // admitted before `t0` + w, so no reply comes before it.
                let early: Vec<_> = since_t0.iter().filter(|t| **t + tick < w).collect();
                assert!(
                    early.is_empty(),
                    "sliding log admitted {early:?} within the window of a full burst (burst took {burst_end:?})"
                );
            }
            _ => {
                // From the boundary after the burst on, the previous
                // window's count decays linearly: by `e` past it at most
                // limit x e / w are admitted (none before it). 2 more for
                // rounding; a fixed window's reset admits `limit` at once.
                for (i, at) in admitted.iter().enumerate() {
                    let e = at.saturating_duration_since(boundary);
                    let allowance = LIMIT as f64 * e.as_secs_f64() / w.as_secs_f64() + 2.0;
                    assert!(
                        (i + 1) as f64 <= allowance,
                        "sliding window admitted {} by {:?} after the burst began, {e:?} past \
                         the window boundary (at most {allowance:.1}): {since_t0:?} \
                         (a fixed window's reset)",
                        i + 1,
                        *at - t0
                    );
                }
            }
        }
    }
}

/// The four algorithms keep separate state for one key: alternating them
/// on a key never resets one with another's state.
pub async fn limiter_algorithms_of_one_key_are_independent(f: &Factory) {
    if crate::cases::offered(f.client().await.limiter()).is_none() {
        return;
    }
    let c = f.client().await;
    let lim = c.limiter().unwrap();
    let key = unique("algo-separate");
    let quotas: Vec<Quota> = Algorithm::ALL
        .iter()
        .map(|a| Quota::new(2, BURST_WINDOW, *a))
        .collect();
    for q in &quotas {
        early_in_window(&c, *q).await;
    }
    let mut admitted = vec![0; quotas.len()];
    for _round in 0..5 {
        for (i, q) in quotas.iter().enumerate() {
            if lim.check(&key, *q).await.unwrap().allowed {
                admitted[i] += 1;
            }
        }
    }
    assert_eq!(
        admitted,
        vec![2; quotas.len()],
        "per algorithm {:?}: each must admit exactly its limit",
        Algorithm::ALL
    );
}
