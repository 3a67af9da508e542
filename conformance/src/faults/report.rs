//! What the election, barrier and limiter workloads share: driving client
//! tasks while faults run, measuring progress after the heal, and the
//! verdict with its `FAULTS ...` matrix line (the lock workload keeps its
//! own [`LockReport`](super::LockReport), which records more).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use super::{FaultLog, Violation};

/// How much a workload did, for [`assert_verdict`].
pub(crate) struct Progress {
    /// Completed operations.
    pub ops: usize,
    /// What to say when there were none.
    pub none: &'static str,
    /// The longest time without an operation after the heal.
    pub longest_stall: Duration,
}

/// The verdict every workload's report gives after printing its matrix
/// line: the first ten violations are printed, then it panics on any
/// violation, if nothing was done, or if the workload stalled for longer
/// than `bound` after the fault healed.
pub(crate) fn assert_verdict(
    scenario: &str,
    backend: &str,
    violations: &[Violation],
    progress: Progress,
    bound: Duration,
) {
    for v in violations.iter().take(10) {
        eprintln!("{scenario} on {backend}: violation: {v}");
    }
    assert!(
        violations.is_empty(),
        "{scenario} on {backend}: {} violations, first: {}",
        violations.len(),
        violations[0]
    );
    assert!(
        progress.ops > 0,
        "{scenario} on {backend}: {}",
        progress.none
    );
    assert!(
        progress.longest_stall <= bound,
        "{scenario} on {backend}: no progress for {:?} after the fault healed (bound {bound:?})",
        progress.longest_stall
    );
}

/// A workload's verdict: what it did, and what the checker found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Completed operations (the workload says what counts: terms served,
    /// generations passed, admissions reported).
    pub ops: usize,
    /// Calls that failed (expected under faults).
    pub errors: usize,
    /// The checker's findings (must be empty).
    pub violations: Vec<Violation>,
    /// The longest time without an operation after the heal (or over the
    /// whole run when there was no fault), up to the end of the run.
    pub longest_stall: Duration,
    /// Violations removed by [`waive`](Report::waive).
    pub waived: usize,
    /// Further `key=value` counters printed at the end of the matrix line.
    pub extra: Vec<(&'static str, u64)>,
    /// When each operation completed (for a scenario's own checks, such
    /// as how soon after a fault the next one came).
    pub progress: Vec<Instant>,
}

impl Report {
    /// The `FAULTS ...` line `scripts/faults` turns into its matrix.
    pub fn line(&self, scenario: &str, backend: &str, faults: usize) -> String {
        let mut s = format!(
            "FAULTS scenario={scenario} backend={backend} ops={} faults={faults} violations={} stall_ms={} errors={} waived={}",
            self.ops,
            self.violations.len(),
            self.longest_stall.as_millis(),
            self.errors,
            self.waived
        );
        for (k, v) in &self.extra {
            s.push_str(&format!(" {k}={v}"));
        }
        s
    }

    /// Print the matrix line, then panic on any violation (the first ten
    /// are printed), if nothing was done, or if the workload stalled for
    /// longer than `bound` after the fault healed.
    pub fn assert_ok(&self, scenario: &str, backend: &str, faults: usize, bound: Duration) {
        println!("{}", self.line(scenario, backend, faults));
        let progress = Progress {
            ops: self.ops,
            none: "no operation completed",
            longest_stall: self.longest_stall,
        };
        assert_verdict(scenario, backend, &self.violations, progress, bound);
    }

    /// How long after `t` the first operation completed (panics if none
    /// did).
    pub fn first_after(&self, t: Instant) -> Duration {
        let first = self.progress.iter().filter(|p| **p >= t).min();
        *first.expect("an operation after the fault") - t
    }

    /// Remove the violations of `rule` that the scenario's fault is known
    /// to cause (say why at the call site); returns how many.
    pub fn waive(&mut self, rule: &str) -> usize {
        let before = self.violations.len();
        self.violations.retain(|v| v.rule != rule);
        let n = before - self.violations.len();
        self.waived += n;
        n
    }
}

/// The longest gap between `from`, the progress instants at or after it,
/// and `end` (a run with no progress after `from` stalled `end - from`).
pub fn longest_stall(progress: &[Instant], from: Instant, end: Instant) -> Duration {
    let mut times: Vec<Instant> = progress.iter().copied().filter(|t| *t >= from).collect();
    times.sort();
    let mut longest = Duration::ZERO;
    let mut prev = from;
    for t in times.iter().chain(std::iter::once(&end)) {
        longest = longest.max(t.saturating_duration_since(prev));
        prev = prev.max(*t);
    }
    longest
}

/// A run of client tasks: started by the caller, each checking `stop`
/// between operations.
pub(crate) struct Run {
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) start: Instant,
}

impl Run {
    pub(crate) fn new() -> Run {
        Run {
            stop: Arc::new(AtomicBool::new(false)),
            start: Instant::now(),
        }
    }

    /// Await `faults`, then the rest of `duration`, then stop the tasks and
    /// collect what each returned (panics if one panicked or did not stop
    /// within `join_bound`). Returns the results, the fault log, and the
    /// end of the run (progress is measured up to it).
    pub(crate) async fn finish<T, F>(
        &self,
        tasks: Vec<JoinHandle<T>>,
        faults: F,
        duration: Duration,
        join_bound: Duration,
    ) -> (Vec<T>, FaultLog, Instant)
    where
        F: Future<Output = FaultLog>,
    {
        let log = faults.await;
        let end = self.start + duration;
        sleep(end.saturating_duration_since(Instant::now())).await;
        let end = Instant::now();
        self.stop.store(true, Ordering::SeqCst);
        let mut out = Vec::new();
        for t in tasks {
            match tokio::time::timeout(join_bound, t).await {
                Ok(Ok(r)) => out.push(r),
                Ok(Err(e)) => panic!("a workload client panicked: {e}"),
                Err(_) => panic!("a workload client did not stop within {join_bound:?}"),
            }
        }
        (out, log, end)
    }
}

/// Panic on a non-retryable store error other than a timeout (a workload
/// under faults expects only those).
pub(crate) fn expect_retryable(who: &str, e: &coord_core::Error) {
    if !e.is_retryable() && !matches!(e, coord_core::Error::Timeout { .. }) {
        panic!("{who}: failed with a non-retryable error: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stall_counts_from_the_heal_to_the_end() {
        let b = Instant::now();
        let ms = |n| b + Duration::from_millis(n);
        // Progress before the heal does not count.
        let p = [ms(1), ms(50), ms(120), ms(130)];
        assert_eq!(
            longest_stall(&p, ms(40), ms(200)),
            Duration::from_millis(70)
        );
        // Nothing after the heal: stalled until the end.
        assert_eq!(
            longest_stall(&p, ms(150), ms(400)),
            Duration::from_millis(250)
        );
    }

    #[test]
    fn the_line_and_waive() {
        let v = |rule| Violation {
            rule,
            detail: String::new(),
        };
        let mut r = Report {
            ops: 3,
            violations: vec![v("a"), v("b"), v("a")],
            extra: vec![("passes", 9)],
            ..Report::default()
        };
        assert_eq!(r.waive("a"), 2);
        assert_eq!(r.violations, vec![v("b")]);
        assert_eq!(
            r.line("s", "memory", 1),
            "FAULTS scenario=s backend=memory ops=3 faults=1 violations=1 stall_ms=0 errors=0 waived=2 passes=9"
        );
    }
}
