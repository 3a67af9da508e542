//! Faults on a 3-node etcd cluster, clients connected to every member:
//! the leader killed and restarted later, a follower frozen (a minority
//! partition), the leader frozen (it is cut off from the quorum, which
//! elects another; its clients' calls to it time out).

use std::sync::Arc;
use std::time::Duration;

use conformance::faults::{FaultLog, run_lock_workload};
use conformance::testkit::etcd::EtcdCluster;
use std::sync::Mutex;

use conformance::faults::LockReport;
use tokio::time::{Instant, sleep};

use super::common::*;

/// Beyond the TTL after a heal: an election (1 s election timeout) and
/// the new leader extends every lease by an election timeout on taking
/// over, on top of [`SLACK`].
pub const CLUSTER_SLACK: Duration = Duration::from_secs(4);

pub async fn cluster() -> Arc<EtcdCluster> {
    Arc::new(blocking(|| EtcdCluster::start(3)).await)
}

pub async fn leader(c: &Arc<EtcdCluster>) -> usize {
    let c = c.clone();
    blocking(move || {
        for _ in 0..100 {
            if let Some(l) = c.leader() {
                return l;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the cluster has no leader")
    })
    .await
}

/// The raft term of every member (`None`: it did not answer).
pub async fn terms(c: &Arc<EtcdCluster>) -> Vec<Option<u64>> {
    let c = c.clone();
    blocking(move || c.raft_terms()).await
}

/// Whether the cluster's raft term moved between two readings of every
/// member's: the leadership was interrupted in between (an election),
/// whoever won it, the same member included. `None` if either reading got
/// no answer at all.
pub fn term_moved(before: &[Option<u64>], after: &[Option<u64>]) -> Option<bool> {
    let highest = |t: &[Option<u64>]| t.iter().flatten().max().copied();
    Some(highest(before)? != highest(after)?)
}

/// Wait until the cluster is healthy again after a heal.
async fn wait_healthy(c: &Arc<EtcdCluster>) {
    let c = c.clone();
    let ok = blocking(move || c.wait_healthy(Duration::from_secs(20))).await;
    assert!(ok, "the cluster did not become healthy after the heal");
}

/// The leader is killed (SIGKILL) 2 s into the workload and restarted
/// 2 TTLs later on its data: the two others elect a leader and serve;
/// every rule holds (etcd's linearizable writes and leases survive a
/// leader change), and all progress after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_leader_killed() {
    let c = cluster().await;
    let eps = c.endpoints();
    let l = leader(&c).await;
    let (report, log) = run_lock_workload(
        clients(&eps, 5).await,
        "leader-killed",
        workload(true),
        leader_killed(&c, l),
    )
    .await;
    judge(&report, &log, "cluster-leader-killed", CLUSTER_SLACK);
}

/// Member `l` (the leader) killed (SIGKILL) 2 s from now and restarted on
/// its data 2 TTLs later; healed when it is back (then wait until the
/// cluster is healthy).
pub async fn leader_killed(c: &Arc<EtcdCluster>, l: usize) -> FaultLog {
    sleep(Duration::from_millis(2000)).await;
    let c2 = c.clone();
    blocking(move || c2.stop(l)).await;
    sleep(TTL * 2).await;
    let c2 = c.clone();
    blocking(move || c2.start_member(l)).await;
    let log = FaultLog::healed_now(1);
    wait_healthy(c).await;
    log
}

async fn pause_member(c: &Arc<EtcdCluster>, i: usize, at: &Mutex<Vec<Instant>>) -> FaultLog {
    sleep(Duration::from_millis(2000)).await;
    let c2 = c.clone();
    blocking(move || c2.pause(i)).await;
    at.lock().unwrap().push(Instant::now());
    sleep(TTL * 2).await;
    let c2 = c.clone();
    blocking(move || c2.resume(i)).await;
    at.lock().unwrap().push(Instant::now());
    let log = FaultLog::healed_now(1);
    wait_healthy(c).await;
    log
}

/// A follower is frozen (SIGSTOP) for 2 TTLs: the two others keep a
/// quorum. Calls that go to the frozen member time out, so clients must
/// not depend on it; all progress throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_follower_paused() {
    let c = cluster().await;
    let eps = c.endpoints();
    let l = leader(&c).await;
    let before = terms(&c).await;
    let f = (l + 1) % 3;
    let at = Mutex::default();
    let (mut report, log) = run_lock_workload(
        clients(&eps, 5).await,
        "follower-paused",
        workload(true),
        pause_member(&c, f, &at),
    )
    .await;
    dump_if_violated(&report, &at.into_inner().unwrap());
    // If the leadership was interrupted during the run (an election, which
    // the raft term counts, whoever won it: the frozen member may have led,
    // after an election the previous scenario left going, or the leader
    // stepped down and was elected again), the few-ms overlap around a
    // leader change is etcd's (see `cluster_leader_paused`). Comparing the
    // leader at the start and the end misses an election the same member
    // won. With one term throughout, an overlap is a violation.
    let now = leader(&c).await;
    let after = terms(&c).await;
    let moved = term_moved(&before, &after);
    println!("cluster-follower-paused: leader {l} -> {now}, raft terms {before:?} -> {after:?}");
    if now != l || moved == Some(true) {
        let waived = report.waive("one valid holder at a time");
        if waived > 0 {
            println!(
                "cluster-follower-paused: the leadership moved (leader {l} to {now}, raft \
                 terms {before:?} to {after:?}); waived {waived} overlap(s) (etcd-io/etcd#15247)"
            );
        }
    }
    judge(&report, &log, "cluster-follower-paused", CLUSTER_SLACK);
    let gap = longest_gap(&report);
    println!("cluster-follower-paused: longest gap between grants {gap:?}");
    assert!(
        gap <= TTL + CLUSTER_SLACK,
        "no grant for {gap:?} while a follower was frozen: the quorum should have served"
    );
}

/// The leader is frozen (SIGSTOP) for 2 TTLs: the others elect a new
/// leader; when it wakes it is a stale leader that must step down. All
/// progress after it resumes, and every rule holds but one, waived and
/// counted in the matrix: for a few ms after the resume, two guards can be
/// valid at once. Evidence (etcd 3.4.23, about 1 run in 8): the pause
/// began at +0 and ended at +4.005 s; client 0, queued since -84 ms, was
/// granted token 140 at +4.022 s and released at +4.042 s, while client 3
/// was granted token 150 at +4.025 s. Client 0's grant was confirmed by a
/// keepalive of its lease that reached the frozen old leader, which
/// renewed it in its own lessor on waking, still believing it was leader
/// (etcd-io/etcd#15247: a stale leader answers keepalives); the new
/// leader never saw that renewal and expired the lease, so client 3 got
/// the lock. Fencing held: client 0's write under token 140 was refused.
/// The client-side defence would be to trust a keepalive only if it was
/// answered in the current raft term (see the report).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_leader_paused() {
    let c = cluster().await;
    let eps = c.endpoints();
    let l = leader(&c).await;
    let at = Mutex::default();
    let (mut report, log) = run_lock_workload(
        clients(&eps, 5).await,
        "leader-paused",
        workload(true),
        pause_member(&c, l, &at),
    )
    .await;
    dump_if_violated(&report, &at.into_inner().unwrap());
    let waived = report.waive("one valid holder at a time");
    if waived > 0 {
        println!("cluster-leader-paused: waived {waived} overlap(s) (etcd-io/etcd#15247)");
    }
    judge(&report, &log, "cluster-leader-paused", CLUSTER_SLACK);
}

/// On a violation, print every grant near the fault, times relative to
/// the first instant of `at` (the fault's start).
pub(super) fn dump_if_violated(report: &LockReport, at: &[Instant]) {
    if report.violations.is_empty() || at.is_empty() {
        return;
    }
    let t0 = at[0];
    let rel = |t: Instant| {
        if t >= t0 {
            format!("+{:?}", t - t0)
        } else {
            format!("-{:?}", t0 - t)
        }
    };
    eprintln!(
        "fault instants: {:?}",
        at.iter().map(|t| rel(*t)).collect::<Vec<_>>()
    );
    let mut g = report.grants.clone();
    g.sort_by_key(|g| g.token);
    for g in g {
        eprintln!(
            "grant client={} token={} asked={} granted={} valid_until={}",
            g.client,
            g.token,
            rel(g.asked),
            rel(g.granted),
            rel(g.valid_until)
        );
    }
    for v in &report.violations {
        eprintln!("violation: {v}");
    }
}

/// Every workload at once on the 3-node cluster under random faults:
/// each client talks to one member (spread over the three) through a
/// proxy of its own (see `conformance::faults::random`). Run by
/// `scripts/faults --random`: `COORD_FAULT_SECONDS` sets how long,
/// `COORD_FAULT_SEED` replays a schedule.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "random fault schedules, run by scripts/faults --random"]
async fn random_faults_on_every_workload_on_a_cluster() {
    let c = cluster().await;
    let next = std::sync::atomic::AtomicUsize::new(0);
    conformance::faults::random::every_workload(
        "etcd-cluster",
        TTL,
        TTL + CLUSTER_SLACK + Duration::from_secs(1),
        conformance::faults::schedule(Duration::from_secs(20)),
        conformance::faults::random::seed(),
        |n| {
            let members: Vec<u16> = (0..n)
                .map(|_| c.client_port(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 3))
                .collect();
            async move {
                let proxies: Vec<conformance::testkit::proxy::FaultProxy> = members
                    .iter()
                    .map(|&m| conformance::testkit::proxy::FaultProxy::start(m))
                    .collect();
                let ports: Vec<u16> = proxies.iter().map(|p| p.port()).collect();
                (proxies, clients_via(&ports).await)
            }
        },
    )
    .await;
}
