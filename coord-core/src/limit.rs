//! The rate limiting algorithms as pure state transitions, for backends that
//! decide in the client and store the state (the in-memory backend, etcd's
//! compare-and-swap). Backends with server-side scripts (Redis, PostgreSQL)
//! implement the same arithmetic in their store's language; the conformance
//! suite holds them all to the same behaviour.
//!
//! Time is nanoseconds since an epoch of the caller's choosing (fixed
//! windows are aligned to it). All arithmetic is integer and exact.

mod gcra;
mod sliding_log;
mod sliding_window;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::time::Duration;

use crate::types::{Algorithm, Decision, Quota};
use gcra::gcra;
use sliding_log::sliding_log;
use sliding_window::sliding_window;

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
