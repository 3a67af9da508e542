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
/// limit and window it was last computed under.
///
/// **Quota changes carry the state over** (docs/guarantees.md §3): a key checked with
/// another limit or window never gets a fresh allowance, so callers with
/// different quotas on one key (a rolling configuration change) cannot
/// reset each other. Each check admits a request only if, counted the way
/// its algorithm counts, its own quota allows it:
/// - sliding log: entries are kept for the largest window the key was
///   checked with while it was busy; a check counts those within its own
///   window against its own limit;
/// - fixed window: a running window keeps counting (against the checking
///   quota's limit) until it ends, whatever the checking quota's window;
///   the next window is aligned for the quota that opens it;
/// - sliding-window counter: a new window length continues from the old
///   estimate (previous window weighted plus current), carried as the new
///   current count;
/// - GCRA: the backlog is carried over in requests owed, rescaled to the
///   new emission interval (window / limit), rounded up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitState {
    /// The limit of the last check (GCRA's TAT is scaled by it).
    limit: u64,
    /// Sliding log: how long entries are kept (the largest window seen
    /// while busy). Fixed and sliding window: the window length the index
    /// counts in. GCRA: the window of the last check.
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
    /// than the state's carries the state over (see [`LimitState`]); a
    /// different algorithm starts afresh (its state is another key).
    pub fn check(&mut self, now: u128, quota: &Quota, cost: u64) -> Decision {
        let w = quota.window.as_nanos().max(1);
        let limit = quota.limit;
        if self.algo.algorithm() != quota.algorithm {
            *self = LimitState::new(quota);
        }
        match &mut self.algo {
            Algo::SlidingLog(log) => {
                // Keep entries for the largest window in use; a key whose
                // log has emptied takes the checking quota's window.
                while log.front().is_some_and(|(t, _)| t + self.window <= now) {
                    log.pop_front();
                }
                if log.is_empty() {
                    self.window = w;
                } else {
                    self.window = self.window.max(w);
                }
                self.limit = limit;
                sliding_log(log, now, w, limit, cost)
            }
            Algo::FixedWindow { index, count } => {
                // A check whose clock is behind the running window (another
                // client's clock, a clock stepped back) counts in it: behind
                // is stricter, never a fresh window.
                let now = now.max(*index * self.window);
                // A running window keeps counting until it ends; the next
                // one is aligned for the quota that opens it.
                if *index != now / self.window {
                    self.window = w;
                    *index = now / w;
                    *count = 0;
                }
                self.limit = limit;
                let ws = self.window;
                let to_end = nanos(ws - now % ws);
                let allowed = cost <= limit.saturating_sub(*count);
                if allowed {
                    *count = count.saturating_add(cost);
                }
                Decision {
                    allowed,
                    remaining: limit.saturating_sub(*count),
                    retry_after: if allowed { Duration::ZERO } else { to_end },
                    reset_after: if *count == 0 { Duration::ZERO } else { to_end },
                }
            }
            Algo::SlidingWindow { index, curr, prev } => {
                let ws = self.window;
                // Behind the current window: counted in it (as above).
                let now = now.max(*index * ws);
                let cur = now / ws;
                if *index != cur {
                    *prev = if cur == *index + 1 { *curr } else { 0 };
                    *curr = 0;
                    *index = cur;
                }
                if ws != w {
                    // Carry the old estimate (rounded up) into the new
                    // window length as its current count.
                    let into = now % ws;
                    let est = (u128::from(*prev) * (ws - into)).div_ceil(ws) + u128::from(*curr);
                    *index = now / w;
                    *curr = est.min(u128::from(u64::MAX)) as u64;
                    *prev = 0;
                    self.window = w;
                }
                self.limit = limit;
                sliding_window(curr, *prev, now % w, w, limit, cost)
            }
            Algo::Gcra { tat } => {
                if self.limit != limit || self.window != w {
                    // Carry the backlog over in requests owed: scaled units
                    // are ns x limit, one request is `window` of them.
                    let (l_old, w_old) = (u128::from(self.limit), self.window);
                    let backlog = tat.saturating_sub(now * l_old);
                    let rescaled = (backlog / w_old) * w + ((backlog % w_old) * w).div_ceil(w_old);
                    *tat = now * u128::from(limit) + rescaled;
                    self.limit = limit;
                    self.window = w;
                }
                gcra(tat, now, w, limit, cost)
            }
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

/// Exact sliding log of (time, cost) entries, one per admitted request
/// (so time and memory grow with the number of requests, never with their
/// cost). The caller has dropped the entries past the retention window;
/// those older than `w` are kept (a larger quota may still count them) but
/// not counted here.
fn sliding_log(
    log: &mut VecDeque<(u128, u64)>,
    now: u128,
    w: u128,
    limit: u64,
    cost: u64,
) -> Decision {
    let first = log.len() - log.iter().rev().take_while(|(t, _)| t + w > now).count();
    // Every entry was admitted within a limit, so the sum fits; saturate
    // anyway rather than trust it.
    let used: u64 = log
        .range(first..)
        .fold(0u64, |a, (_, c)| a.saturating_add(*c));
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
    let mut freed = 0u64;
    let mut retry_after = nanos(w);
    for (t, c) in log.range(first..) {
        freed = freed.saturating_add(*c);
        if cost <= limit.saturating_sub(used.saturating_sub(freed)) {
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
    fn an_idle_key_takes_a_new_quota_at_once() {
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
    fn alternating_quotas_never_reset_each_other() {
        for alg in Algorithm::ALL {
            let a = Quota::new(10, Duration::from_secs(600), alg);
            let b = Quota::new(11, Duration::from_secs(600), alg);
            let mut st = LimitState::new(&a);
            let t0 = 1000 * S + 7;
            let admitted = (0..1000u128)
                .filter(|i| {
                    let q = if i % 2 == 0 { &a } else { &b };
                    st.check(t0 + i * 1_000_000, q, 1).allowed
                })
                .count();
            assert!(admitted <= 11, "{alg:?}: {admitted} admitted");
            assert!(admitted >= 10, "{alg:?}: {admitted} admitted");
        }
    }

    #[test]
    fn a_lowered_limit_counts_what_was_admitted() {
        for alg in Algorithm::ALL {
            let big = Quota::new(20, Duration::from_secs(600), alg);
            let small = Quota::new(10, Duration::from_secs(600), alg);
            let mut st = LimitState::new(&big);
            let t0 = 1000 * S + 7;
            for i in 0..15 {
                assert!(st.check(t0 + i, &big, 1).allowed, "{alg:?}");
            }
            let d = st.check(t0 + 20, &small, 1);
            assert!(!d.allowed && d.remaining == 0, "{alg:?}: {d:?}");
            // And the larger quota still sees its 15.
            let admitted = (0..10)
                .filter(|i| st.check(t0 + 30 + i, &big, 1).allowed)
                .count();
            assert_eq!(admitted, 5, "{alg:?}");
        }
    }

    #[test]
    fn a_changed_window_carries_the_count() {
        for alg in Algorithm::ALL {
            let long = Quota::new(10, Duration::from_secs(600), alg);
            let short = Quota::new(10, Duration::from_secs(60), alg);
            let mut st = LimitState::new(&long);
            let t0 = 6000 * S + 7;
            for i in 0..10 {
                assert!(st.check(t0 + i, &long, 1).allowed, "{alg:?}");
            }
            // Alternating windows with the same limit: nothing more within
            // the short window of the burst.
            let extra = (0..100u128)
                .filter(|i| {
                    let q = if i % 2 == 0 { &short } else { &long };
                    st.check(t0 + 100 + i, q, 1).allowed
                })
                .count();
            assert_eq!(extra, 0, "{alg:?}");
        }
    }

    #[test]
    fn a_sliding_log_keeps_entries_for_the_largest_window() {
        let long = Quota::new(10, Duration::from_secs(600), Algorithm::SlidingLog);
        let short = Quota::new(10, Duration::from_secs(60), Algorithm::SlidingLog);
        let mut st = LimitState::new(&long);
        let t0 = 6000 * S;
        for i in 0..10 {
            assert!(st.check(t0 + i, &long, 1).allowed);
        }
        // Past the short window: the short quota admits afresh...
        let t1 = t0 + 61 * S;
        assert!(st.check(t1, &short, 1).allowed);
        // ...but the long quota still counts the first ten.
        assert!(!st.check(t1 + 1, &long, 1).allowed);
        let round = LimitState::decode(Algorithm::SlidingLog, &st.encode()).unwrap();
        assert_eq!(round, st);
    }

    #[test]
    fn a_sliding_window_carries_its_weighted_estimate_into_a_new_window() {
        let long = Quota::new(10, Duration::from_secs(600), Algorithm::SlidingWindow);
        let short = Quota::new(10, Duration::from_secs(60), Algorithm::SlidingWindow);
        let mut st = LimitState::new(&long);
        let w = 600 * S;
        let k = 7;
        for i in 0..10 {
            assert!(st.check(k * w + 500 * S + i, &long, 1).allowed);
        }
        // 60 s into the next long window: the estimate is 10 x 540/600 = 9,
        // carried as the short window's count: one more fits, then none.
        let t = (k + 1) * w + 60 * S;
        let admitted = (0..5)
            .filter(|i| st.check(t + i, &short, 1).allowed)
            .count();
        assert_eq!(admitted, 1);
        // 61 s later the short window has moved on: its previous window (the
        // carried 10) weighs (60 - 1) / 60, so nothing fits yet...
        assert!(!st.check(t + 61 * S, &short, 1).allowed);
        // ...and a full short window later everything has aged out.
        let later = t + 200 * S;
        let admitted = (0..12)
            .filter(|i| st.check(later + i, &short, 1).allowed)
            .count();
        assert_eq!(admitted, 10);
    }

    #[test]
    fn a_raised_limit_counts_what_was_admitted() {
        for alg in Algorithm::ALL {
            let small = Quota::new(10, Duration::from_secs(600), alg);
            let big = Quota::new(20, Duration::from_secs(600), alg);
            let mut st = LimitState::new(&small);
            let t0 = 6000 * S + 7;
            for i in 0..10 {
                assert!(st.check(t0 + i, &small, 1).allowed, "{alg:?}");
            }
            let more = (0..30)
                .filter(|i| st.check(t0 + 20 + i, &big, 1).allowed)
                .count();
            assert_eq!(more, 10, "{alg:?}: the raised limit forgot the first 10");
        }
    }

    #[test]
    fn admissions_report_a_reset_time() {
        for alg in Algorithm::ALL {
            let q = Quota::new(5, Duration::from_secs(10), alg);
            let mut st = LimitState::new(&q);
            let d = st.check(1000 * S + 1, &q, 1);
            assert!(
                d.allowed && d.reset_after > Duration::ZERO,
                "{alg:?}: {d:?}"
            );
            assert!(d.reset_after <= Duration::from_secs(20), "{alg:?}: {d:?}");
        }
    }

    #[test]
    fn a_sliding_window_decays_the_previous_window_and_stays_busy_through_it() {
        let q = Quota::new(10, Duration::from_secs(60), Algorithm::SlidingWindow);
        let w = 60 * S;
        let k = 100;
        let mut st = LimitState::new(&q);
        for i in 0..10 {
            assert!(st.check(k * w + 50 * S + i, &q, 1).allowed);
        }
        // The previous window still counts in the next one: not idle.
        assert!(!st.is_idle((k + 1) * w + S));
        // 7 s in: 10 x 53/60 = 8.83 weighs, one fits.
        let t = (k + 1) * w + 7 * S;
        assert_eq!((0..5).filter(|i| st.check(t + i, &q, 1).allowed).count(), 1);
        // The next fits once 10 x (60 - x)/60 <= 10 - 1 - 1, at x = 12 s.
        let d = st.check(t + 10, &q, 1);
        assert!(!d.allowed);
        let want = Duration::from_secs(5) - Duration::from_nanos(10);
        assert_eq!(d.retry_after, want, "{d:?}");
        assert!(!st.check(t + 5 * S - 1_000_000, &q, 1).allowed);
        assert!(st.check(t + 5 * S, &q, 1).allowed);
        // 30 s in: 10 x 30/60 = 5 weighs, plus the 2: three more fit.
        let t = (k + 1) * w + 30 * S;
        assert_eq!((0..8).filter(|i| st.check(t + i, &q, 1).allowed).count(), 3);
        assert!(st.is_idle((k + 3) * w));
    }

    #[test]
    fn a_sliding_log_entry_ages_out_exactly_one_window_later() {
        let q = Quota::new(5, Duration::from_secs(10), Algorithm::SlidingLog);
        let mut st = LimitState::new(&q);
        let t0 = 1000 * S;
        for _ in 0..5 {
            assert!(st.check(t0, &q, 1).allowed);
        }
        assert!(!st.check(t0 + 10 * S - 1, &q, 1).allowed);
        assert!(!st.is_idle(t0 + 10 * S - 1));
        assert!(st.is_idle(t0 + 10 * S));
        assert!(
            st.check(t0 + 10 * S, &q, 1).allowed,
            "an entry exactly one window old still counted"
        );
    }

    #[test]
    fn a_denied_sliding_log_check_says_exactly_when_to_retry() {
        let q = Quota::new(5, Duration::from_secs(10), Algorithm::SlidingLog);
        let mut st = LimitState::new(&q);
        let t0 = 1000 * S;
        assert!(st.check(t0, &q, 3).allowed);
        assert!(st.check(t0 + S, &q, 2).allowed);
        // Cost 3 fits once the first entry (3) ages out at t0 + 10 s; cost
        // 1 too; the whole log is gone at t0 + 11 s.
        let d = st.check(t0 + 2 * S, &q, 3);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_secs(8));
        assert_eq!(d.reset_after, Duration::from_secs(9));
        assert_eq!(d.remaining, 0);
        let d = st.check(t0 + 2 * S, &q, 1);
        assert_eq!(d.retry_after, Duration::from_secs(8));
    }

    #[test]
    fn exact_decisions_at_the_edges() {
        let w = 60 * S;
        let k = 100;
        // Sliding window, full in this window: the next fits 6 s into the
        // next window (10 x (60 - x)/60 <= 9), the state resets in 110 s.
        let q = Quota::new(10, Duration::from_secs(60), Algorithm::SlidingWindow);
        let mut st = LimitState::new(&q);
        for i in 0..10 {
            assert!(st.check(k * w + 10 * S + i, &q, 1).allowed);
        }
        let d = st.check(k * w + 10 * S + 10, &q, 1);
        assert!(!d.allowed);
        assert_eq!(
            d.retry_after,
            Duration::from_secs(56) - Duration::from_nanos(10)
        );
        assert_eq!(
            d.reset_after,
            Duration::from_secs(110) - Duration::from_nanos(10)
        );
        // Fixed window: retry and reset at the window's end.
        let q = Quota::new(2, Duration::from_secs(60), Algorithm::FixedWindow);
        let mut st = LimitState::new(&q);
        let t = k * w + 15 * S;
        assert_eq!(st.check(t, &q, 1).remaining, 1);
        assert!(st.check(t, &q, 1).allowed);
        let d = st.check(t, &q, 1);
        assert!(!d.allowed);
        assert_eq!(
            (d.retry_after, d.reset_after),
            (Duration::from_secs(45), Duration::from_secs(45))
        );
        // Every algorithm counts `remaining` down by the cost.
        for alg in Algorithm::ALL {
            let q = Quota::new(5, Duration::from_secs(10), alg);
            let mut st = LimitState::new(&q);
            assert_eq!(st.check(k * w + 1, &q, 2).remaining, 3, "{alg:?}");
            assert_eq!(st.check(k * w + 2, &q, 1).remaining, 2, "{alg:?}");
        }
        // GCRA, full: the next request fits one emission interval later.
        let q = Quota::new(10, Duration::from_secs(600), Algorithm::Gcra);
        let mut st = LimitState::new(&q);
        let t = k * w;
        for _ in 0..10 {
            assert!(st.check(t, &q, 1).allowed);
        }
        let d = st.check(t, &q, 1);
        assert_eq!((d.allowed, d.retry_after), (false, Duration::from_secs(60)));
        assert_eq!(d.reset_after, Duration::from_secs(600));
        // Sliding window with only the previous window counting: it resets
        // at this window's end.
        let q = Quota::new(10, Duration::from_secs(60), Algorithm::SlidingWindow);
        let mut st = LimitState::new(&q);
        for _ in 0..10 {
            assert!(st.check(k * w + 50 * S, &q, 1).allowed);
        }
        let d = st.check((k + 1) * w + S, &q, 1);
        assert!(!d.allowed);
        assert_eq!(d.reset_after, Duration::from_secs(59));
    }

    #[test]
    fn a_sliding_log_counts_only_its_own_window_of_a_longer_retention() {
        let long = Quota::new(10, Duration::from_secs(20), Algorithm::SlidingLog);
        let short = Quota::new(5, Duration::from_secs(10), Algorithm::SlidingLog);
        let mut st = LimitState::new(&long);
        let t0 = 1000 * S;
        for _ in 0..5 {
            assert!(st.check(t0, &long, 1).allowed);
        }
        // Exactly one short window later the five are out of it (but kept
        // for the long quota).
        assert!(st.check(t0 + 10 * S, &short, 1).allowed);
        assert!(!st.check(t0 + 10 * S, &long, 5).allowed);
    }

    #[test]
    fn a_sliding_log_drops_entries_past_its_retention() {
        let q = Quota::new(3, Duration::from_secs(1), Algorithm::SlidingLog);
        let mut st = LimitState::new(&q);
        for i in 0..1000u128 {
            st.check(1000 * S + i * S, &q, 1);
        }
        assert!(st.encode().len() < 100, "{}", st.encode());
    }

    #[test]
    fn gcra_rescales_its_backlog_to_a_new_window() {
        let long = Quota::new(10, Duration::from_secs(600), Algorithm::Gcra);
        let short = Quota::new(10, Duration::from_secs(60), Algorithm::Gcra);
        let mut st = LimitState::new(&long);
        let t0 = 6000 * S;
        for i in 0..10 {
            assert!(st.check(t0 + i, &long, 1).allowed);
        }
        // 61 s later 539 s of the 600 s backlog are owed: 8.98 requests, at
        // 6 s each under the short quota: one more fits, then none.
        let t = t0 + 61 * S;
        assert!(st.check(t, &short, 1).allowed);
        assert!(!st.check(t + 1, &short, 1).allowed);
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

    /// Property tests: random histories of checks (clock steps of zero,
    /// a fraction of a window, a few windows and many windows; limits and
    /// windows changing between checks) held to the rules in the module
    /// docs and `docs/guarantees.md`.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        const MS: u128 = 1_000_000;
        /// The window lengths quotas are drawn from (ms).
        const WINDOWS_MS: [u64; 3] = [10, 25, 60];
        const MAX_LIMIT: u64 = 6;

        /// One check: how far the clock moves before it (ns), then the
        /// quota's limit, window (ms) and the request's cost.
        #[derive(Debug, Clone, Copy)]
        struct Step {
            advance: u128,
            limit: u64,
            window_ms: u64,
            cost: u64,
        }

        impl Step {
            fn quota(&self, algorithm: Algorithm) -> Quota {
                Quota::new(self.limit, Duration::from_millis(self.window_ms), algorithm)
            }
        }

        /// Clock steps: none (checks at one instant), under 2 ms, up to
        /// about a window, and jumps of up to 100 windows.
        fn advance() -> impl Strategy<Value = u128> {
            prop_oneof![
                3 => Just(0u128),
                3 => 0..2 * MS,
                2 => 0..70 * MS,
                1 => 0..6000 * MS,
            ]
        }

        /// Checks whose limit and window are drawn per check from
        /// `limits` and `windows` (ms), cost at most the limit.
        fn steps(
            limits: std::ops::RangeInclusive<u64>,
            windows: Vec<u64>,
        ) -> impl Strategy<Value = Vec<Step>> {
            let step = (
                advance(),
                limits,
                prop::sample::select(windows),
                1..=MAX_LIMIT,
            )
                .prop_map(|(advance, limit, window_ms, cost)| Step {
                    advance,
                    limit,
                    window_ms,
                    cost: cost.min(limit),
                });
            prop::collection::vec(step, 1..60)
        }

        fn algorithm() -> impl Strategy<Value = Algorithm> {
            prop::sample::select(Algorithm::ALL.to_vec())
        }

        /// The epoch offset of the first check (not aligned to any window).
        fn start() -> impl Strategy<Value = u128> {
            0..1_000_000 * MS
        }

        /// One admitted request: when, its cost, the quota it was checked
        /// with.
        struct Admitted {
            at: u128,
            cost: u64,
            quota: Quota,
        }

        /// Run `steps` on a fresh state from `t0`, checking that the state
        /// survives encode and decode after each; the decisions with their
        /// times, and the admitted requests.
        fn run(
            algorithm: Algorithm,
            t0: u128,
            steps: &[Step],
        ) -> (LimitState, Vec<(u128, Step, Decision)>, Vec<Admitted>) {
            let mut st = LimitState::new(&steps[0].quota(algorithm));
            let (mut now, mut log, mut admitted) = (t0, Vec::new(), Vec::new());
            for step in steps {
                now += step.advance;
                let quota = step.quota(algorithm);
                let d = st.check(now, &quota, step.cost);
                assert_eq!(
                    LimitState::decode(algorithm, &st.encode()),
                    Some(st.clone())
                );
                if d.allowed {
                    admitted.push(Admitted {
                        at: now,
                        cost: step.cost,
                        quota,
                    });
                }
                log.push((now, *step, d));
            }
            (st, log, admitted)
        }

        fn cost_in(admitted: &[Admitted], from: u128, to: u128) -> u64 {
            admitted
                .iter()
                .filter(|a| a.at >= from && a.at <= to)
                .map(|a| a.cost)
                .sum()
        }

        proptest! {
            /// Sliding log, one quota: a request is admitted exactly when
            /// it fits with the cost admitted in the trailing window, so no
            /// window ever holds more than `limit`; `remaining` is what is
            /// left of it.
            #[test]
            fn sliding_log_never_admits_more_than_the_limit_in_any_window(
                t0 in start(),
                limit in 1..=MAX_LIMIT,
                window_ms in prop::sample::select(WINDOWS_MS.to_vec()),
                steps in steps(1..=MAX_LIMIT, WINDOWS_MS.to_vec()),
            ) {
                check::sliding_log_never_admits_more_than_the_limit_in_any_window(
                    t0, limit, window_ms, steps,
                )?;
            }

            /// Fixed and sliding window with one window length and limits
            /// changing between checks: each check decides on its own limit
            /// by the counts of the epoch-aligned windows, exactly (fixed:
            /// this window's count; sliding: the previous window's count
            /// weighted by its overlap with the trailing window, plus this
            /// window's), so no aligned window admits more than the limit of
            /// any check admitted in it.
            #[test]
            fn window_counters_decide_by_the_aligned_windows_whatever_the_limit(
                sliding in any::<bool>(),
                t0 in start(),
                window_ms in prop::sample::select(WINDOWS_MS.to_vec()),
                steps in steps(1..=MAX_LIMIT, WINDOWS_MS.to_vec()),
            ) {
                check::window_counters_decide_by_the_aligned_windows_whatever_the_limit(
                    sliding, t0, window_ms, steps,
                )?;
            }

            /// Quotas changing (limits and windows) never grant a fresh
            /// allowance: for every admitted request, the cost admitted
            /// since any earlier admission, while no window of any quota in
            /// use ended (for the sliding log: within the shortest window),
            /// is within the checking quota's limit; GCRA admits at most
            /// its limit plus what the fastest quota's rate frees in that
            /// time.
            #[test]
            fn quota_changes_grant_no_fresh_allowance(
                algorithm in algorithm(),
                t0 in start(),
                steps in steps(1..=MAX_LIMIT, WINDOWS_MS.to_vec()),
            ) {
                check::quota_changes_grant_no_fresh_allowance(algorithm, t0, steps)?;
            }

            /// Sliding log, windows changing: entries are kept for the
            /// largest window the key was checked with while they were in
            /// it, and a check counts every kept entry within its own
            /// window. An admitted request at `t` with window `w` is within
            /// its limit together with every earlier admission less than
            /// `w` before it that no check since could have dropped (none
            /// came a full window after it, by the largest window checked
            /// between the two).
            #[test]
            fn a_sliding_log_counts_what_it_keeps_for_the_largest_window(
                t0 in start(),
                steps in steps(1..=MAX_LIMIT, WINDOWS_MS.to_vec()),
            ) {
                check::a_sliding_log_counts_what_it_keeps_for_the_largest_window(t0, steps)?;
            }

            /// A denied check says when the same request fits: retried
            /// `retry_after` later (nothing else checked meanwhile) it is
            /// admitted, and 1 ns sooner it is not (unless `retry_after`
            /// is 1 ms, the floor of the algorithms other than the fixed
            /// window). Quotas change along the way.
            #[test]
            fn a_denied_request_fits_exactly_at_retry_after(
                algorithm in algorithm(),
                t0 in start(),
                steps in steps(1..=MAX_LIMIT, WINDOWS_MS.to_vec()),
            ) {
                check::a_denied_request_fits_exactly_at_retry_after(algorithm, t0, steps)?;
            }

            /// Clock steps back (another client's clock behind, a stepped
            /// clock): a check behind the latest time the state has seen is
            /// never admitted where the same check at that latest time would
            /// be refused, for every algorithm, quotas changing along the
            /// way.
            #[test]
            fn a_check_behind_the_state_clock_is_no_more_lenient(
                algorithm in algorithm(),
                t0 in 1_000 * MS..1_000_000 * MS,
                steps in steps(1..=MAX_LIMIT, WINDOWS_MS.to_vec()),
                backs in prop::collection::vec(prop_oneof![2 => Just(0u128), 1 => 0..70 * MS], 60),
            ) {
                check::a_check_behind_the_state_clock_is_no_more_lenient(algorithm, t0, steps, backs)?;
            }

            /// A state is idle once the largest window (times the largest
            /// ratio of limits, for GCRA's backlog) has passed since its
            /// last check, and an idle state decides as a fresh one.
            #[test]
            fn an_idle_state_decides_as_a_fresh_one(
                algorithm in algorithm(),
                t0 in start(),
                steps in steps(1..=MAX_LIMIT, WINDOWS_MS.to_vec()),
                gap in 0..7_000 * MS,
                next in (1..=MAX_LIMIT, prop::sample::select(WINDOWS_MS.to_vec()), 1..=MAX_LIMIT),
            ) {
                check::an_idle_state_decides_as_a_fresh_one(algorithm, t0, steps, gap, next)?;
            }
        }

        /// The properties, as functions (rustfmt formats them; the
        /// `proptest!` block above only draws their inputs).
        mod check {
            use super::*;

            pub(super) fn sliding_log_never_admits_more_than_the_limit_in_any_window(
                t0: u128,
                limit: u64,
                window_ms: u64,
                steps: Vec<Step>,
            ) -> Result<(), TestCaseError> {
                let w = u128::from(window_ms) * MS;
                let steps: Vec<Step> = steps
                    .into_iter()
                    .map(|s| Step {
                        limit,
                        window_ms,
                        cost: s.cost.min(limit),
                        ..s
                    })
                    .collect();
                let (_, log, admitted) = run(Algorithm::SlidingLog, t0, &steps);
                let mut before: Vec<Admitted> = Vec::new();
                for (now, step, d) in log {
                    let used: u64 = before
                        .iter()
                        .filter(|a| a.at + w > now)
                        .map(|a| a.cost)
                        .sum();
                    prop_assert_eq!(
                        d.allowed,
                        used + step.cost <= limit,
                        "used {} at {}",
                        used,
                        now
                    );
                    let left = if d.allowed {
                        limit - used - step.cost
                    } else {
                        limit - used
                    };
                    prop_assert_eq!(d.remaining, left);
                    if d.allowed {
                        before.push(Admitted {
                            at: now,
                            cost: step.cost,
                            quota: step.quota(Algorithm::SlidingLog),
                        });
                    }
                }
                for a in &admitted {
                    let in_window = cost_in(&admitted, (a.at + 1).saturating_sub(w), a.at);
                    prop_assert!(
                        in_window <= limit,
                        "{} admitted in the window ending at {}",
                        in_window,
                        a.at
                    );
                }
                Ok(())
            }

            pub(super) fn window_counters_decide_by_the_aligned_windows_whatever_the_limit(
                sliding: bool,
                t0: u128,
                window_ms: u64,
                steps: Vec<Step>,
            ) -> Result<(), TestCaseError> {
                let algorithm = if sliding {
                    Algorithm::SlidingWindow
                } else {
                    Algorithm::FixedWindow
                };
                let w = u128::from(window_ms) * MS;
                let steps: Vec<Step> = steps.into_iter().map(|s| Step { window_ms, ..s }).collect();
                let (_, log, _) = run(algorithm, t0, &steps);
                let mut before: Vec<(u128, u64)> = Vec::new();
                for (now, step, d) in log {
                    let index = now / w;
                    let count = |i: u128| -> u128 {
                        before
                            .iter()
                            .filter(|(t, _)| t / w == i)
                            .map(|(_, c)| u128::from(*c))
                            .sum()
                    };
                    let (curr, limit, cost) =
                        (count(index), u128::from(step.limit), u128::from(step.cost));
                    let fits = if sliding {
                        let prev = if index > 0 { count(index - 1) } else { 0 };
                        prev * (w - now % w) + (curr + cost) * w <= limit * w
                    } else {
                        curr + cost <= limit
                    };
                    prop_assert_eq!(
                        d.allowed,
                        fits,
                        "{:?} at {} (window {}), {} in it",
                        step,
                        now,
                        index,
                        curr
                    );
                    if d.allowed {
                        prop_assert!(curr + cost <= limit);
                        before.push((now, step.cost));
                    }
                }
                Ok(())
            }

            pub(super) fn quota_changes_grant_no_fresh_allowance(
                algorithm: Algorithm,
                t0: u128,
                steps: Vec<Step>,
            ) -> Result<(), TestCaseError> {
                let (_, _, admitted) = run(algorithm, t0, &steps);
                let shortest = u128::from(WINDOWS_MS[0]) * MS;
                let unbroken = |from: u128, to: u128| match algorithm {
                    Algorithm::SlidingLog => to - from < shortest,
                    Algorithm::FixedWindow | Algorithm::SlidingWindow => WINDOWS_MS
                        .iter()
                        .all(|ms| from / (u128::from(*ms) * MS) == to / (u128::from(*ms) * MS)),
                    Algorithm::Gcra => true,
                };
                for (j, a) in admitted.iter().enumerate() {
                    for earlier in &admitted[..=j] {
                        if !unbroken(earlier.at, a.at) {
                            continue;
                        }
                        let sum = u128::from(cost_in(&admitted[..=j], earlier.at, a.at));
                        let limit = u128::from(a.quota.limit);
                        let bound = match algorithm {
                            // Freed at the fastest rate, MAX_LIMIT per shortest window.
                            Algorithm::Gcra => {
                                limit * shortest + u128::from(MAX_LIMIT) * (a.at - earlier.at)
                            }
                            _ => limit * shortest,
                        };
                        prop_assert!(
                            sum * shortest <= bound,
                            "{:?}: {} admitted from {} to {}, checked with {:?}",
                            algorithm,
                            sum,
                            earlier.at,
                            a.at,
                            a.quota
                        );
                    }
                }
                Ok(())
            }

            pub(super) fn a_sliding_log_counts_what_it_keeps_for_the_largest_window(
                t0: u128,
                steps: Vec<Step>,
            ) -> Result<(), TestCaseError> {
                let (_, log, _) = run(Algorithm::SlidingLog, t0, &steps);
                let ns = |s: &Step| u128::from(s.window_ms) * MS;
                let kept = |i: usize, j: usize| {
                    let (t_i, step_i, _) = &log[i];
                    let mut longest = ns(step_i);
                    for (t_k, step_k, _) in &log[i + 1..=j] {
                        if t_k - t_i >= longest {
                            return false;
                        }
                        longest = longest.max(ns(step_k));
                    }
                    true
                };
                for (j, (t_j, step_j, d)) in log.iter().enumerate() {
                    if !d.allowed {
                        continue;
                    }
                    let counted: u64 = (0..j)
                        .filter(|&i| log[i].2.allowed && t_j - log[i].0 < ns(step_j) && kept(i, j))
                        .map(|i| log[i].1.cost)
                        .sum();
                    prop_assert!(
                        counted + step_j.cost <= step_j.limit,
                        "{:?} admitted at {} over {} kept in its window",
                        step_j,
                        t_j,
                        counted
                    );
                }
                Ok(())
            }

            pub(super) fn a_denied_request_fits_exactly_at_retry_after(
                algorithm: Algorithm,
                t0: u128,
                steps: Vec<Step>,
            ) -> Result<(), TestCaseError> {
                let mut st = LimitState::new(&steps[0].quota(algorithm));
                let mut now = t0;
                for step in &steps {
                    now += step.advance;
                    let quota = step.quota(algorithm);
                    let d = st.check(now, &quota, step.cost);
                    if d.allowed {
                        prop_assert_eq!(d.retry_after, Duration::ZERO);
                        continue;
                    }
                    let r = d.retry_after.as_nanos();
                    prop_assert!(r > 0, "{:?}", d);
                    let at = st.clone().check(now + r, &quota, step.cost);
                    prop_assert!(
                        at.allowed,
                        "{:?} denied at {} + retry_after {:?}",
                        step,
                        now,
                        d.retry_after
                    );
                    if r > 1 && r != MS {
                        let sooner = st.clone().check(now + r - 1, &quota, step.cost);
                        prop_assert!(
                            !sooner.allowed,
                            "{:?} admitted 1 ns before retry_after {:?}",
                            step,
                            d.retry_after
                        );
                    }
                }
                Ok(())
            }

            pub(super) fn a_check_behind_the_state_clock_is_no_more_lenient(
                algorithm: Algorithm,
                t0: u128,
                steps: Vec<Step>,
                backs: Vec<u128>,
            ) -> Result<(), TestCaseError> {
                let mut st = LimitState::new(&steps[0].quota(algorithm));
                let mut latest = t0;
                for (step, back) in steps.iter().zip(backs) {
                    latest += step.advance;
                    let now = latest - back;
                    let quota = step.quota(algorithm);
                    let at_latest = st.clone().check(latest, &quota, step.cost);
                    let d = st.check(now, &quota, step.cost);
                    prop_assert!(
                        !d.allowed || at_latest.allowed,
                        "{:?} admitted {} ns behind the state's clock, refused at it",
                        step,
                        back
                    );
                }
                Ok(())
            }

            pub(super) fn an_idle_state_decides_as_a_fresh_one(
                algorithm: Algorithm,
                t0: u128,
                steps: Vec<Step>,
                gap: u128,
                next: (u64, u64, u64),
            ) -> Result<(), TestCaseError> {
                let (st, log, _) = run(algorithm, t0, &steps);
                let last = log.last().unwrap().0;
                let longest = u128::from(WINDOWS_MS[2]) * MS;
                prop_assert!(st.is_idle(last + (u128::from(MAX_LIMIT) + 2) * longest));
                let (limit, window_ms, cost) = next;
                let quota = Quota::new(limit, Duration::from_millis(window_ms), algorithm);
                let t = last + gap;
                if st.is_idle(t) {
                    let cost = cost.min(limit);
                    let fresh = LimitState::new(&quota).check(t, &quota, cost);
                    prop_assert_eq!(st.clone().check(t, &quota, cost), fresh);
                }
                Ok(())
            }
        }
    }
}
