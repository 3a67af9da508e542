//! The limiter workload and its checker (docs/guarantees.md §4 "Limiter", §7
//! "admissions never exceed the quota").
//!
//! Clients check one key against one quota over and over; each answered
//! check is recorded as a [`Check`] (sent, answered, the decision). **Only
//! admissions reported to a caller are counted.** A check that failed with
//! an error (a timeout, a reset connection, a lost reply) may have been
//! counted by the store all the same: that is quota spent, not reported,
//! which is allowed (the store errs on the side of admitting less). What
//! must never happen is more reported admissions than the quota allows.
//!
//! The checker knows the store's clock only through the client's: a
//! check's decision was taken on the store somewhere between `asked` and
//! `replied` (one machine, one clock rate). It verifies:
//!
//! 1. **admissions within a window-long span**: any admissions whose
//!    `[asked, replied]` all lie inside one span shorter than the window
//!    number at most the limit (sliding log, exact), or twice the limit
//!    (fixed window, sliding-window counter and GCRA, whose windows a span
//!    can straddle, or whose burst follows a full window);
//! 2. fixed window only: each admission's window ends `reset_after` after
//!    its decision (the store's own alignment, unknown to the client), so
//!    admissions are grouped by that end (those whose round trip was too
//!    long to place are left to rule 1), and **admissions per fixed window
//!    ≤ limit**; **each admission spends its own unit** (no two admissions
//!    of one window report the same `remaining`); **a window is one window
//!    long** (its admissions were decided within one window's length).

use std::sync::atomic::Ordering;
use std::time::Duration;

use coord_core::{Algorithm, Coord, Quota};
use tokio::time::{Instant, sleep};

use super::report::{Report, Run, expect_retryable, longest_stall};
use super::{FaultLog, Violation};

/// The shape of a limiter workload.
#[derive(Debug, Clone, Copy)]
pub struct LimiterWorkload {
    /// The quota every client checks against (cost 1 each).
    pub quota: Quota,
    /// Another limit for the same key, window and algorithm: when set,
    /// each client alternates between `quota` and this limit from one
    /// check to the next, as clients do while a quota change rolls out.
    /// The state carries over (a change never grants a fresh allowance),
    /// so the history is judged against the larger of the two limits.
    pub changed_limit: Option<u64>,
    /// Each client's pause between checks.
    pub pace: Duration,
    /// How long the workload runs.
    pub duration: Duration,
}

/// One answered check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Check {
    /// The client.
    pub client: usize,
    /// When the check was sent.
    pub asked: Instant,
    /// When its decision came back.
    pub replied: Instant,
    /// Whether it was admitted.
    pub allowed: bool,
    /// The decision's `remaining`.
    pub remaining: u64,
    /// The decision's `reset_after`.
    pub reset_after: Duration,
}

/// Check a limiter workload's answered checks against `quota` (cost 1).
pub fn check_limiter_history(quota: &Quota, checks: &[Check]) -> Vec<Violation> {
    check_admissions(quota, None, checks)
}

/// [`check_limiter_history`] for a workload whose checks alternated
/// between `quota` and `changed_limit` (if any): admissions are judged
/// against the larger limit, and two admissions of one fixed window may
/// report the same `remaining` (each against its own limit).
pub fn check_admissions(
    quota: &Quota,
    changed_limit: Option<u64>,
    checks: &[Check],
) -> Vec<Violation> {
    let mut quota = *quota;
    quota.limit = quota.limit.max(changed_limit.unwrap_or(0));
    let quota = &quota;
    let mut v = Vec::new();
    let w = quota.window;
    let cap = match quota.algorithm {
        Algorithm::SlidingLog => quota.limit,
        _ => quota.limit * 2,
    };
    let mut admitted: Vec<&Check> = checks.iter().filter(|c| c.allowed).collect();
    admitted.sort_by_key(|c| c.asked);
    for (i, first) in admitted.iter().enumerate() {
        let span_end = first.asked + w;
        let within = admitted[i..]
            .iter()
            .take_while(|c| c.asked < span_end)
            .filter(|c| c.replied < span_end)
            .count() as u64;
        if within > cap {
            v.push(Violation {
                rule: "admissions within a window-long span",
                detail: format!(
                    "{within} admissions decided within {w:?} from {:?} (at most {cap})",
                    first.asked
                ),
            });
            break;
        }
    }
    if quota.algorithm == Algorithm::FixedWindow {
        // Place each admission by its window's end, midway in its round trip.
        let mut placed: Vec<(Instant, &Check)> = admitted
            .iter()
            .filter(|c| c.replied - c.asked < w / 4)
            .map(|c| (c.asked + c.reset_after + (c.replied - c.asked) / 2, *c))
            .collect();
        placed.sort_by_key(|(end, _)| *end);
        let mut groups: Vec<Vec<&Check>> = Vec::new();
        let mut start: Option<Instant> = None;
        for (end, c) in placed {
            match start {
                Some(s) if end - s < w / 2 => groups.last_mut().expect("open").push(c),
                _ => {
                    start = Some(end);
                    groups.push(vec![c]);
                }
            }
        }
        for g in groups {
            let from = g.iter().map(|c| c.replied).min().expect("non-empty");
            let to = g.iter().map(|c| c.asked).max().expect("non-empty");
            if g.len() as u64 > quota.limit {
                v.push(Violation {
                    rule: "admissions per fixed window",
                    detail: format!(
                        "{} admissions in the window of the one decided at {from:?} (limit {})",
                        g.len(),
                        quota.limit
                    ),
                });
            }
            let mut left: Vec<u64> = g.iter().map(|c| c.remaining).collect();
            left.sort_unstable();
            let same = left.windows(2).find(|p| p[0] == p[1]);
            if let (Some(r), None) = (same, changed_limit) {
                v.push(Violation {
                    rule: "each admission spends its own unit",
                    detail: format!(
                        "two admissions of the window decided at {from:?} both left {} remaining",
                        r[0]
                    ),
                });
            }
            if to.saturating_duration_since(from) >= w {
                v.push(Violation {
                    rule: "a window is one window long",
                    detail: format!(
                        "admissions decided {:?} apart report the same window end",
                        to - from
                    ),
                });
            }
        }
    }
    v
}

/// Run a limiter workload on `key`: each of `clients` checks it against
/// `w.quota` every `w.pace` while `faults` runs; then check the history.
/// `ops` counts the admissions reported.
pub async fn run_limiter_workload<F>(
    clients: Vec<Coord>,
    key: &str,
    w: LimiterWorkload,
    faults: F,
) -> (Report, FaultLog)
where
    F: std::future::Future<Output = FaultLog>,
{
    let run = Run::new();
    let mut tasks = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        let (stop, key) = (run.stop.clone(), key.to_string());
        tasks.push(tokio::spawn(async move {
            let limiter = c.limiter().expect("limiter");
            let (mut checks, mut errors) = (Vec::new(), 0usize);
            let mut k = i;
            while !stop.load(Ordering::SeqCst) {
                let quota = match w.changed_limit {
                    Some(limit) if k % 2 == 1 => Quota { limit, ..w.quota },
                    _ => w.quota,
                };
                k += 1;
                let asked = Instant::now();
                match limiter.check(&key, quota).await {
                    Ok(d) => checks.push(Check {
                        client: i,
                        asked,
                        replied: Instant::now(),
                        allowed: d.allowed,
                        remaining: d.remaining,
                        reset_after: d.reset_after,
                    }),
                    Err(e) => {
                        expect_retryable("limiter client", &e);
                        errors += 1;
                    }
                }
                sleep(w.pace).await;
            }
            (checks, errors)
        }));
    }
    let join = Duration::from_secs(30);
    let (results, log, end) = run.finish(tasks, faults, w.duration, join).await;
    let (mut checks, mut errors) = (Vec::new(), 0);
    for (c, e) in results {
        checks.extend(c);
        errors += e;
    }
    let violations = check_admissions(&w.quota, w.changed_limit, &checks);
    let progress: Vec<Instant> = checks
        .iter()
        .filter(|c| c.allowed)
        .map(|c| c.replied)
        .collect();
    let report = Report {
        ops: progress.len(),
        errors,
        violations,
        longest_stall: longest_stall(&progress, log.healed.unwrap_or(run.start), end),
        waived: 0,
        extra: vec![
            ("checks", checks.len() as u64),
            ("limit", w.quota.limit),
            ("changed_limit", w.changed_limit.unwrap_or(0)),
            ("window_ms", w.quota.window.as_millis() as u64),
        ],
        progress,
    };
    (report, log)
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_millis(1000);

    fn adm(b: Instant, asked: u64, rtt: u64, remaining: u64, reset: u64) -> Check {
        Check {
            client: 0,
            asked: b + Duration::from_millis(asked),
            replied: b + Duration::from_millis(asked + rtt),
            allowed: true,
            remaining,
            reset_after: Duration::from_millis(reset),
        }
    }

    fn rules(q: Quota, c: &[Check]) -> Vec<&'static str> {
        check_limiter_history(&q, c)
            .iter()
            .map(|v| v.rule)
            .collect()
    }

    #[test]
    fn a_clean_history_passes() {
        let b = Instant::now();
        let q = Quota::new(2, W, Algorithm::FixedWindow);
        // A window ending at 1000, then the next ending at 2000, and a
        // denial.
        let mut c = vec![
            adm(b, 100, 2, 1, 898),
            adm(b, 900, 2, 0, 98),
            adm(b, 1001, 1, 1, 998),
            adm(b, 1500, 2, 0, 498),
        ];
        c.push(Check {
            allowed: false,
            ..adm(b, 1600, 1, 0, 399)
        });
        assert_eq!(rules(q, &c), Vec::<&str>::new());
        let q = Quota::new(2, W, Algorithm::SlidingLog);
        let c = [
            adm(b, 0, 1, 1, 0),
            adm(b, 500, 1, 0, 0),
            adm(b, 1002, 1, 0, 0),
        ];
        assert_eq!(rules(q, &c), Vec::<&str>::new());
    }

    #[test]
    fn each_broken_rule_is_caught() {
        let b = Instant::now();
        // Sliding log: three admissions within one window, limit 2.
        let q = Quota::new(2, W, Algorithm::SlidingLog);
        let c = [
            adm(b, 0, 1, 1, 0),
            adm(b, 500, 1, 0, 0),
            adm(b, 998, 1, 0, 0),
        ];
        assert_eq!(rules(q, &c), vec!["admissions within a window-long span"]);
        // Fixed window: three admissions of one window, limit 2 (all
        // reporting distinct remaining values).
        let q = Quota::new(2, W, Algorithm::FixedWindow);
        let c = [
            adm(b, 100, 2, 2, 898),
            adm(b, 200, 2, 1, 798),
            adm(b, 300, 2, 0, 698),
        ];
        assert_eq!(rules(q, &c), vec!["admissions per fixed window"]);
        // Five in one span, limit 2: more than two windows' worth.
        let c: Vec<Check> = (0..5).map(|i| adm(b, 100 * i, 2, 0, 0)).collect();
        assert!(rules(q, &c).contains(&"admissions within a window-long span"));
        // Two admissions spent the same unit.
        let c = [adm(b, 100, 2, 1, 898), adm(b, 200, 2, 1, 798)];
        assert_eq!(rules(q, &c), vec!["each admission spends its own unit"]);
        // A "window" whose admissions are further apart than a window.
        let c = [adm(b, 0, 2, 1, 1300), adm(b, 1200, 2, 0, 100)];
        assert_eq!(rules(q, &c), vec!["a window is one window long"]);
    }

    #[test]
    fn a_quota_change_is_judged_against_the_larger_limit() {
        let b = Instant::now();
        let q = Quota::new(3, W, Algorithm::SlidingLog);
        // Five within one window while the limit alternates 3 and 5: the
        // larger limit, allowed.
        let five: Vec<Check> = (0..5).map(|i| adm(b, 100 * i, 1, 0, 0)).collect();
        assert!(check_admissions(&q, Some(5), &five).is_empty());
        // Eight: a change granted a fresh allowance.
        let eight: Vec<Check> = (0..8).map(|i| adm(b, 100 * i, 1, 0, 0)).collect();
        let v = check_admissions(&q, Some(5), &eight);
        assert_eq!(v[0].rule, "admissions within a window-long span");
        // Fixed window: two admissions of one window may report the same
        // remaining, each against its own limit, but not more than the
        // larger limit.
        let q = Quota::new(2, W, Algorithm::FixedWindow);
        let c = [adm(b, 100, 2, 1, 898), adm(b, 200, 2, 1, 798)];
        assert!(check_admissions(&q, Some(3), &c).is_empty());
        let c: Vec<Check> = (0..4)
            .map(|i| adm(b, 100 + 50 * i, 2, 3 - i, 898 - 50 * i))
            .collect();
        let v = check_admissions(&q, Some(3), &c);
        assert_eq!(v[0].rule, "admissions per fixed window");
    }
}
