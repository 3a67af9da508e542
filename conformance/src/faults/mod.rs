//! Fault-injection workloads with recorded histories, written once for
//! every store (docs/guarantees.md §7). A backend's fault suite (the
//! module `faults` of its `tests/it`, of `tests/alone` on PostgreSQL)
//! starts its real servers, builds clients (each behind its own
//! [`FaultProxy`] where the scenario cuts
//! clients off), runs a workload here while it injects real faults, and
//! asserts the report has no violation.
//!
//! Workloads: locks (here, checked by [`history`]), elections
//! ([`election`]), barriers ([`barrier`]), limiters ([`limiter`]), and
//! semaphores and read-write locks ([`permits`]), work queues ([`queue`]), each
//! with its checker, unit-tested on hand-made broken histories.
//!
//! Each run prints one line for `scripts/faults`' matrix:
//! `FAULTS scenario=<s> backend=<b> ops=<n> faults=<n> violations=<n> stall_ms=<n>`.

pub mod barrier;
pub mod election;
pub mod health;
pub mod history;
pub mod limiter;
pub mod outage;
pub mod permits;
pub mod process;
pub mod queue;
pub mod random;
pub mod report;
pub mod scenarios;
pub mod unheard;
mod workload;

use std::time::Duration;

use coord_core::{Coord, LockOptions};
use tokio::time::{Instant, sleep};

use crate::testkit::proxy::FaultProxy;

pub use crate::testkit::signal;
pub use barrier::{BarrierWorkload, run_barrier_workload};
pub use election::{ElectionWorkload, run_election_workload};
pub use history::{Access, FencedResource, Grant, Violation, check_lock_history};
pub use limiter::{LimiterWorkload, run_limiter_workload};
pub use permits::{PermitKind, PermitWorkload, run_permit_workload};
pub use queue::{QueueWorkload, run_queue_workload};
pub use report::Report;
pub use scenarios::{fault_for, proxies_for};
pub use unheard::{UnheardGrant, unheard_grant};
pub use workload::run_lock_workload;

/// How long fault schedules run: `COORD_FAULT_SECONDS` (set by
/// `scripts/faults --minutes N`), else `short` (the CI schedule).
pub fn schedule(short: Duration) -> Duration {
    std::env::var("COORD_FAULT_SECONDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(short)
        .max(short)
}

/// The shape of a lock workload.
#[derive(Debug, Clone, Copy)]
pub struct LockWorkload {
    /// The lock's TTL.
    pub ttl: Duration,
    /// How long each acquire may wait. An acquire that waits it out was
    /// answered by the store, but the workload learns so only when it
    /// ends: keep it at most half the recovery bound
    /// ([`LockReport::assert_every_client_recovered`] checks), or a client
    /// waiting for the lock from the heal on looks like one still failing.
    pub wait: Duration,
    /// Keep guards alive with the watchdog.
    pub watchdog: bool,
    /// Time spent inside the critical section between read and write.
    pub work: Duration,
    /// How long the workload runs.
    pub duration: Duration,
}

/// What a lock workload recorded, and the checker's verdict.
#[derive(Debug)]
pub struct LockReport {
    /// Every grant.
    pub grants: Vec<Grant>,
    /// Every access to the fenced resource.
    pub accesses: Vec<Access>,
    /// The checker's findings (must be empty).
    pub violations: Vec<Violation>,
    /// Accepted writes.
    pub ops: usize,
    /// Acquire or release calls that failed (expected under faults).
    pub errors: usize,
    /// Writes refused by the resource (stale holders, fenced off).
    pub fenced_off: usize,
    /// The longest time without an accepted write after `healed` (or over
    /// the whole run when there was no fault).
    pub longest_stall: Duration,
    /// How long after `healed` (or the start) a client went on failing
    /// before the store answered it again, the longest over clients: the
    /// longest span after the heal that holds a store failure of the
    /// client (an acquire or release that failed other than by waiting
    /// out its `wait` or by lost ownership) and no answered call, from the
    /// heal or the client's last answered call before the failure to its
    /// next answered call (or the end of the run); zero if none failed
    /// after the heal. A client stuck on a dead connection fails until the
    /// end. A call that failed alone between answered ones (a call timeout
    /// on a loaded machine, long after the heal) counts only its own span.
    /// (Time to a client's next GRANT is no measure: the lock is not fair,
    /// and under this saturating workload a client that just released
    /// often wins again; an acquire that waited out its `wait` was
    /// answered, though.)
    pub recovery: Duration,
    /// The calls after the heal of the client whose failing span was
    /// [`recovery`](LockReport::recovery), one per line (empty if none
    /// failed): what the assertion prints to say why.
    pub recovery_calls: String,
    /// The workload's [`wait`](LockWorkload::wait): the resolution of
    /// [`recovery`](LockReport::recovery).
    pub wait: Duration,
    /// Violations removed by [`waive`](LockReport::waive) (a rule the
    /// scenario's fault is known to break; printed in the matrix line).
    pub waived: usize,
}

impl LockReport {
    /// Print the matrix line and panic on any violation, or if the
    /// workload made no progress after the fault healed within `bound`.
    pub fn assert_ok(&self, scenario: &str, backend: &str, faults: usize, bound: Duration) {
        println!(
            "FAULTS scenario={scenario} backend={backend} ops={} faults={faults} violations={} stall_ms={} errors={} fenced_off={} waived={} recovery_ms={}",
            self.ops,
            self.violations.len(),
            self.longest_stall.as_millis(),
            self.errors,
            self.fenced_off,
            self.waived,
            self.recovery.as_millis()
        );
        let progress = report::Progress {
            ops: self.ops,
            none: "no write was accepted",
            longest_stall: self.longest_stall,
        };
        report::assert_verdict(scenario, backend, &self.violations, progress, bound);
    }

    /// Remove the violations of `rule` that the scenario's fault is known
    /// to cause (say why at the call site); returns how many. Every other
    /// rule is still judged by [`assert_ok`](LockReport::assert_ok).
    pub fn waive(&mut self, rule: &str) -> usize {
        let before = self.violations.len();
        self.violations.retain(|v| v.rule != rule);
        let n = before - self.violations.len();
        self.waived += n;
        n
    }

    /// The first grant at or after `t` (panics if there is none).
    pub fn first_grant_after(&self, t: Instant) -> Instant {
        let first = self
            .grants
            .iter()
            .map(|g| g.granted)
            .filter(|g| *g >= t)
            .min();
        first.expect("a grant after the victim's fault")
    }

    /// Panic unless every client stopped failing within `bound` of the
    /// heal (docs/guarantees.md §7: after a fault heals EVERY client progresses).
    pub fn assert_every_client_recovered(&self, scenario: &str, backend: &str, bound: Duration) {
        assert!(
            self.wait * 2 <= bound,
            "{scenario} on {backend}: the workload's wait ({:?}) must be at most half the \
             recovery bound ({bound:?}): an acquire that waits it out counts as answered \
             only when it ends",
            self.wait
        );
        assert!(
            self.recovery <= bound,
            "{scenario} on {backend}: a client still failed {:?} after the fault healed (bound {bound:?}); its calls after the heal:\n{}",
            self.recovery,
            self.recovery_calls
        );
    }
}

/// The times at which faults were injected and healed.
#[derive(Debug, Default, Clone)]
pub struct FaultLog {
    /// How many faults were injected.
    pub injected: usize,
    /// When the last fault healed (progress is measured from here).
    pub healed: Option<Instant>,
}

impl FaultLog {
    /// `injected` faults, the last of them healed now.
    pub fn healed_now(injected: usize) -> FaultLog {
        FaultLog {
            injected,
            healed: Some(Instant::now()),
        }
    }
}

/// When [`cut_off_victim`] cut its victim off, and when the victim's
/// guard stopped being valid.
#[derive(Debug, Clone, Copy)]
pub struct CutOff {
    /// When the victim's proxy started dropping everything.
    pub cut: Instant,
    /// The victim guard's local validity deadline.
    pub victim_valid: Instant,
}

impl CutOff {
    /// Panic unless the workload's first grant after the cut came within
    /// `bound` of it, and no workload client got the lock while the
    /// victim held it or its guard was still valid (which itself ended
    /// within `ttl` of the cut).
    pub fn assert_handover(&self, report: &LockReport, ttl: Duration, bound: Duration) {
        let (cut, victim_valid) = (self.cut, self.victim_valid);
        let first = report.first_grant_after(cut);
        println!(
            "client-cut-off: first grant {:?} after the holder was cut off",
            first - cut
        );
        assert!(
            first - cut <= bound,
            "first grant {:?} after the holder was cut off",
            first - cut
        );
        let earliest = report.grants.iter().map(|g| g.granted).min().unwrap();
        assert!(
            earliest >= victim_valid && victim_valid <= cut + ttl,
            "a workload client got the lock while the cut victim's guard was still valid"
        );
        assert!(
            earliest >= cut,
            "a workload client got the lock while the victim held it"
        );
    }
}

/// The "client cut off" scenario, the same on every store. `victim` (its
/// traffic through `victim_proxy`) holds `name` with the watchdog on when
/// the workload of `clients` starts; after 1 s it is cut off for 2 TTLs:
/// its guard must be invalid and its lost signal fired, and its release
/// must report the loss. Then the workload client behind `client0_proxy`
/// is cut off the same way and healed. Judge the report as the store
/// needs, then check the handover with [`CutOff::assert_handover`].
pub async fn cut_off_victim(
    name: &str,
    victim: &Coord,
    victim_proxy: &FaultProxy,
    client0_proxy: &FaultProxy,
    clients: Vec<Coord>,
    w: LockWorkload,
) -> (LockReport, FaultLog, CutOff) {
    // The lock is free: the wait only lets the acquire try again when a
    // call of a loaded machine goes unanswered in its call timeout.
    let opts = LockOptions::new(w.ttl)
        .watchdog(true)
        .wait(Duration::from_secs(10));
    let guard = victim
        .locks()
        .expect("locks")
        .acquire_with(name, opts)
        .await
        .expect("the victim takes the free lock");
    let cut = std::sync::Mutex::new(None);
    let victim_valid = std::sync::Mutex::new(None);
    let (report, log) = run_lock_workload(clients, name, w, async {
        sleep(Duration::from_millis(1000)).await;
        victim_proxy.blackhole();
        *cut.lock().unwrap() = Some(Instant::now());
        sleep(w.ttl * 2).await;
        assert!(
            !guard.is_valid(),
            "the cut victim's guard is still valid after 2 TTLs"
        );
        tokio::time::timeout(Duration::from_millis(100), guard.lost())
            .await
            .expect("the cut victim's lost signal fired");
        victim_proxy.heal();
        *victim_valid.lock().unwrap() = Some(guard.valid_until());
        // The release must report the loss, so it must be answered: first
        // wait until the victim's client is answered again after the heal
        // (a probe; its short call timeout may miss one on a loaded
        // machine while it reconnects).
        crate::testkit::wait::until_answered(
            std::time::Instant::now() + Duration::from_secs(10),
            "the victim's client after the heal",
            || victim.health(),
        )
        .await;
        let released = guard.release().await;
        assert!(
            released.as_ref().is_err_and(|e| e.is_ownership_lost()),
            "{released:?}"
        );
        sleep(Duration::from_millis(1000)).await;
        client0_proxy.blackhole();
        sleep(w.ttl * 2).await;
        client0_proxy.heal();
        FaultLog::healed_now(2)
    })
    .await;
    let cut_off = CutOff {
        cut: cut.into_inner().unwrap().expect("cut"),
        victim_valid: victim_valid
            .into_inner()
            .unwrap()
            .expect("victim's deadline"),
    };
    (report, log, cut_off)
}

/// How long after a release by `holder` (from its reply) a `waiter` on
/// the same lock got it, with its polling fallback set to 30 s: a few
/// seconds at most only if the store's wake-up reached it (after a fault: its subscription, LISTEN
/// connection or watch came back). `holder` takes a fresh lock with a
/// `ttl` TTL, `waiter` starts waiting, and 300 ms later the lock is
/// released. Panics if the waiter does not get the lock.
pub async fn woken_after_release(holder: &Coord, waiter: Coord, ttl: Duration) -> Duration {
    let name = crate::unique("wake-probe");
    let long = Duration::from_secs(30);
    let held = holder
        .locks()
        .unwrap()
        .acquire(&name, long, ttl)
        .await
        .unwrap();
    let n = name.clone();
    let waiting = tokio::spawn(async move {
        let g = waiter
            .with_poll_interval(long)
            .locks()
            .unwrap()
            .acquire(&n, long, long)
            .await;
        (g, Instant::now())
    });
    sleep(Duration::from_millis(300)).await;
    held.release().await.unwrap();
    // Timed from the release's reply: its own round trip is not the
    // waiter's delay.
    let released = Instant::now();
    let (g, at) = waiting.await.unwrap();
    g.expect("the waiter acquires once the holder released")
        .release()
        .await
        .unwrap();
    at.saturating_duration_since(released)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waive_removes_only_the_named_rule_and_counts_it() {
        let v = |rule| Violation {
            rule,
            detail: String::new(),
        };
        let mut r = LockReport {
            grants: vec![],
            accesses: vec![],
            violations: vec![
                v("one valid holder at a time"),
                v("tokens rise in grant order"),
                v("one valid holder at a time"),
            ],
            ops: 1,
            errors: 0,
            fenced_off: 0,
            longest_stall: Duration::ZERO,
            recovery: Duration::ZERO,
            recovery_calls: String::new(),
            wait: Duration::ZERO,
            waived: 0,
        };
        assert_eq!(r.waive("one valid holder at a time"), 2);
        assert_eq!(r.waived, 2);
        assert_eq!(r.violations, vec![v("tokens rise in grant order")]);
    }
}
