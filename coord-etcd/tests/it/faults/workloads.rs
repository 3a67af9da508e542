//! The election, barrier, limiter, semaphore, read-write lock and work queue workloads of `conformance::faults`
//! on etcd, under real faults: one client cut off (or its replies lost)
//! by its proxy and healed, on one server; and the leader of a 3-node
//! cluster killed and restarted later. Each asserts 0 violations and
//! progress after the heal.

use std::time::Duration;

use conformance::faults::{
    FaultLog, PermitKind, Report, run_barrier_workload, run_election_workload,
    run_limiter_workload, run_permit_workload, scenarios, schedule,
};
use conformance::testkit::etcd::EtcdServer;
use conformance::testkit::proxy::{FaultProxy, Mode};
use coord_core::Coord;

use super::cluster::{CLUSTER_SLACK, cluster, leader, leader_killed};
use super::common::*;

/// Barrier waits time out after this (a leader change takes ~1 s).
const BARRIER_TIMEOUT: Duration = Duration::from_secs(3);

/// Long enough that the killed leader's restart (4 s in) has a few
/// seconds after it.
fn run_for() -> Duration {
    schedule(Duration::from_secs(9))
}

fn judge(report: &Report, log: &FaultLog, scenario: &str, bound: Duration) {
    report.assert_ok(scenario, BACKEND, log.injected, bound);
}

/// One server, `n` proxies to it and one client behind each.
async fn proxied(server: &EtcdServer, n: usize) -> (Vec<FaultProxy>, Vec<Coord>) {
    let proxies: Vec<FaultProxy> = (0..n)
        .map(|_| FaultProxy::start(server.client_port()))
        .collect();
    let ports: Vec<u16> = proxies.iter().map(|p| p.port()).collect();
    (proxies, clients_via(&ports).await)
}

/// 4 candidates and 2 observers, each behind its own proxy; the leader
/// and observer 0 are cut off for 2 TTLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn election_leader_cut_off() {
    let server = EtcdServer::start();
    let (proxies, mut cs) = proxied(&server, 6).await;
    let observers = cs.split_off(4);
    let watch = client(&[server.endpoint()]).await;
    let w = scenarios::election(TTL, run_for());
    let (report, log, cut) =
        scenarios::election_leader_cut_off(&watch, cs, observers, &proxies, "el-cut", w, TTL * 2)
            .await;
    judge(
        &report,
        &log,
        "election-leader-cut-off",
        TTL + SLACK + w.work,
    );
    cut.assert_failover(&report, TTL + SLACK);
}

/// 4 candidates and 2 observers on every member of a 3-node cluster;
/// the cluster's leader is killed and restarted 2 TTLs later.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn election_cluster_leader_killed() {
    let c = cluster().await;
    let eps = c.endpoints();
    let l = leader(&c).await;
    let mut cs = clients(&eps, 6).await;
    let observers = cs.split_off(4);
    let w = scenarios::election(TTL, run_for());
    let faults = leader_killed(&c, l);
    let (report, log) = run_election_workload(cs, observers, "el-killed", w, faults).await;
    let bound = TTL + CLUSTER_SLACK + w.work;
    judge(&report, &log, "election-cluster-leader-killed", bound);
}

/// 4 participants, each behind its own proxy; participant 0 is cut off
/// for 2 barrier timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn barrier_participant_cut_off() {
    barrier_participant(Mode::Blackhole, "barrier-participant-cut-off").await;
}

/// 4 participants, each behind its own proxy; participant 0's replies are
/// lost for 2 barrier timeouts (its arrivals applied, unheard, retried).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn barrier_participant_replies_lost() {
    barrier_participant(Mode::DropReplies, "barrier-participant-replies-lost").await;
}

async fn barrier_participant(mode: Mode, scenario: &str) {
    let server = EtcdServer::start();
    let (proxies, cs) = proxied(&server, 4).await;
    let w = scenarios::barrier(BARRIER_TIMEOUT, run_for());
    let hold = BARRIER_TIMEOUT * 2;
    let (report, log) =
        scenarios::barrier_participant_faulted(cs, &proxies, scenario, w, mode, hold).await;
    judge(&report, &log, scenario, BARRIER_TIMEOUT + SLACK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn barrier_cluster_leader_killed() {
    let c = cluster().await;
    let l = leader(&c).await;
    let cs = clients(&c.endpoints(), 4).await;
    let w = scenarios::barrier(BARRIER_TIMEOUT, run_for());
    let faults = leader_killed(&c, l);
    let (report, log) = run_barrier_workload(cs, "bar-killed", w, faults).await;
    let bound = BARRIER_TIMEOUT + CLUSTER_SLACK;
    judge(&report, &log, "barrier-cluster-leader-killed", bound);
}

/// 4 clients, each behind its own proxy; client 0's replies are lost for
/// 2 windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn limiter_replies_lost() {
    let server = EtcdServer::start();
    let (proxies, cs) = proxied(&server, 4).await;
    let w = scenarios::limiter(run_for());
    let hold = w.quota.window * 2;
    let (report, log) = scenarios::limiter_replies_lost(cs, &proxies, "lim-lost", w, hold).await;
    judge(
        &report,
        &log,
        "limiter-replies-lost",
        w.quota.window + SLACK,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn limiter_cluster_leader_killed() {
    let c = cluster().await;
    let l = leader(&c).await;
    let cs = clients(&c.endpoints(), 4).await;
    let w = scenarios::limiter(run_for());
    let faults = leader_killed(&c, l);
    let (report, log) = run_limiter_workload(cs, "lim-killed", w, faults).await;
    let bound = w.quota.window + CLUSTER_SLACK;
    judge(&report, &log, "limiter-cluster-leader-killed", bound);
}

/// 5 clients on a semaphore of 3 permits (1 or 2 at a time), each behind
/// its own proxy; client 0 is cut off for 2 TTLs: never more than 3 valid
/// at once, tokens unique and rising, progress after the heal.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn semaphore_client_cut_off() {
    let server = EtcdServer::start();
    let (proxies, cs) = proxied(&server, 5).await;
    let w = scenarios::permits(PermitKind::Semaphore { total: 3 }, TTL, run_for());
    let (report, log) =
        scenarios::permit_client_cut_off(cs, &proxies, "sem-cut", w, Mode::Blackhole, TTL * 2)
            .await;
    judge(
        &report,
        &log,
        "semaphore-client-cut-off",
        TTL + SLACK + w.work,
    );
}

/// A read-write lock (every third acquire a write) on the 3-node cluster
/// while its leader is killed and restarted: a writer is always alone,
/// tokens rise, progress after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rwlock_cluster_leader_killed() {
    let c = cluster().await;
    let l = leader(&c).await;
    let cs = clients(&c.endpoints(), 5).await;
    let w = scenarios::permits(PermitKind::RwLock { write_every: 3 }, TTL, run_for());
    let (report, log) = run_permit_workload(cs, "rw-killed", w, leader_killed(&c, l)).await;
    judge(
        &report,
        &log,
        "rwlock-cluster-leader-killed",
        TTL + CLUSTER_SLACK + w.work,
    );
}

/// 5 consumers of a work queue on one server, each behind its own proxy;
/// consumer 0 cut off for 2 visibilities, or its replies lost: no message
/// lost or acked twice, no two valid deliveries of one message, tokens
/// unique and rising, progress after the heal.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_consumer_cut_off_or_replies_lost() {
    for (mode, scenario) in [
        (Mode::Blackhole, "queue-consumer-cut-off"),
        (Mode::DropReplies, "queue-consumer-replies-lost"),
    ] {
        let server = EtcdServer::start();
        let (proxies, cs) = proxied(&server, 5).await;
        let w = scenarios::queue(TTL, run_for());
        let (report, log) =
            scenarios::queue_consumer_cut_off(cs, &proxies, scenario, w, mode, TTL * 2).await;
        judge(&report, &log, scenario, TTL + SLACK + w.work);
    }
}

/// A work queue on the 3-node cluster while its leader is killed and
/// restarted: nothing lost or acked twice, tokens rise, progress after.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_cluster_leader_killed() {
    let c = cluster().await;
    let l = leader(&c).await;
    let cs = clients(&c.endpoints(), 5).await;
    let w = scenarios::queue(TTL, run_for());
    let (report, log) =
        conformance::faults::run_queue_workload(cs, "queue-killed", w, leader_killed(&c, l)).await;
    judge(
        &report,
        &log,
        "queue-cluster-leader-killed",
        TTL + CLUSTER_SLACK + w.work,
    );
}

/// Every workload at once under random faults through the clients'
/// proxies (see `conformance::faults::random`). Run by `scripts/faults
/// --random`: `COORD_FAULT_SECONDS` sets how long, `COORD_FAULT_SEED`
/// replays a schedule.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "random fault schedules, run by scripts/faults --random"]
async fn random_faults_on_every_workload() {
    let server = EtcdServer::start();
    conformance::faults::random::every_workload(
        BACKEND,
        TTL,
        TTL + SLACK + std::time::Duration::from_secs(1),
        schedule(std::time::Duration::from_secs(20)),
        conformance::faults::random::seed(),
        |n| proxied(&server, n),
    )
    .await;
}
