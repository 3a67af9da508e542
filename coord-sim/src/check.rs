//! The judges of a run: the conformance suite's history checkers, and a
//! liveness probe once the faults have stopped.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use conformance::faults::history::{FencedResource, check_lock_history};
use conformance::faults::permits::check_permit_history;
use coord_core::Coord;
use tokio::time::Instant;

use crate::workload::{LOCK_NAMES, Recorded, SEM_NAME, SEM_TOTAL};
use crate::world::World;

/// How long after the faults stop a free lock (and the whole semaphore)
/// must be granted: the longest late copy (call timeout + 3 s), the
/// longest TTL it may leave (2 s), the cleanups' retries (about 6 s),
/// with room to spare.
pub const LIVENESS_BOUND: Duration = Duration::from_secs(15);

/// A rule a run broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// What the rule was about (a lock name, the semaphore, liveness).
    pub subject: String,
    /// Which rule.
    pub rule: String,
    /// The evidence.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.subject, self.rule, self.detail)
    }
}

/// Judge the recorded grants and the resources' accesses.
pub fn history(rec: &Recorded, resources: &[FencedResource; 2]) -> Vec<Violation> {
    let mut out = Vec::new();
    for (i, name) in LOCK_NAMES.iter().enumerate() {
        for v in check_lock_history(&rec.grants[i], &resources[i].log()) {
            out.push(Violation {
                subject: name.to_string(),
                rule: v.rule.to_string(),
                detail: v.detail,
            });
        }
    }
    for v in check_permit_history(&rec.permits, SEM_TOTAL) {
        out.push(Violation {
            subject: SEM_NAME.to_string(),
            rule: v.rule.to_string(),
            detail: v.detail,
        });
    }
    out
}

/// With faults off, every lock and the whole semaphore must be granted
/// to a fresh client within [`LIVENESS_BOUND`] of healing (the workload's
/// tasks are winding down meanwhile: each ends its current operation).
pub async fn liveness(world: Arc<World>, probe: Coord) -> Vec<Violation> {
    let mut out = Vec::new();
    let locks = probe.locks().expect("locks");
    let sems = probe.semaphores().expect("semaphores");
    let ttl = Duration::from_secs(1);
    let from = Instant::now();
    for name in LOCK_NAMES {
        let left = LIVENESS_BOUND.saturating_sub(from.elapsed());
        let r = locks.acquire(name, ttl, left).await;
        let took = from.elapsed();
        world.log(format!(
            "probe {name}: {} after {}ms",
            r.is_ok(),
            took.as_millis()
        ));
        match r {
            Ok(g) => {
                let _ = g.release().await;
            }
            Err(e) => out.push(Violation {
                subject: name.to_string(),
                rule: "granted once faults stop".into(),
                detail: format!("not granted within {LIVENESS_BOUND:?} of healing: {e}"),
            }),
        }
    }
    let left = LIVENESS_BOUND.saturating_sub(from.elapsed());
    let r = sems
        .acquire_many(SEM_NAME, SEM_TOTAL, SEM_TOTAL, ttl, left)
        .await;
    world.log(format!(
        "probe {SEM_NAME}: {} after {}ms",
        r.is_ok(),
        from.elapsed().as_millis()
    ));
    match r {
        Ok(p) => {
            let _ = p.release().await;
        }
        Err(e) => out.push(Violation {
            subject: SEM_NAME.to_string(),
            rule: "all permits granted once faults stop".into(),
            detail: format!("not granted within {LIVENESS_BOUND:?} of healing: {e}"),
        }),
    }
    out
}
