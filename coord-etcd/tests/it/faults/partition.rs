//! A real minority partition of a 3-node etcd cluster: each member runs in
//! a network namespace of its own and one is cut off from the other two on
//! the network (`PartitionedEtcdCluster`, needs root) while it keeps
//! running and its clients stay connected to it; then the partition heals.
//! Unlike `cluster_follower_paused`/`cluster_leader_paused` (SIGSTOP), the
//! cut-off member is awake: it campaigns, answers its clients, and (a cut
//! leader) goes on believing it leads until it steps down.
//!
//! Four clients know every member (their calls to the cut-off member time
//! out and are retried, landing on the others); a fifth knows only the
//! member to be cut off, so it fails throughout the cut and must recover
//! after the heal. Each scenario also checks the cut is real: the cut-off
//! member loses its leader and cannot commit, while the majority has a
//! leader and commits.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::faults::{FaultLog, LockReport, LockWorkload, run_lock_workload};
use conformance::testkit::etcd::PartitionedEtcdCluster;
use coord_core::Coord;
use tokio::time::{Instant, sleep};

use super::cluster::dump_if_violated;
use super::common::*;

/// Beyond the TTL after a heal. The heal costs an election: the cut-off
/// member campaigned with ever higher terms (etcd 3.4 runs without
/// pre-vote), so on rejoining it makes the leader step down, and it cannot
/// win (its log is behind): a member with the whole log must time out
/// (1 to 2 s, randomized) and win, sometimes after a split vote (another 1
/// to 2 s); members redial the links first. Every follower heal here saw
/// one leader change, and the cluster healthy again up to 5 s after the
/// heal when the whole fault suite ran in parallel on 2 cores (up to 4 s
/// alone); a leader's heal usually saw none (the old leader rejoins as a
/// follower of the new term) and took well under a second.
const PARTITION_SLACK: Duration = Duration::from_secs(6);

/// How long the member stays cut off: more than 2 TTLs.
const CUT: Duration = Duration::from_millis(4300);

/// When the cut begins, from the workload's start.
const CUT_AT: Duration = Duration::from_millis(1000);

/// The longest a cut can last: `cut_off`'s two checks of the leaders
/// (each bounded by [`CUT`]) and its two writes ([`PUT_ALONE`],
/// [`PUT_MAJORITY`]) when they take longer than [`CUT`] itself, as on a
/// loaded machine.
const CUT_AT_MOST: Duration = Duration::from_millis(
    2 * CUT.as_millis() as u64 + PUT_ALONE.as_millis() as u64 + PUT_MAJORITY.as_millis() as u64,
);

/// How long the cut-off member is given to (wrongly) commit a write.
const PUT_ALONE: Duration = Duration::from_millis(1000);

/// How long the majority is given to commit a write.
const PUT_MAJORITY: Duration = Duration::from_secs(2);

/// The workload runs long enough for the cut however long it lasts, the
/// heal and TTL + [`PARTITION_SLACK`] of observation after it (a fixed
/// 15 s leaves too little to judge when the cut's checks take 7 s).
fn partition_workload() -> LockWorkload {
    let mut w = workload(true);
    let needed = CUT_AT + CUT_AT_MOST + TTL + PARTITION_SLACK + Duration::from_secs(1);
    w.duration = conformance::faults::schedule(needed);
    w
}

/// The partition scenarios run one at a time: each is three etcd members
/// and a saturating workload, and the fault binary runs its scenarios in
/// parallel on CI's 2 cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn partitioned() -> Arc<PartitionedEtcdCluster> {
    Arc::new(blocking(|| PartitionedEtcdCluster::start(3)).await)
}

/// Wait up to `limit` for `f` (a blocking kit probe) to hold.
async fn eventually<F>(c: &Arc<PartitionedEtcdCluster>, limit: Duration, f: F) -> bool
where
    F: Fn(&PartitionedEtcdCluster) -> bool + Send + 'static,
{
    let c = c.clone();
    blocking(move || {
        let until = std::time::Instant::now() + limit;
        while std::time::Instant::now() < until {
            if f(&c) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    })
    .await
}

/// The index of the client that knows only the member to be cut off.
const PINNED: usize = 4;

/// Four clients of every member, and a fifth ([`PINNED`]) of member
/// `only` alone.
async fn partition_clients(c: &PartitionedEtcdCluster, only: usize) -> Vec<Coord> {
    let mut out = clients(&c.endpoints(), 4).await;
    out.push(client(&[c.endpoint(only)]).await);
    out
}

/// What the cut looked like.
struct Cut {
    /// The majority's leader during the cut.
    majority_leader: usize,
}

const LEADER_CHANGES: &str = "etcd_server_leader_changes_seen_total";

/// [`CUT_AT`] into the workload, cut member `v` off for [`CUT`]; while it is
/// cut off, check the cut is real (`v` loses its leader and cannot
/// commit; the majority has another leader that commits); heal, and
/// note the fault's instants in `at`.
async fn cut_off(
    c: &Arc<PartitionedEtcdCluster>,
    v: usize,
    at: &Mutex<Vec<Instant>>,
    cut: &Mutex<Option<Cut>>,
) -> FaultLog {
    sleep(CUT_AT).await;
    let c2 = c.clone();
    blocking(move || c2.partition(v)).await;
    let t0 = Instant::now();
    at.lock().unwrap().push(t0);
    let alone = eventually(c, CUT, move |c| !c.has_leader(v)).await;
    assert!(alone, "member {v} still had a leader while cut off");
    let majority = eventually(c, CUT, move |c| c.leader().is_some_and(|l| l != v)).await;
    assert!(
        majority,
        "the majority had no leader of its own while {v} was cut off"
    );
    let c2 = c.clone();
    let (committed_alone, majority_leader, committed_majority, changes) = blocking(move || {
        let l = c2.leader().expect("the majority's leader");
        let alone = c2.put_through(v, PUT_ALONE);
        let majority = c2.put_through(l, PUT_MAJORITY);
        (alone, l, majority, c2.metric(l, LEADER_CHANGES, &[]))
    })
    .await;
    assert!(
        !committed_alone,
        "member {v} committed a write while cut off"
    );
    assert!(committed_majority, "the majority did not commit a write");
    // (If the checks took longer, the cut lasted as long as they did.)
    sleep(CUT.saturating_sub(t0.elapsed())).await;
    let c2 = c.clone();
    blocking(move || c2.heal()).await;
    at.lock().unwrap().push(Instant::now());
    let log = FaultLog::healed_now(1);
    let c2 = c.clone();
    let (ok, after) = blocking(move || {
        let ok = c2.wait_healthy(Duration::from_secs(20));
        (ok, c2.metric(majority_leader, LEADER_CHANGES, &[]))
    })
    .await;
    assert!(ok, "the cluster did not become healthy after the heal");
    println!(
        "member {v} cut off for {:?}, healthy {:?} after the heal; member {majority_leader} saw {} leader change(s) from the cut's checks to then",
        at.lock().unwrap()[1] - t0,
        log.healed.map(|h| h.elapsed()),
        after - changes
    );
    *cut.lock().unwrap() = Some(Cut { majority_leader });
    log
}

/// Check the workload (run from `start`) went on for TTL +
/// [`PARTITION_SLACK`] after the heal, so its progress was observed, then
/// judge.
fn judge_partition(report: &LockReport, log: &FaultLog, scenario: &str, start: Instant) {
    let healed = log.healed.expect("healed");
    let observed = (start + partition_workload().duration).saturating_duration_since(healed);
    println!("{scenario}: observed {observed:?} after the heal");
    assert!(
        observed >= TTL + PARTITION_SLACK,
        "{scenario}: the workload ended {observed:?} after the heal, too soon to judge"
    );
    judge(report, log, scenario, PARTITION_SLACK);
}

/// The client that knows only the cut-off member: granted nothing while
/// it was cut off (after the first second, for replies already on the
/// way), and granted again within TTL + [`PARTITION_SLACK`] of the heal
/// (the queue is FIFO, so it is its turn soon once it can reach the
/// leader again: a failure to recover would not show as a call failure,
/// since it would only wait out its acquires).
fn assert_pinned_client(report: &LockReport, at: &[Instant], scenario: &str) {
    let (cut, healed) = (at[0], at[1]);
    let pinned: Vec<Instant> = report
        .grants
        .iter()
        .filter(|g| g.client == PINNED)
        .map(|g| g.granted)
        .collect();
    let during = pinned
        .iter()
        .filter(|t| **t > cut + Duration::from_secs(1) && **t < healed)
        .count();
    let next = pinned.iter().filter(|t| **t >= healed).min();
    let next = next.map(|t| *t - healed);
    println!(
        "{scenario}: the cut-off member's own client: {} grants, {during} during the cut, next {next:?} after the heal",
        pinned.len()
    );
    assert_eq!(
        during, 0,
        "{scenario}: a client of the cut-off member was granted the lock"
    );
    assert!(
        next.is_some_and(|n| n <= TTL + PARTITION_SLACK),
        "{scenario}: the cut-off member's own client was not granted the lock within {:?} of the heal",
        TTL + PARTITION_SLACK
    );
}

/// A follower is cut off from the two others for [`CUT`] (> 2 TTLs): the
/// majority (leader included) keeps a quorum and serves; the follower's
/// own client fails until the heal; every rule holds; all progress after
/// the heal within TTL + [`PARTITION_SLACK`]; and the quorum never stops
/// serving for longer than an election after the heal could take.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_follower_partitioned() {
    let _one = ONE_AT_A_TIME.lock().await;
    let c = partitioned().await;
    let l = blocking({
        let c = c.clone();
        move || c.leader().expect("a leader")
    })
    .await;
    let f = (l + 1) % 3;
    let (at, cut) = (Mutex::default(), Mutex::default());
    let start = Instant::now();
    let (report, log) = run_lock_workload(
        partition_clients(&c, f).await,
        "follower-partitioned",
        partition_workload(),
        cut_off(&c, f, &at, &cut),
    )
    .await;
    dump_if_violated(&report, &at.lock().unwrap());
    let ml = cut.lock().unwrap().as_ref().map(|c| c.majority_leader);
    println!("cluster-follower-partitioned: leader {l}, cut {f}, majority leader {ml:?}");
    judge_partition(&report, &log, "cluster-follower-partitioned", start);
    assert_pinned_client(&report, &at.lock().unwrap(), "cluster-follower-partitioned");
    let gap = longest_gap(&report);
    println!("cluster-follower-partitioned: longest gap between grants {gap:?}");
    assert!(
        gap <= TTL + PARTITION_SLACK,
        "no grant for {gap:?} while a follower was cut off: the quorum should have served"
    );
}

/// The leader is cut off from the two others for [`CUT`]: they elect a
/// new leader while the old one still runs, still has clients, and
/// believes it leads until it misses a quorum for an election timeout
/// (check-quorum). Every rule holds, one valid holder at a time included
/// (nothing is waived): the stale leader does answer keepalives until it
/// steps down (etcd-io/etcd#15247, which `cluster_leader_paused` waives),
/// but only for an election timeout or two after the cut, while the new
/// leader, elected an election timeout or more after the cut, gives every
/// lease a full TTL plus an election timeout from its election, so a
/// guard extended by the stale leader ends before its lease does. (On a
/// violation the grants around the cut are printed.) After the heal all
/// progress within TTL + [`PARTITION_SLACK`].
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_leader_partitioned() {
    let _one = ONE_AT_A_TIME.lock().await;
    let c = partitioned().await;
    let l = blocking({
        let c = c.clone();
        move || c.leader().expect("a leader")
    })
    .await;
    let (at, cut) = (Mutex::default(), Mutex::default());
    let start = Instant::now();
    let (report, log) = run_lock_workload(
        partition_clients(&c, l).await,
        "leader-partitioned",
        partition_workload(),
        cut_off(&c, l, &at, &cut),
    )
    .await;
    dump_if_violated(&report, &at.lock().unwrap());
    let ml = cut.lock().unwrap().as_ref().map(|c| c.majority_leader);
    println!("cluster-leader-partitioned: old leader {l}, new leader {ml:?}");
    assert!(
        ml.is_some_and(|m| m != l),
        "no new leader while {l} was cut off"
    );
    judge_partition(&report, &log, "cluster-leader-partitioned", start);
    assert_pinned_client(&report, &at.lock().unwrap(), "cluster-leader-partitioned");
    let gap = longest_gap(&report);
    println!("cluster-leader-partitioned: longest gap between grants {gap:?}");
}
