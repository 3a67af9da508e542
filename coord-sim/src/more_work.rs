//! The election, barrier and rate-limiter workloads of
//! `conformance::faults`, run by clients of their own over the simulated
//! store while its faults last, and judged by the same checkers those
//! workloads use against real servers (one leader per term, terms rising,
//! observe never going back; no generation passing short of its parties;
//! never more admitted than the quota in any window).

use std::sync::Arc;
use std::time::Duration;

use conformance::faults::report::Report;
use conformance::faults::{
    BarrierWorkload, ElectionWorkload, FaultLog, LimiterWorkload, run_barrier_workload,
    run_election_workload, run_limiter_workload,
};
use coord_core::{Algorithm, Quota};
use coord_memory::MemoryBackend;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::check::{Violation, readable};
use crate::world::World;

/// The workloads running, each with the subject its violations are
/// reported under.
pub struct Running(Vec<(&'static str, JoinHandle<Report>)>);

/// The faults of the simulated store stop at `end` (the world heals
/// then): that is the workloads' fault log.
async fn faults_until(end: Instant) -> FaultLog {
    tokio::time::sleep_until(end).await;
    FaultLog::healed_now(1)
}

/// Start the workloads on clients numbered from 20, for `duration` (the
/// faulty phase, which ends at `end`).
pub fn spawn(
    world: &Arc<World>,
    store: &Arc<MemoryBackend>,
    duration: Duration,
    end: Instant,
) -> Running {
    let client = |c: usize| crate::client(c, world, store);
    let keep_alive = world.chance(0.5);
    let election = ElectionWorkload {
        ttl: Duration::from_millis(world.pick(&[400, 1000, 2000])),
        wait: Duration::from_millis(world.pick(&[200, 1000, 3000])),
        keep_alive,
        work: Duration::from_millis(world.pick(&[100, 300])),
        duration,
    };
    let candidates = vec![client(20), client(21), client(22)];
    let observers = vec![client(23)];
    let barrier = BarrierWorkload {
        timeout: Duration::from_millis(world.pick(&[500, 1500, 3000])),
        duration,
    };
    let participants = vec![client(24), client(25), client(26)];
    let algorithm = world.pick(&[
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::Gcra,
    ]);
    let limiter = LimiterWorkload {
        quota: Quota::new(
            5,
            Duration::from_millis(world.pick(&[200, 1000])),
            algorithm,
        ),
        changed_limit: world.pick(&[None, Some(3), Some(8)]),
        pace: Duration::from_millis(world.pick(&[200, 500])),
        duration,
    };
    let checkers = vec![client(27), client(28)];
    world.log(format!("more work: {election:?} {barrier:?} {limiter:?}"));
    Running(vec![
        (
            "election",
            tokio::spawn(async move {
                let faults = faults_until(end);
                run_election_workload(candidates, observers, "election", election, faults)
                    .await
                    .0
            }),
        ),
        (
            "barrier",
            tokio::spawn(async move {
                let faults = faults_until(end);
                run_barrier_workload(participants, "barrier", barrier, faults)
                    .await
                    .0
            }),
        ),
        (
            "limiter",
            tokio::spawn(async move {
                let faults = faults_until(end);
                run_limiter_workload(checkers, "limiter", limiter, faults)
                    .await
                    .0
            }),
        ),
    ])
}

/// Wait for the workloads to end and collect their violations (a
/// workload that panicked is one: a client saw an error it must not, or
/// did not stop).
pub async fn judge(running: Running, world: &World) -> Vec<Violation> {
    let mut out = Vec::new();
    for (subject, handle) in running.0 {
        match handle.await {
            Ok(report) => {
                world.log(format!(
                    "{subject}: {} ops, {} errors",
                    report.ops, report.errors
                ));
                out.extend(report.violations.into_iter().map(|v| Violation {
                    subject: subject.to_string(),
                    rule: v.rule.to_string(),
                    detail: readable(&v.detail, world.start()),
                }));
            }
            Err(e) => out.push(Violation {
                subject: subject.to_string(),
                rule: "the workload ran to its end".into(),
                detail: format!("it panicked: {e}"),
            }),
        }
    }
    out
}
