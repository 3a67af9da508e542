//! The rate limiting algorithms as pure state transitions, for backends that
//! decide in the client and store the state (the in-memory backend, etcd's
//! compare-and-swap). Backends with server-side scripts (Redis, PostgreSQL)
//! implement the same arithmetic in their store's language; the conformance
//! suite holds them all to the same behaviour.
//!
//! Time is nanoseconds since an epoch of the caller's choosing (fixed
//! windows are aligned to it). All arithmetic is integer and exact.

use std::collections::VecDeque;
use std::time::Duration;

use crate::types::{Algorithm, Decision, Quota};

/// The stored state of one limiter key under one algorithm, with the
/// quota it was computed under: a key checked with a different limit or
/// window starts its accounting afresh (the old numbers mean nothing under
/// the new quota; GCRA's in particular are scaled by the limit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitState {
    limit: u64,
    window: u128,
    algo: Algo,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Algo {
    /// (time, cost) of each admitted request, oldest first; every request
    /// its own entry.
    SlidingLog(VecDeque<(u128, u64)>),
    /// The window index and its count.
    FixedWindow { index: u128, count: u64 },
    /// The current window's index and count, and the previous window's
    /// count.
    SlidingWindow { index: u128, curr: u64, prev: u64 },
    /// The theoretical arrival time, in nanoseconds x limit (scaled so the
    /// emission interval window / limit is exact).
    Gcra { tat: u128 },
}

fn nanos(n: u128) -> Duration {
    Duration::from_nanos(n.min(u64::MAX as u128) as u64)
}

impl Algo {
    fn new(algorithm: Algorithm) -> Self {
        match algorithm {
            Algorithm::SlidingLog => Algo::SlidingLog(VecDeque::new()),
            Algorithm::FixedWindow => Algo::FixedWindow { index: 0, count: 0 },
            Algorithm::SlidingWindow => Algo::SlidingWindow {
                index: 0,
                curr: 0,
                prev: 0,
            },
            Algorithm::Gcra => Algo::Gcra { tat: 0 },
        }
    }

    fn algorithm(&self) -> Algorithm {
        match self {
            Algo::SlidingLog(_) => Algorithm::SlidingLog,
            Algo::FixedWindow { .. } => Algorithm::FixedWindow,
            Algo::SlidingWindow { .. } => Algorithm::SlidingWindow,
            Algo::Gcra { .. } => Algorithm::Gcra,
        }
    }
}

impl LimitState {
    /// The empty state for `quota`.
    pub fn new(quota: &Quota) -> Self {
        LimitState {
            limit: quota.limit,
            window: quota.window.as_nanos().max(1),
            algo: Algo::new(quota.algorithm),
        }
    }

    /// Check a request of `cost` at time `now` (ns since the epoch) against
    /// `quota`, recording it in the state if admitted. The caller has
    /// checked `1 <= cost <= limit` and a non-zero window. A quota other
    /// than the state's starts it afresh.
    pub fn check(&mut self, now: u128, quota: &Quota, cost: u64) -> Decision {
        let w = quota.window.as_nanos().max(1);
        let limit = quota.limit;
        if self.limit != limit || self.window != w || self.algo.algorithm() != quota.algorithm {
            *self = LimitState::new(quota);
        }
        match &mut self.algo {
            Algo::SlidingLog(log) => sliding_log(log, now, w, limit, cost),
            Algo::FixedWindow { index, count } => {
                let cur = now / w;
                if *index != cur {
                    *index = cur;
                    *count = 0;
                }
                let to_end = nanos(w - now % w);
                let allowed = cost <= limit.saturating_sub(*count);
                if allowed {
                    *count += cost;
                }
                Decision {
                    allowed,
                    remaining: limit.saturating_sub(*count),
                    retry_after: if allowed { Duration::ZERO } else { to_end },
                    reset_after: if *count == 0 { Duration::ZERO } else { to_end },
                }
            }
            Algo::SlidingWindow { index, curr, prev } => {
                let cur = now / w;
                if *index != cur {
                    *prev = if cur == *index + 1 { *curr } else { 0 };
                    *curr = 0;
                    *index = cur;
                }
                sliding_window(curr, *prev, now % w, w, limit, cost)
            }
            Algo::Gcra { tat } => gcra(tat, now, w, limit, cost),
        }
    }

    /// Whether the state no longer affects any decision at `now` (it may
    /// be deleted).
    pub fn is_idle(&self, now: u128) -> bool {
        let w = self.window;
        match &self.algo {
            Algo::SlidingLog(log) => log.back().is_none_or(|(t, _)| t + w <= now),
            Algo::FixedWindow { index, .. } => *index < now / w,
            Algo::SlidingWindow { index, .. } => index + 1 < now / w,
            Algo::Gcra { tat } => *tat <= now.saturating_mul(u128::from(self.limit)),
        }
    }

    /// The state as text, for stores that keep it as a value:
    /// `limit window_ns|` followed by `t:c,t:c,...` (sliding log),
    /// `index count` (fixed window), `index curr prev` (sliding window) or
    /// `tat` (GCRA).
    pub fn encode(&self) -> String {
        let body = match &self.algo {
            Algo::SlidingLog(log) => log
                .iter()
                .map(|(t, c)| format!("{t}:{c}"))
                .collect::<Vec<_>>()
                .join(","),
            Algo::FixedWindow { index, count } => format!("{index} {count}"),
            Algo::SlidingWindow { index, curr, prev } => format!("{index} {curr} {prev}"),
            Algo::Gcra { tat } => tat.to_string(),
        };
        format!("{} {}|{body}", self.limit, self.window)
    }

    /// Parse [`encode`](LimitState::encode)'s text for `algorithm`; `None`
    /// if it is corrupt.
    pub fn decode(algorithm: Algorithm, text: &str) -> Option<Self> {
        let (head, body) = text.split_once('|')?;
        let (limit, window) = head.split_once(' ')?;
        let (limit, window) = (limit.parse().ok()?, window.parse().ok()?);
        let algo = match algorithm {
            Algorithm::SlidingLog => {
                let mut log = VecDeque::new();
                if !body.is_empty() {
                    for item in body.split(',') {
                        let (t, c) = item.split_once(':')?;
                        log.push_back((t.parse().ok()?, c.parse().ok()?));
                    }
                }
                Algo::SlidingLog(log)
            }
            Algorithm::FixedWindow => {
                let (a, b) = body.split_once(' ')?;
                Algo::FixedWindow {
                    index: a.parse().ok()?,
                    count: b.parse().ok()?,
                }
            }
            Algorithm::SlidingWindow => {
                let mut it = body.split(' ');
                let s = Algo::SlidingWindow {
                    index: it.next()?.parse().ok()?,
                    curr: it.next()?.parse().ok()?,
                    prev: it.next()?.parse().ok()?,
                };
                if it.next().is_some() {
                    return None;
                }
                s
            }
            Algorithm::Gcra => Algo::Gcra {
                tat: body.parse().ok()?,
            },
        };
        Some(LimitState {
            limit,
            window,
            algo,
        })
    }
}

/// Exact sliding log of (time, cost) entries.
fn sliding_log(
    log: &mut VecDeque<(u128, u64)>,
    now: u128,
    w: u128,
    limit: u64,
    cost: u64,
) -> Decision {
    while log.front().is_some_and(|(t, _)| t + w <= now) {
        log.pop_front();
    }
    // Every entry was admitted within the limit, so the sum fits; saturate
    // anyway rather than trust it.
    let used: u64 = log.iter().fold(0u64, |a, (_, c)| a.saturating_add(*c));
    if cost <= limit.saturating_sub(used) {
        log.push_back((now, cost));
        return Decision {
            allowed: true,
            remaining: limit - used - cost,
            retry_after: Duration::ZERO,
            reset_after: nanos(w),
        };
    }
    // Denied: wait until enough of the oldest entries fall out.
    let mut freed = 0;
    let mut retry_after = nanos(w);
    for (t, c) in log.iter() {
        freed += c;
        if cost <= limit.saturating_sub(used - freed) {
            retry_after = nanos((t + w).saturating_sub(now));
            break;
        }
    }
    let reset_after = log
        .back()
        .map_or(Duration::ZERO, |(t, _)| nanos((t + w).saturating_sub(now)));
    Decision {
        allowed: false,
        remaining: limit.saturating_sub(used),
        retry_after: retry_after.max(Duration::from_millis(1)),
        reset_after,
    }
}

/// Sliding window counter: current count plus the previous window's count
/// weighted by its remaining overlap with the trailing window.
fn sliding_window(
    curr: &mut u64,
    prev: u64,
    into: u128,
    w: u128,
    limit: u64,
    cost: u64,
) -> Decision {
    // estimate = prev * (w - into) / w + curr, kept exact in units of 1/w.
    let weighted = u128::from(prev) * (w - into);
    let est_w = weighted + u128::from(*curr) * w;
    let allowed = est_w + u128::from(cost) * w <= u128::from(limit) * w;
    if allowed {
        *curr += cost;
    }
    let est_w = weighted + u128::from(*curr) * w;
    let remaining = (u128::from(limit) * w).saturating_sub(est_w) / w;
    let to_end = w - into;
    let retry_after = if allowed {
        Duration::ZERO
    } else if cost <= limit.saturating_sub(*curr) {
        // Within this window, once the previous window's weight drops
        // enough: prev * (w - x) / w <= limit - curr - cost.
        let room = u128::from(limit - *curr - cost) * w;
        let x = w - room / u128::from(prev.max(1));
        nanos(x.saturating_sub(into).max(1)).max(Duration::from_millis(1))
    } else {
        // In the next window this window's count becomes the weighted one.
        let room = u128::from(limit - cost) * w;
        let x = w - room / u128::from((*curr).max(1));
        nanos(to_end + x).max(Duration::from_millis(1))
    };
    let reset_after = if *curr > 0 {
        nanos(to_end + w)
    } else if prev > 0 {
        nanos(to_end)
    } else {
        Duration::ZERO
    };
    Decision {
        allowed,
        remaining: remaining as u64,
        retry_after,
        reset_after,
    }
}

/// GCRA in units of nanoseconds x limit, so the emission interval
/// (window / limit) is exact. Bursts of up to `limit`.
fn gcra(tat: &mut u128, since: u128, w: u128, limit: u64, cost: u64) -> Decision {
    let l = u128::from(limit);
    let now = since * l;
    let window = w * l;
    let increment = u128::from(cost) * w;
    let new_tat = (*tat).max(now) + increment;
    let allowed = new_tat - now <= window;
    if allowed {
        *tat = new_tat;
    }
    let backlog = (*tat).max(now) - now;
    let remaining = (window - backlog.min(window)) / w;
    let retry_after = if allowed {
        Duration::ZERO
    } else {
        nanos((new_tat - now - window).div_ceil(l)).max(Duration::from_millis(1))
    };
    Decision {
        allowed,
        remaining: remaining as u64,
        retry_after,
        reset_after: nanos(backlog.div_ceil(l)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u128 = 1_000_000_000;

    #[test]
    fn every_algorithm_admits_limit_then_recovers_after_retry_after() {
        for alg in Algorithm::ALL {
            let q = Quota::new(5, Duration::from_secs(10), alg);
            let mut st = LimitState::new(&q);
            let t0 = 1000 * S + 1;
            let admitted = (0..15).filter(|_| st.check(t0, &q, 1).allowed).count();
            assert_eq!(admitted, 5, "{alg:?}");
            let d = st.check(t0, &q, 1);
            assert!(
                !d.allowed && d.retry_after > Duration::ZERO && d.remaining == 0,
                "{alg:?}"
            );
            let later = t0 + d.retry_after.as_nanos();
            assert!(st.check(later, &q, 1).allowed, "{alg:?} after retry_after");
            let round = LimitState::decode(alg, &st.encode()).unwrap();
            assert_eq!(round, st, "{alg:?} encode/decode");
            assert!(st.is_idle(later + 30 * S), "{alg:?}");
            assert!(!st.is_idle(later), "{alg:?}");
        }
    }

    #[test]
    fn a_new_quota_starts_afresh() {
        for alg in Algorithm::ALL {
            let big = Quota::new(1000, Duration::from_secs(1), alg);
            let small = Quota::new(10, Duration::from_secs(1), alg);
            let mut st = LimitState::new(&big);
            let t0 = 100 * S;
            assert!(st.check(t0, &big, 1000).allowed, "{alg:?}");
            // Long idle, then a smaller limit: admitted at once (GCRA's
            // scaled state must not lock the key out).
            let d = st.check(t0 + 10 * S, &small, 1);
            assert!(d.allowed && d.remaining == 9, "{alg:?}: {d:?}");
        }
    }

    #[test]
    fn huge_limits_and_costs_do_not_overflow() {
        for alg in Algorithm::ALL {
            let q = Quota::new(u64::MAX, Duration::from_secs(1), alg);
            let mut st = LimitState::new(&q);
            assert!(st.check(5 * S, &q, u64::MAX).allowed, "{alg:?}");
            let d = st.check(5 * S, &q, u64::MAX);
            assert!(!d.allowed && d.remaining == 0, "{alg:?}: {d:?}");
        }
    }

    #[test]
    fn corrupt_text_is_none() {
        assert!(LimitState::decode(Algorithm::FixedWindow, "x").is_none());
        assert!(LimitState::decode(Algorithm::FixedWindow, "5 10|x").is_none());
        assert!(LimitState::decode(Algorithm::SlidingWindow, "5 10|1 2").is_none());
        assert!(LimitState::decode(Algorithm::SlidingLog, "5 10|1:2,zz").is_none());
        let empty = LimitState::new(&Quota::new(
            5,
            Duration::from_nanos(10),
            Algorithm::SlidingLog,
        ));
        assert_eq!(
            LimitState::decode(Algorithm::SlidingLog, "5 10|"),
            Some(empty)
        );
    }
}
