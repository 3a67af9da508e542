//! Semaphore and read-write lock workloads, and the checker of their
//! histories.
//!
//! Clients loop: take permits (a semaphore's 1 or 2 of `total`; a read
//! lock, or every `write_every`th time a write lock), hold them for `work`
//! while they are valid, record the grant, release. The checker verifies,
//! from the recorded history alone (all clients in this process, one
//! monotonic clock):
//!
//! 1. tokens are unique per grant;
//! 2. tokens rise in grant order: a grant asked for after another grant
//!    was returned carries a higher token;
//! 3. at no instant do the grants valid by their own deadlines hold more
//!    than the capacity: `total` permits (semaphores); one writer alone, or
//!    readers only (read-write locks: a writer weighs the whole capacity).
//!
//! Tested against hand-made histories that break each rule, and end to end
//! on the in-memory store against a semaphore that admits one permit too
//! many (coord-memory's `tests/it/faults.rs`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use coord_core::{Coord, PermitOptions, RW_PERMITS};
use tokio::time::{Instant, sleep};

use super::report::{Report, Run, expect_retryable, longest_stall};
use super::{FaultLog, Violation};

/// What the clients take.
#[derive(Debug, Clone, Copy)]
pub enum PermitKind {
    /// A semaphore of `total` permits; client `i` takes `1 + i % 2` at once.
    Semaphore {
        /// The semaphore's permits.
        total: u32,
    },
    /// A read-write lock; each client writes every `write_every`th time and
    /// reads otherwise.
    RwLock {
        /// How often a client takes the write lock (at least 1).
        write_every: u32,
    },
}

impl PermitKind {
    /// The capacity the checker holds valid grants to.
    pub fn capacity(self) -> u32 {
        match self {
            PermitKind::Semaphore { total } => total,
            PermitKind::RwLock { .. } => RW_PERMITS,
        }
    }
}

/// The shape of a semaphore or read-write lock workload.
#[derive(Debug, Clone, Copy)]
pub struct PermitWorkload {
    /// Semaphore or read-write lock.
    pub kind: PermitKind,
    /// Each grant's TTL.
    pub ttl: Duration,
    /// How long each acquire may wait.
    pub wait: Duration,
    /// Keep grants alive with the watchdog.
    pub watchdog: bool,
    /// How long a grant is held.
    pub work: Duration,
    /// How long the workload runs.
    pub duration: Duration,
}

/// One grant, as its client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PermitGrant {
    /// The client that held it.
    pub client: usize,
    /// Its fencing token.
    pub token: u64,
    /// How much of the capacity it takes (permits; a writer: all).
    pub weight: u32,
    /// When the client sent the acquire that was granted.
    pub asked: Instant,
    /// When the grant was returned.
    pub granted: Instant,
    /// When the client stopped relying on it (the release was about to be
    /// sent, or the local validity deadline, whichever came first).
    pub valid_until: Instant,
}

/// Judge a history against `capacity` (see the module doc).
pub fn check_permit_history(grants: &[PermitGrant], capacity: u32) -> Vec<Violation> {
    let mut v = Vec::new();
    let mut by_token: Vec<&PermitGrant> = grants.iter().collect();
    by_token.sort_by_key(|g| g.token);
    for w in by_token.windows(2) {
        if w[0].token == w[1].token {
            v.push(Violation {
                rule: "tokens are unique",
                detail: format!(
                    "token {} granted to client {} and client {}",
                    w[0].token, w[0].client, w[1].client
                ),
            });
        }
    }
    let mut by_granted: Vec<&PermitGrant> = grants.iter().collect();
    by_granted.sort_by_key(|g| g.granted);
    for (i, later) in by_granted.iter().enumerate() {
        for earlier in &by_granted[..i] {
            if later.asked > earlier.granted && later.token <= earlier.token {
                v.push(Violation {
                    rule: "tokens rise in grant order",
                    detail: format!(
                        "client {} asked after client {}'s grant (token {}) was returned and got token {}",
                        later.client, earlier.client, earlier.token, later.token
                    ),
                });
            }
        }
    }
    // Sweep the validity intervals; an interval ending at the instant
    // another starts does not overlap it.
    let mut events: Vec<(Instant, i64, usize)> = Vec::new();
    for g in grants.iter().filter(|g| g.valid_until > g.granted) {
        events.push((g.granted, i64::from(g.weight), g.client));
        events.push((g.valid_until, -i64::from(g.weight), g.client));
    }
    events.sort_by_key(|(t, w, _)| (*t, *w));
    let mut held = 0i64;
    for (t, w, client) in events {
        held += w;
        if held > i64::from(capacity) {
            v.push(Violation {
                rule: "at most the capacity is held at once",
                detail: format!(
                    "{held} of {capacity} held at once when client {client}'s grant began ({t:?})"
                ),
            });
        }
    }
    v
}

/// Run the workload on `name` with one task per client while `faults`
/// runs; then check the history.
pub async fn run_permit_workload<F>(
    clients: Vec<Coord>,
    name: &str,
    w: PermitWorkload,
    faults: F,
) -> (Report, FaultLog)
where
    F: std::future::Future<Output = FaultLog>,
{
    let run = Run::new();
    let mut tasks = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        let (stop, name) = (run.stop.clone(), name.to_string());
        tasks.push(tokio::spawn(async move {
            let (mut grants, mut errors, mut round) = (Vec::new(), 0usize, 0u32);
            while !stop.load(Ordering::SeqCst) {
                round += 1;
                let asked = Instant::now();
                let got = take(&c, &name, w, i, round).await;
                let (mut guard, weight) = match got {
                    Ok(g) => g,
                    Err(e) => {
                        expect_retryable(&format!("client {i}"), &e);
                        errors += 1;
                        sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let granted = Instant::now();
                if w.watchdog {
                    guard.keep_alive();
                }
                if guard.is_valid() {
                    sleep(w.work).await;
                }
                let now = Instant::now();
                let valid_until = if guard.is_valid() {
                    now
                } else {
                    guard.valid_until().min(now)
                };
                grants.push(PermitGrant {
                    client: i,
                    token: guard.fencing_token().get(),
                    weight,
                    asked,
                    granted,
                    valid_until,
                });
                if guard.release().await.is_err() {
                    errors += 1;
                }
            }
            (grants, errors)
        }));
    }
    let join = w.wait + w.ttl * 2 + Duration::from_secs(30);
    let (results, log, end) = run.finish(tasks, faults, w.duration, join).await;
    let (mut grants, mut errors) = (Vec::new(), 0);
    for (g, e) in results {
        grants.extend(g);
        errors += e;
    }
    let violations = check_permit_history(&grants, w.kind.capacity());
    let progress: Vec<Instant> = grants.iter().map(|g| g.granted).collect();
    let from = log.healed.unwrap_or(run.start);
    let writes = grants.iter().filter(|g| g.weight == RW_PERMITS).count();
    let report = Report {
        ops: grants.len(),
        errors,
        violations,
        longest_stall: longest_stall(&progress, from, end),
        waived: 0,
        extra: vec![("writes", writes as u64)],
        progress,
    };
    (report, log)
}

/// One acquire of the workload: the guard and its weight.
async fn take(
    c: &Coord,
    name: &str,
    w: PermitWorkload,
    client: usize,
    round: u32,
) -> coord_core::Result<(coord_core::Guard, u32)> {
    match w.kind {
        PermitKind::Semaphore { total } => {
            let n = (1 + (client as u32 % 2)).min(total);
            let opts = PermitOptions::new(total, w.ttl).permits(n).wait(w.wait);
            let p = c.semaphores()?.acquire_with(name, opts).await?;
            Ok((p.into_guard(), n))
        }
        PermitKind::RwLock { write_every } => {
            let rw = c.rw_locks()?;
            if round % write_every.max(1) == 0 {
                let g = rw.write(name, w.ttl, w.wait).await?;
                Ok((g.into_guard(), RW_PERMITS))
            } else {
                let g = rw.read(name, w.ttl, w.wait).await?;
                Ok((g.into_guard(), 1))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(b: Instant, client: usize, token: u64, weight: u32, ms: [u64; 3]) -> PermitGrant {
        let at = |n| b + Duration::from_millis(n);
        PermitGrant {
            client,
            token,
            weight,
            asked: at(ms[0]),
            granted: at(ms[1]),
            valid_until: at(ms[2]),
        }
    }

    fn rules(h: &[PermitGrant], cap: u32) -> Vec<&'static str> {
        check_permit_history(h, cap)
            .iter()
            .map(|v| v.rule)
            .collect()
    }

    #[test]
    fn a_clean_history_passes() {
        let b = Instant::now();
        // Two of three permits overlap, a third starts as one ends.
        let h = [
            g(b, 0, 1, 2, [0, 1, 10]),
            g(b, 1, 2, 1, [0, 2, 10]),
            g(b, 2, 3, 2, [5, 10, 20]),
        ];
        assert!(rules(&h, 3).is_empty(), "{:?}", check_permit_history(&h, 3));
    }

    #[test]
    fn each_broken_rule_is_found() {
        let b = Instant::now();
        let over = [g(b, 0, 1, 2, [0, 1, 10]), g(b, 1, 2, 2, [0, 2, 10])];
        assert_eq!(rules(&over, 3), ["at most the capacity is held at once"]);
        let dup = [g(b, 0, 7, 1, [0, 1, 2]), g(b, 1, 7, 1, [0, 3, 4])];
        assert!(rules(&dup, 3).contains(&"tokens are unique"));
        let back = [g(b, 0, 9, 1, [0, 1, 2]), g(b, 1, 5, 1, [3, 4, 5])];
        assert_eq!(rules(&back, 3), ["tokens rise in grant order"]);
        // A writer beside a reader.
        let rw = [g(b, 0, 1, 1, [0, 1, 10]), g(b, 1, 2, RW_PERMITS, [0, 5, 6])];
        assert_eq!(
            rules(&rw, RW_PERMITS),
            ["at most the capacity is held at once"]
        );
    }
}
