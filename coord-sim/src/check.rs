//! The judges of a run: the conformance suite's history checkers, and a
//! liveness probe once the faults have stopped.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use conformance::faults::history::{FencedResource, check_lock_history};
use conformance::faults::permits::check_permit_history;
use conformance::faults::queue::{Effects, check_queue_history};
use coord_core::Coord;
use tokio::time::Instant;

use coord_core::RW_PERMITS;

use crate::queue_work::QUEUE_NAME;
use crate::workload::{CLAIM_NAMES, LEASE, RW_NAME, Recorded, SEM_NAME, SEM_TOTAL};
use crate::world::World;

/// How long after the faults stop a free lock (and the whole semaphore)
/// must be granted: the longest late copy (call timeout + 3 s), the
/// longest TTL it may leave (2 s), a cleanup's next send once the store
/// answers again (pauses of up to 5 s), with room to spare.
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

/// The instant a checker printed with `{:?}` (`Instant { tv_sec: S,
/// tv_nsec: N }` on Unix), in nanoseconds.
fn parse_instant(s: &str) -> Option<(u128, usize)> {
    let rest = s.strip_prefix("Instant { tv_sec: ")?;
    let (sec, rest) = rest.split_once(", tv_nsec: ")?;
    let (nsec, _) = rest.split_once(" }")?;
    let len = "Instant { tv_sec: ".len() + sec.len() + ", tv_nsec: ".len() + nsec.len() + 2;
    Some((
        sec.parse::<u128>().ok()? * 1_000_000_000 + nsec.parse::<u128>().ok()?,
        len,
    ))
}

/// `detail` with every instant printed as simulated time since `start`
/// (`@12.345s`), as the trace shows it.
pub fn readable(detail: &str, start: Instant) -> String {
    let Some((zero, _)) = parse_instant(&format!("{:?}", start.into_std())) else {
        return detail.to_string();
    };
    let mut out = String::new();
    let mut rest = detail;
    while let Some(i) = rest.find("Instant {") {
        out.push_str(&rest[..i]);
        match parse_instant(&rest[i..]) {
            Some((t, len)) => {
                let ms = t.saturating_sub(zero) as f64 / 1e6;
                out.push_str(&format!("@{:.3}s", ms / 1e3));
                rest = &rest[i + len..];
            }
            None => {
                out.push_str("Instant {");
                rest = &rest[i + "Instant {".len()..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Judge the recorded grants and the resources' accesses; instants in the
/// evidence are printed as simulated time since `start`.
pub fn history(rec: &Recorded, resources: &[FencedResource; 3], start: Instant) -> Vec<Violation> {
    let mut out = Vec::new();
    for (i, name) in CLAIM_NAMES.iter().enumerate() {
        for v in check_lock_history(&rec.grants[i], &resources[i].log()) {
            out.push(Violation {
                subject: name.to_string(),
                rule: v.rule.to_string(),
                detail: readable(&v.detail, start),
            });
        }
    }
    for v in check_permit_history(&rec.permits, SEM_TOTAL) {
        out.push(Violation {
            subject: SEM_NAME.to_string(),
            rule: v.rule.to_string(),
            detail: readable(&v.detail, start),
        });
    }
    for v in check_permit_history(&rec.rw, RW_PERMITS) {
        out.push(Violation {
            subject: RW_NAME.to_string(),
            rule: v.rule.to_string(),
            detail: readable(&v.detail, start),
        });
    }
    out
}

/// Judge the queue's deliveries, the registers' effects, and that every
/// pushed message was acked (in the run or by the drain).
pub fn queue(
    rec: &Recorded,
    effects: &Effects,
    drained: &HashSet<u64>,
    start: Instant,
) -> Vec<Violation> {
    let mut out: Vec<Violation> =
        check_queue_history(&rec.deliveries, &effects.log(), &rec.pushed, drained)
            .into_iter()
            .map(|v| Violation {
                subject: QUEUE_NAME.to_string(),
                rule: v.rule.to_string(),
                detail: readable(&v.detail, start),
            })
            .collect();
    out.extend(rec.stale_accepted.iter().map(|d| Violation {
        subject: QUEUE_NAME.to_string(),
        rule: "a stale delivery's ack and nack are refused".into(),
        detail: d.clone(),
    }));
    out
}

/// With faults off, every lock and the whole semaphore must be granted
/// to a fresh client within [`LIVENESS_BOUND`] of healing (the workload's
/// tasks are winding down meanwhile: each ends its current operation).
pub async fn liveness(world: Arc<World>, probe: Coord) -> Vec<Violation> {
    let mut out = Vec::new();
    let locks = probe.locks().expect("locks");
    let leases = probe.leases().expect("leases");
    let sems = probe.semaphores().expect("semaphores");
    let rw = probe.rw_locks().expect("read-write locks");
    let ttl = Duration::from_secs(1);
    let from = Instant::now();
    for (i, name) in CLAIM_NAMES.into_iter().enumerate() {
        let left = LIVENESS_BOUND.saturating_sub(from.elapsed());
        let r = if i == LEASE {
            lease_within(&leases, name, ttl, left).await
        } else {
            locks.acquire(name, ttl, left).await
        };
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
    let left = LIVENESS_BOUND.saturating_sub(from.elapsed());
    let r = rw.write(RW_NAME, ttl, left).await;
    world.log(format!(
        "probe {RW_NAME}: {} after {}ms",
        r.is_ok(),
        from.elapsed().as_millis()
    ));
    match r {
        Ok(g) => {
            let _ = g.release().await;
        }
        Err(e) => out.push(Violation {
            subject: RW_NAME.to_string(),
            rule: "write lock granted once faults stop".into(),
            detail: format!("not granted within {LIVENESS_BOUND:?} of healing: {e}"),
        }),
    }
    out
}

/// A lease on `name`, attempted every 100 ms for up to `left`.
async fn lease_within(
    leases: &coord_core::Leases,
    name: &str,
    ttl: Duration,
    left: Duration,
) -> coord_core::Result<coord_core::Guard> {
    let until = Instant::now() + left;
    loop {
        let r = leases.grant(name, ttl).await;
        match r {
            Ok(Some(g)) => return Ok(g),
            Ok(None) | Err(_) if Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Ok(None) => {
                return Err(coord_core::Error::Timeout {
                    operation: "lease grant",
                    name: name.to_string(),
                    waited: left,
                });
            }
            Err(e) => return Err(e),
        }
    }
}
