//! The lock workload: clients looping acquire, fenced read, work, fenced
//! write and release on one name while faults run, and what it recorded.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use coord_core::{Coord, LockOptions};
use tokio::time::{Instant, sleep};

use super::{FaultLog, LockReport, LockWorkload, report};
use crate::faults::history::{Access, FencedResource, Grant, check_lock_history};

/// Run a lock workload: each client loops acquire -> fenced read ->
/// `work` -> fenced write (value + 1) -> release on one lock name, while
/// `faults` runs; then check the history.
pub async fn run_lock_workload<F>(
    clients: Vec<Coord>,
    name: &str,
    w: LockWorkload,
    faults: F,
) -> (LockReport, FaultLog)
where
    F: Future<Output = FaultLog>,
{
    let resource = Arc::new(FencedResource::new());
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        let (resource, stop, name) = (resource.clone(), stop.clone(), name.to_string());
        tasks.push(tokio::spawn(async move {
            client_loop(i, c, &name, w, &resource, &stop).await
        }));
    }
    let fault_log = faults.await;
    let end = start + w.duration;
    sleep(end.saturating_duration_since(Instant::now())).await;
    stop.store(true, Ordering::SeqCst);
    let mut grants = Vec::new();
    let mut errors = 0;
    let mut calls = Vec::new();
    for t in tasks {
        // A client stuck past its own wait is a liveness failure itself.
        match tokio::time::timeout(w.wait + w.ttl * 2 + Duration::from_secs(30), t).await {
            Ok(Ok((g, e, c))) => {
                grants.extend(g);
                errors += e;
                calls.push(c);
            }
            Ok(Err(e)) => panic!("a workload client panicked: {e}"),
            Err(_) => panic!("a workload client did not stop within its wait + 2 TTL + 30 s"),
        }
    }
    let accesses = resource.log();
    let violations = check_lock_history(&grants, &accesses);
    let ops = accesses
        .iter()
        .filter(|a| matches!(a, Access::Write { accepted: true, .. }))
        .count();
    let fenced_off = accesses
        .iter()
        .filter(|a| {
            matches!(
                a,
                Access::Write {
                    accepted: false,
                    ..
                } | Access::Read { value: None, .. }
            )
        })
        .count();
    // Progress: the longest gap between grants after the heal.
    let from = fault_log.healed.unwrap_or(start);
    let times: Vec<Instant> = grants.iter().map(|g| g.granted).collect();
    let longest = report::longest_stall(&times, from, Instant::now().min(end));
    let ended = Instant::now();
    let (recovery, recovery_calls) = calls
        .iter()
        .map(|c| {
            let answered: Vec<(Instant, bool)> = c.iter().map(|c| (c.ended, c.answered)).collect();
            (failing_after(from, ended, &answered), c)
        })
        .max_by_key(|(span, _)| *span)
        .filter(|(span, _)| !span.is_zero())
        .map(|(span, c)| (span, Call::describe_after(from, c)))
        .unwrap_or_default();
    (
        LockReport {
            grants,
            accesses,
            violations,
            ops,
            errors,
            fenced_off,
            longest_stall: longest,
            recovery,
            recovery_calls,
            wait: w.wait,
            waived: 0,
        },
        fault_log,
    )
}

/// One acquire or release of a workload client, as it ended.
#[derive(Debug)]
struct Call {
    /// `"acquire"` or `"release"`.
    what: &'static str,
    asked: Instant,
    ended: Instant,
    /// The store answered it (see [`LockReport::recovery`]).
    answered: bool,
    /// `"ok"`, or the error it ended with.
    outcome: String,
}

impl Call {
    fn new(what: &'static str, asked: Instant, answered: bool, outcome: String) -> Call {
        Call {
            what,
            asked,
            ended: Instant::now(),
            answered,
            outcome,
        }
    }

    /// The calls that ended at or after `heal`, one a line, their times
    /// in ms from the heal (negative: asked before it).
    fn describe_after(heal: Instant, calls: &[Call]) -> String {
        let ms = |t: Instant| {
            if t >= heal {
                (t - heal).as_millis() as i64
            } else {
                -((heal - t).as_millis() as i64)
            }
        };
        calls
            .iter()
            .filter(|c| c.ended >= heal)
            .map(|c| {
                format!(
                    "  {} asked {} ms, ended {} ms, {}: {}",
                    c.what,
                    ms(c.asked),
                    ms(c.ended),
                    if c.answered { "answered" } else { "FAILED" },
                    c.outcome
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The longest span after `heal` in which a client's `calls` (when each
/// ended, and whether the store answered it) hold a failure and no
/// answered call: from the heal or the answered call before the failure
/// to the next answered call, or to `end` (see [`LockReport::recovery`]).
fn failing_after(heal: Instant, end: Instant, calls: &[(Instant, bool)]) -> Duration {
    let (mut since, mut failing, mut longest) = (heal, false, Duration::ZERO);
    for &(at, answered) in calls.iter().filter(|(at, _)| *at >= heal) {
        if answered {
            if failing {
                longest = longest.max(at - since);
            }
            (since, failing) = (at, false);
        } else {
            failing = true;
        }
    }
    if failing {
        longest = longest.max(end.saturating_duration_since(since));
    }
    longest
}

async fn client_loop(
    client: usize,
    coord: Coord,
    name: &str,
    w: LockWorkload,
    resource: &FencedResource,
    stop: &AtomicBool,
) -> (Vec<Grant>, usize, Vec<Call>) {
    let locks = coord.locks().expect("locks");
    let mut grants = Vec::new();
    let mut errors = 0;
    // When each call ended, and whether the store answered it (failed
    // other than by waiting out `wait` or by lost ownership: not).
    let mut calls = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let asked = Instant::now();
        let opts = LockOptions::new(w.ttl).wait(w.wait).watchdog(w.watchdog);
        let guard = match locks.acquire_with(name, opts).await {
            Ok(g) => g,
            Err(e) => {
                if !e.is_retryable() && !matches!(e, coord_core::Error::Timeout { .. }) {
                    panic!("client {client}: acquire failed with a non-retryable error: {e}");
                }
                errors += 1;
                let answered = matches!(e, coord_core::Error::Timeout { .. });
                calls.push(Call::new("acquire", asked, answered, e.to_string()));
                sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let granted = Instant::now();
        calls.push(Call::new("acquire", asked, true, "ok".into()));
        let token = guard.fencing_token().get();
        if guard.is_valid() {
            if let Some(v) = resource.read(client, token) {
                sleep(w.work).await;
                if guard.is_valid() {
                    resource.write(client, token, v, v + 1);
                }
            }
        }
        // Still valid: it is relied on until now (the release goes next).
        // Not valid: it was relied on until its local deadline at most.
        let now = Instant::now();
        let valid_until = if guard.is_valid() {
            now
        } else {
            guard.valid_until().min(now)
        };
        grants.push(Grant {
            client,
            token,
            asked,
            granted,
            valid_until,
        });
        let releasing = Instant::now();
        match guard.release().await {
            Ok(()) => calls.push(Call::new("release", releasing, true, "ok".into())),
            Err(e) => {
                errors += 1;
                let answered = e.is_ownership_lost();
                calls.push(Call::new("release", releasing, answered, e.to_string()));
            }
        }
    }
    (grants, errors, calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_is_the_longest_failing_span_after_the_heal() {
        let heal = Instant::now();
        let at = |ms: u64| heal + Duration::from_millis(ms);
        let end = at(10_000);
        // Failures before the heal, answered calls after: recovered at once.
        let before = [(heal - Duration::from_millis(5), false), (at(10), true)];
        assert_eq!(failing_after(heal, end, &before), Duration::ZERO);
        // Failing from the heal until the first answer at 2 s.
        let slow = [(at(100), false), (at(900), false), (at(2_000), true)];
        assert_eq!(
            failing_after(heal, end, &slow),
            Duration::from_millis(2_000)
        );
        // One failure between answered calls long after: its span only.
        let blip = [
            (at(10), true),
            (at(3_200), true),
            (at(3_300), false),
            (at(3_500), true),
        ];
        assert_eq!(failing_after(heal, end, &blip), Duration::from_millis(300));
        // Never answered again: failing until the end.
        let stuck = [(at(10), true), (at(500), false), (at(9_000), false)];
        assert_eq!(
            failing_after(heal, end, &stuck),
            Duration::from_millis(9_990)
        );
    }
}
