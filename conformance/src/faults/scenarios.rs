//! The election, barrier, limiter, semaphore, read-write lock and work queue fault
//! scenarios that are the same on
//! every networked store: the workloads' standard shapes, and the
//! scenarios that cut clients off through their own
//! [`FaultProxy`]. A backend's fault suite builds the clients (one proxy
//! each), calls one of these, and judges the report with its own bound;
//! for server faults it runs the workload itself with its kit's fault
//! (see [`fault_for`]).

use std::time::Duration;

use coord_core::{Algorithm, Coord, Quota};
use tokio::time::{Instant, sleep};

use super::election::candidate;
use super::{
    BarrierWorkload, ElectionWorkload, FaultLog, LimiterWorkload, PermitKind, PermitWorkload,
    QueueWorkload, Report, run_barrier_workload, run_election_workload, run_limiter_workload,
    run_permit_workload, run_queue_workload,
};
use crate::testkit::proxy::{FaultProxy, Mode};

/// A fault that starts `after` the call and lasts `hold`: `inject` (a
/// blocking kit call, run off the async workers) returns what `heal` needs
/// to undo it. Returns the log of that one fault, healed when `heal`
/// returned.
pub async fn fault_for<T, I, H>(after: Duration, hold: Duration, inject: I, heal: H) -> FaultLog
where
    T: Send + 'static,
    I: FnOnce() -> T + Send + 'static,
    H: FnOnce(T) + Send + 'static,
{
    sleep(after).await;
    let undo = tokio::task::spawn_blocking(inject)
        .await
        .expect("injecting the fault panicked");
    sleep(hold).await;
    tokio::task::spawn_blocking(move || heal(undo))
        .await
        .expect("healing the fault panicked");
    FaultLog::healed_now(1)
}

/// `proxies` set to `mode` (all at once) `after` the call, for `hold`,
/// then healed.
pub async fn proxies_for(
    proxies: &[&FaultProxy],
    mode: Mode,
    after: Duration,
    hold: Duration,
) -> FaultLog {
    sleep(after).await;
    for p in proxies {
        p.set(mode);
    }
    sleep(hold).await;
    for p in proxies {
        p.heal();
    }
    FaultLog::healed_now(1)
}

/// The election workload on a store with leadership TTL `ttl`: leaders
/// renew (watchdog) and lead 300 ms per term, so a fault often hits one
/// while it leads.
pub fn election(ttl: Duration, duration: Duration) -> ElectionWorkload {
    ElectionWorkload {
        ttl,
        wait: ttl * 3,
        keep_alive: true,
        work: Duration::from_millis(300),
        duration,
    }
}

/// The barrier workload: waits time out after `timeout`.
pub fn barrier(timeout: Duration, duration: Duration) -> BarrierWorkload {
    BarrierWorkload { timeout, duration }
}

/// The limiter workload: 20 admissions per fixed 1 s window, each client
/// checking every 10 ms.
pub fn limiter(duration: Duration) -> LimiterWorkload {
    LimiterWorkload {
        quota: Quota::new(20, Duration::from_secs(1), Algorithm::FixedWindow),
        changed_limit: None,
        pace: Duration::from_millis(10),
        duration,
    }
}

/// When [`election_leader_cut_off`] cut the leader off, and whom.
#[derive(Debug, Clone, Copy)]
pub struct LeaderCut {
    /// When the leader's proxy started dropping everything.
    pub cut: Instant,
    /// The candidate cut off, and its term if it was leading (else the
    /// office was vacant and candidate 0 was cut).
    pub candidate: usize,
    /// The term it led when cut, if it led.
    pub term: Option<u64>,
}

impl LeaderCut {
    /// Panic unless another candidate was elected within `bound` of the
    /// cut (docs/guarantees.md §4: after a leader dies a new one is elected within ttl
    /// + one wake-up); skipped, with a note, if nobody led at the cut.
    pub fn assert_failover(&self, report: &Report, bound: Duration) {
        let Some(term) = self.term else {
            println!("election-leader-cut-off: the office was vacant at the cut");
            return;
        };
        let next = report.first_after(self.cut);
        println!(
            "election-leader-cut-off: candidate {} (term {term}) cut; next term {next:?} later",
            self.candidate
        );
        assert!(
            next <= bound,
            "no new leader for {next:?} after the leader was cut off (bound {bound:?})"
        );
    }
}

/// The leader cut off: 1 s into the workload, the candidate leading
/// (asked through `watch`; candidate 0 if the office stays vacant) and
/// observer 0 are cut off (blackholed) for `hold`, then healed. The
/// others must elect a new leader (check it with
/// [`LeaderCut::assert_failover`]); the old one's term must never be
/// served again, observer 0 must catch up without going back. Each
/// candidate and observer is behind its own proxy (`proxies`: candidates
/// first).
pub async fn election_leader_cut_off(
    watch: &Coord,
    candidates: Vec<Coord>,
    observers: Vec<Coord>,
    proxies: &[FaultProxy],
    name: &str,
    w: ElectionWorkload,
    hold: Duration,
) -> (Report, FaultLog, LeaderCut) {
    let n = candidates.len();
    assert_eq!(proxies.len(), n + observers.len(), "one proxy per client");
    let cut = std::sync::Mutex::new(None);
    let faults = async {
        sleep(Duration::from_secs(1)).await;
        // Between a resignation and the next grant the office is vacant:
        // look again (for up to 1 s) to cut a leader, not a candidate. A
        // read that goes unanswered on a loaded machine is looked at again
        // the same way (the store is healthy here; nothing is cut yet).
        let elections = watch.elections().expect("elections");
        let mut leader = None;
        for _ in 0..20 {
            let seen = match elections.leader(name).await {
                Ok(seen) => seen,
                Err(e) if e.is_retryable() => None,
                Err(e) => panic!("the leader of the healthy store: {e}"),
            };
            leader = seen.and_then(|l| {
                let i = (0..n).find(|i| candidate(*i) == l.candidate)?;
                Some((i, l.term.get()))
            });
            if leader.is_some() {
                break;
            }
            sleep(Duration::from_millis(50)).await;
        }
        let i = leader.map_or(0, |(i, _)| i);
        for p in [&proxies[i], &proxies[n]] {
            p.blackhole();
        }
        *cut.lock().unwrap() = Some(LeaderCut {
            cut: Instant::now(),
            candidate: i,
            term: leader.map(|(_, t)| t),
        });
        sleep(hold).await;
        for p in [&proxies[i], &proxies[n]] {
            p.heal();
        }
        FaultLog::healed_now(1)
    };
    let (report, log) = run_election_workload(candidates, observers, name, w, faults).await;
    let cut = cut.into_inner().unwrap().expect("the leader was cut");
    (report, log, cut)
}

/// One participant faulted: participant 0 (each behind its own proxy in
/// `proxies`) has its traffic put in `mode` 1 s into the workload for
/// `hold`, then healed. [`Mode::Blackhole`]: it is cut off, the others'
/// waits time out (withdrawn) meanwhile. [`Mode::DropReplies`]: its
/// arrivals and withdrawals are applied but unheard, so its retries (same
/// arrival id) must count once and never join a later generation. Every
/// generation before, during and after must be whole.
pub async fn barrier_participant_faulted(
    participants: Vec<Coord>,
    proxies: &[FaultProxy],
    name: &str,
    w: BarrierWorkload,
    mode: Mode,
    hold: Duration,
) -> (Report, FaultLog) {
    let cut = [&proxies[0]];
    let faults = proxies_for(&cut, mode, Duration::from_secs(1), hold);
    run_barrier_workload(participants, name, w, faults).await
}

/// Replies lost: client 0's replies (each client behind its own proxy in
/// `proxies`) are dropped 1 s into the workload for `hold`, then healed:
/// its checks are applied and counted by the store but never reported
/// (quota spent, not reported); reported admissions must stay within the
/// quota, and admissions must resume after the heal.
pub async fn limiter_replies_lost(
    clients: Vec<Coord>,
    proxies: &[FaultProxy],
    key: &str,
    w: LimiterWorkload,
    hold: Duration,
) -> (Report, FaultLog) {
    let cut = [&proxies[0]];
    let faults = proxies_for(&cut, Mode::DropReplies, Duration::from_secs(1), hold);
    run_limiter_workload(clients, key, w, faults).await
}

/// The semaphore or read-write lock workload of the fault scenarios: the
/// store's lock TTL, the watchdog on, 20 ms held, 4 s waits.
pub fn permits(kind: PermitKind, ttl: Duration, duration: Duration) -> PermitWorkload {
    PermitWorkload {
        kind,
        ttl,
        wait: Duration::from_secs(4),
        watchdog: true,
        work: Duration::from_millis(20),
        duration,
    }
}

/// Client 0's proxy set to `mode` (cut off, or its replies lost) 1 s into
/// the permit workload, for `hold` (longer than the TTL, so its grants
/// expire under it), then healed.
pub async fn permit_client_cut_off(
    clients: Vec<Coord>,
    proxies: &[FaultProxy],
    name: &str,
    w: PermitWorkload,
    mode: Mode,
    hold: Duration,
) -> (Report, FaultLog) {
    let cut = [&proxies[0]];
    let faults = proxies_for(&cut, mode, Duration::from_secs(1), hold);
    run_permit_workload(clients, name, w, faults).await
}

/// The work queue workload of the fault scenarios: `visibility` (the
/// store's lock TTL), 20 ms of work under the watchdog, every 7th delivery nacked, a push
/// every 5 ms, 1 s pop waits.
pub fn queue(visibility: Duration, duration: Duration) -> QueueWorkload {
    QueueWorkload {
        visibility,
        wait: Duration::from_secs(1),
        work: Duration::from_millis(20),
        watchdog: true,
        nack_every: 7,
        push_every: Duration::from_millis(5),
        duration,
        drain: Duration::from_secs(20),
    }
}

/// Client 0's proxy set to `mode` (cut off, or its replies lost) 1 s into
/// the queue workload, for `hold` (longer than the visibility, so its
/// deliveries lapse and go to others), then healed.
pub async fn queue_consumer_cut_off(
    clients: Vec<Coord>,
    proxies: &[FaultProxy],
    queue: &str,
    w: QueueWorkload,
    mode: Mode,
    hold: Duration,
) -> (Report, FaultLog) {
    let cut = [&proxies[0]];
    let faults = proxies_for(&cut, mode, Duration::from_secs(1), hold);
    run_queue_workload(clients, queue, w, faults).await
}
