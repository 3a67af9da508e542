//! The barrier workload and its checker (docs/guarantees.md §4 "Barrier", §7 "no
//! participant in two barrier generations").
//!
//! `parties` participants (one client each) wait on one barrier of
//! `parties` over and over. Each wait is recorded as a [`BarrierWait`]:
//! when it was sent, when it returned, and how: passed generation `g`,
//! timed out (the participant was withdrawn, so it counted in no
//! generation), or failed with a store error (its arrival may or may not
//! have been counted: an *unknown* arrival). The checker verifies:
//!
//! 1. **no pass before `parties` arrivals**: when anybody passed `g`,
//!    `parties` distinct participants had sent their wait for `g` before
//!    (a participant that passed `g`, or one whose failed wait may have
//!    been counted in `g`: sent before that pass, and no later pass of its
//!    own reports `g` or an earlier generation; the checker does not make
//!    one failed wait stand in for only one generation);
//! 2. **no member joins a completed generation** (a phantom member): a
//!    participant that passed `g` sent its wait before anybody passed `g`;
//! 3. **generations rise**: a wait sent after somebody passed `g` passes a
//!    generation above `g` (so no participant is counted in two
//!    generations, and each participant's generations rise);
//! 4. **one pass per participant per generation**: no generation passed
//!    twice by one participant or by more than `parties` participants.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use coord_core::Coord;
use tokio::time::Instant;

use super::report::{Report, Run, expect_retryable, longest_stall};
use super::{FaultLog, Violation};

/// The shape of a barrier workload.
#[derive(Debug, Clone, Copy)]
pub struct BarrierWorkload {
    /// Each wait's timeout.
    pub timeout: Duration,
    /// How long the workload runs.
    pub duration: Duration,
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Passed this generation.
    Passed(u64),
    /// Timed out; the participant was withdrawn.
    TimedOut,
    /// Failed with a store error: counted in some generation or not.
    Failed,
}

/// One wait of one participant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BarrierWait {
    /// The participant (workload client index).
    pub participant: usize,
    /// When the wait was sent.
    pub asked: Instant,
    /// When it returned.
    pub ended: Instant,
    /// How.
    pub outcome: Outcome,
}

fn passed(w: &BarrierWait) -> Option<u64> {
    match w.outcome {
        Outcome::Passed(g) => Some(g),
        _ => None,
    }
}

/// Check a barrier workload of `parties` participants (every wait of each,
/// in any order).
pub fn check_barrier_history(parties: usize, waits: &[BarrierWait]) -> Vec<Violation> {
    let mut v = Vec::new();
    let mut gens: BTreeMap<u64, Vec<&BarrierWait>> = BTreeMap::new();
    for w in waits {
        if let Some(g) = passed(w) {
            gens.entry(g).or_default().push(w);
        }
    }
    // Each failed wait, with the generation its participant passed next.
    let failed: Vec<(&BarrierWait, Option<u64>)> = waits
        .iter()
        .filter(|f| f.outcome == Outcome::Failed)
        .map(|f| {
            let next = waits
                .iter()
                .filter(|p| p.participant == f.participant && p.asked > f.asked)
                .filter_map(|p| passed(p).map(|pg| (p.asked, pg)))
                .min()
                .map(|(_, pg)| pg);
            (f, next)
        })
        .collect();
    for (&g, passes) in &gens {
        let first_pass = passes.iter().map(|w| w.ended).min().expect("non-empty");
        let who: HashSet<usize> = passes.iter().map(|w| w.participant).collect();
        if who.len() < passes.len() || who.len() > parties {
            v.push(Violation {
                rule: "one pass per participant per generation",
                detail: format!(
                    "generation {g} passed {} times by {} participants (parties {parties})",
                    passes.len(),
                    who.len()
                ),
            });
        }
        // Failed waits that may have been counted in g.
        let unknown: HashSet<usize> = failed
            .iter()
            .filter(|(f, next)| {
                !who.contains(&f.participant) && f.asked <= first_pass && next.is_none_or(|n| n > g)
            })
            .map(|(f, _)| f.participant)
            .collect();
        // An arrival asked at the very instant of a pass (simulated time
        // stands still while the store answers) may have been before it.
        for p in passes {
            let arrived = passes
                .iter()
                .filter(|q| q.asked <= p.ended)
                .map(|q| q.participant)
                .collect::<HashSet<_>>()
                .len()
                + unknown.len();
            if arrived < parties {
                v.push(Violation {
                    rule: "no pass before parties arrivals",
                    detail: format!(
                        "participant {} passed generation {g} at {:?} after {arrived} of {parties} arrivals ({} unknown)",
                        p.participant,
                        p.ended,
                        unknown.len()
                    ),
                });
            }
            if p.asked > first_pass {
                v.push(Violation {
                    rule: "no member joins a completed generation",
                    detail: format!(
                        "participant {} sent its wait at {:?}, after generation {g} was passed at {first_pass:?}, and passed it",
                        p.participant, p.asked
                    ),
                });
            }
        }
    }
    // A wait sent after a pass of g passes a higher generation.
    let mut passes: Vec<(Instant, u64)> = waits
        .iter()
        .filter_map(|w| passed(w).map(|g| (w.ended, g)))
        .collect();
    passes.sort();
    // The highest generation passed up to each pass (by when it passed).
    let mut highest = Vec::with_capacity(passes.len());
    for (_, g) in &passes {
        highest.push((*highest.last().unwrap_or(g)).max(*g));
    }
    for w in waits {
        let Some(g) = passed(w) else { continue };
        let n = passes.partition_point(|(t, _)| *t < w.asked);
        if n > 0 && g <= highest[n - 1] {
            v.push(Violation {
                rule: "generations rise",
                detail: format!(
                    "participant {} sent its wait after generation {} was passed, yet passed {g}",
                    w.participant,
                    highest[n - 1]
                ),
            });
        }
    }
    v
}

/// The participant name of workload client `i`.
pub fn participant(i: usize) -> String {
    format!("participant-{i}")
}

/// Run a barrier workload on `name`: each of `participants` (their number
/// is the barrier's `parties`) waits on it over and over while `faults`
/// runs; then check the history. `ops` counts the generations passed.
pub async fn run_barrier_workload<F>(
    participants: Vec<Coord>,
    name: &str,
    w: BarrierWorkload,
    faults: F,
) -> (Report, FaultLog)
where
    F: std::future::Future<Output = FaultLog>,
{
    let parties = participants.len();
    let run = Run::new();
    let mut tasks = Vec::new();
    for (i, c) in participants.into_iter().enumerate() {
        let (stop, name) = (run.stop.clone(), name.to_string());
        tasks.push(tokio::spawn(async move {
            let barriers = c.barriers().expect("barriers");
            let me = participant(i);
            let mut waits = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let asked = Instant::now();
                let r = barriers.wait(&name, parties as u32, &me, w.timeout).await;
                let outcome = match r {
                    Ok(g) => Outcome::Passed(g),
                    Err(coord_core::Error::Timeout { .. }) => Outcome::TimedOut,
                    // The barrier's state was lost (expired while this
                    // participant was cut off): it did not pass.
                    Err(coord_core::Error::ArrivalLost { .. }) => Outcome::Failed,
                    Err(e) => {
                        expect_retryable(&me, &e);
                        Outcome::Failed
                    }
                };
                let ended = Instant::now();
                waits.push(BarrierWait {
                    participant: i,
                    asked,
                    ended,
                    outcome,
                });
                if outcome == Outcome::Failed {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            waits
        }));
    }
    let join = w.timeout * 2 + Duration::from_secs(30);
    let (results, log, end) = run.finish(tasks, faults, w.duration, join).await;
    let waits: Vec<BarrierWait> = results.into_iter().flatten().collect();
    let violations = check_barrier_history(parties, &waits);
    let generations: HashSet<u64> = waits.iter().filter_map(passed).collect();
    let progress: Vec<Instant> = waits
        .iter()
        .filter(|w| passed(w).is_some())
        .map(|w| w.ended)
        .collect();
    let count = |o: Outcome| waits.iter().filter(|w| w.outcome == o).count();
    let report = Report {
        ops: generations.len(),
        errors: count(Outcome::Failed),
        violations,
        longest_stall: longest_stall(&progress, log.healed.unwrap_or(run.start), end),
        waived: 0,
        extra: vec![
            ("passes", progress.len() as u64),
            ("timeouts", count(Outcome::TimedOut) as u64),
        ],
        progress,
    };
    (report, log)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(b: Instant, p: usize, asked: u64, ended: u64, outcome: Outcome) -> BarrierWait {
        BarrierWait {
            participant: p,
            asked: b + Duration::from_millis(asked),
            ended: b + Duration::from_millis(ended),
            outcome,
        }
    }

    fn rules(parties: usize, w: &[BarrierWait]) -> Vec<&'static str> {
        check_barrier_history(parties, w)
            .iter()
            .map(|v| v.rule)
            .collect()
    }

    use Outcome::*;

    #[test]
    fn a_clean_history_passes() {
        let b = Instant::now();
        let w = [
            wait(b, 0, 0, 10, Passed(1)),
            wait(b, 1, 5, 10, Passed(1)),
            wait(b, 0, 11, 30, TimedOut),
            wait(b, 1, 11, 40, Passed(2)),
            wait(b, 0, 31, 41, Passed(2)),
        ];
        assert_eq!(rules(2, &w), Vec::<&str>::new());
        // A failed wait may have been the third arrival of generation 3.
        let w = [
            wait(b, 2, 42, 60, Failed),
            wait(b, 0, 42, 70, Passed(3)),
            wait(b, 1, 42, 70, Passed(3)),
        ];
        assert_eq!(rules(3, &w), Vec::<&str>::new());
    }

    #[test]
    fn each_broken_rule_is_caught() {
        let b = Instant::now();
        // Passed with one arrival of two.
        let w = [wait(b, 0, 0, 10, Passed(1)), wait(b, 1, 0, 5, TimedOut)];
        assert_eq!(rules(2, &w), vec!["no pass before parties arrivals"]);
        // Passed before the second arrival was even sent.
        let w = [wait(b, 0, 0, 10, Passed(1)), wait(b, 1, 12, 15, Passed(1))];
        let r = rules(2, &w);
        assert!(r.contains(&"no pass before parties arrivals"), "{r:?}");
        assert!(
            r.contains(&"no member joins a completed generation"),
            "{r:?}"
        );
        assert!(r.contains(&"generations rise"), "{r:?}");
        // One participant passed the same generation twice.
        let w = [
            wait(b, 0, 0, 10, Passed(1)),
            wait(b, 1, 0, 10, Passed(1)),
            wait(b, 1, 1, 9, Passed(1)),
        ];
        assert!(rules(2, &w).contains(&"one pass per participant per generation"));
        // A later wait passed a lower generation.
        let w = [
            wait(b, 0, 0, 10, Passed(5)),
            wait(b, 1, 0, 10, Passed(5)),
            wait(b, 0, 11, 20, Passed(4)),
            wait(b, 1, 11, 20, Passed(4)),
        ];
        assert_eq!(rules(2, &w), vec!["generations rise", "generations rise"]);
        // A failed wait cannot stand in for a generation its participant
        // passed later under an earlier number, nor one passed before it
        // was sent.
        let w = [
            wait(b, 2, 0, 5, Failed),
            wait(b, 2, 6, 8, Passed(1)),
            wait(b, 0, 0, 9, Passed(2)),
            wait(b, 1, 0, 9, Passed(2)),
            wait(b, 3, 10, 12, Failed),
        ];
        let v = check_barrier_history(3, &w);
        assert!(
            v.iter().any(|v| v.rule == "no pass before parties arrivals"
                && v.detail.contains("generation 2 ")),
            "{v:?}"
        );
    }
}
