//! The election, barrier, limiter, semaphore, read-write lock and work
//! queue workloads of `conformance::faults`
//! on Redis, under real faults: one client cut off (or its replies lost)
//! by its proxy and healed, and the server frozen with `SIGSTOP` past the
//! TTL and resumed. Each asserts 0 violations and progress after the heal.

use std::sync::Arc;
use std::time::Duration;

use conformance::faults::{
    FaultLog, PermitKind, Report, fault_for, run_barrier_workload, run_election_workload,
    run_limiter_workload, run_permit_workload, run_queue_workload, scenarios, schedule,
};
use conformance::testkit::proxy::{FaultProxy, Mode};
use conformance::testkit::redis::RedisServer;

use super::{BACKEND, SLACK, TTL, client, clients};

const BARRIER_TIMEOUT: Duration = Duration::from_millis(1500);

fn run_for() -> Duration {
    schedule(Duration::from_secs(6))
}

fn judge(report: &Report, log: &FaultLog, scenario: &str, bound: Duration) {
    report.assert_ok(scenario, BACKEND, log.injected, bound);
}

async fn proxied(server: &RedisServer, n: usize) -> (Vec<FaultProxy>, Vec<coord_core::Coord>) {
    let proxies: Vec<FaultProxy> = (0..n).map(|_| FaultProxy::start(server.port())).collect();
    let ports: Vec<u16> = proxies.iter().map(|p| p.port()).collect();
    (proxies, clients(&ports).await)
}

/// Frozen past the TTL: `SIGSTOP` 1.5 s into the run, for 2 TTLs.
async fn paused(server: &Arc<RedisServer>) -> FaultLog {
    let (s, r) = (server.clone(), server.clone());
    fault_for(
        Duration::from_millis(1500),
        TTL * 2,
        move || s.pause(),
        move |()| r.resume(),
    )
    .await
}

/// 4 candidates and 2 observers, each behind its own proxy; the leader
/// and observer 0 are cut off for 2 TTLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn election_leader_cut_off() {
    let server = RedisServer::start();
    let (proxies, mut cs) = proxied(&server, 6).await;
    let observers = cs.split_off(4);
    let watch = client(server.port()).await;
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
    cut.assert_failover(&report, TTL + Duration::from_millis(500));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn election_server_paused() {
    let server = Arc::new(RedisServer::start());
    let ports = vec![server.port(); 6];
    let mut cs = clients(&ports).await;
    let observers = cs.split_off(4);
    let w = scenarios::election(TTL, run_for());
    let (report, log) = run_election_workload(cs, observers, "el-paused", w, paused(&server)).await;
    judge(
        &report,
        &log,
        "election-server-paused",
        TTL + SLACK + w.work,
    );
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
    let server = RedisServer::start();
    let (proxies, cs) = proxied(&server, 4).await;
    let w = scenarios::barrier(BARRIER_TIMEOUT, run_for());
    let hold = BARRIER_TIMEOUT * 2;
    let (report, log) =
        scenarios::barrier_participant_faulted(cs, &proxies, scenario, w, mode, hold).await;
    judge(&report, &log, scenario, BARRIER_TIMEOUT + SLACK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn barrier_server_paused() {
    let server = Arc::new(RedisServer::start());
    let cs = clients(&[server.port(); 4]).await;
    let w = scenarios::barrier(BARRIER_TIMEOUT, run_for());
    let (report, log) = run_barrier_workload(cs, "bar-paused", w, paused(&server)).await;
    judge(
        &report,
        &log,
        "barrier-server-paused",
        BARRIER_TIMEOUT + SLACK,
    );
}

/// 4 clients, each behind its own proxy; client 0's replies are lost for
/// 2 windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn limiter_replies_lost() {
    let server = RedisServer::start();
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
async fn limiter_server_paused() {
    let server = Arc::new(RedisServer::start());
    let cs = clients(&[server.port(); 4]).await;
    let w = scenarios::limiter(run_for());
    let (report, log) = run_limiter_workload(cs, "lim-paused", w, paused(&server)).await;
    judge(
        &report,
        &log,
        "limiter-server-paused",
        w.quota.window + SLACK,
    );
}

/// 5 clients on a semaphore of 3 permits (1 or 2 at a time), each behind
/// its own proxy; client 0 is cut off for 2 TTLs while it may hold
/// permits: never more than 3 valid at once, tokens unique and rising,
/// progress after the heal.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn semaphore_client_cut_off() {
    let server = RedisServer::start();
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

/// 5 clients on a read-write lock (every third acquire a write) while the
/// server is frozen past the TTL: a writer is always alone, tokens rise.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rwlock_server_paused() {
    let server = Arc::new(RedisServer::start());
    let cs = clients(&[server.port(); 5]).await;
    let w = scenarios::permits(PermitKind::RwLock { write_every: 3 }, TTL, run_for());
    let (report, log) = run_permit_workload(cs, "rw-paused", w, paused(&server)).await;
    judge(&report, &log, "rwlock-server-paused", TTL + SLACK + w.work);
}

/// 5 consumers of a work queue, each behind its own proxy; consumer 0 is
/// cut off for 2 visibilities (its deliveries lapse and go to others), or
/// its replies are lost (pops, acks and nacks applied but unheard): no
/// message lost or acked twice, no two valid deliveries of one message,
/// tokens unique and rising, progress after the heal.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_consumer_cut_off_or_replies_lost() {
    for (mode, scenario) in [
        (Mode::Blackhole, "queue-consumer-cut-off"),
        (Mode::DropReplies, "queue-consumer-replies-lost"),
    ] {
        let server = RedisServer::start();
        let (proxies, cs) = proxied(&server, 5).await;
        let w = scenarios::queue(TTL, run_for());
        let (report, log) =
            scenarios::queue_consumer_cut_off(cs, &proxies, scenario, w, mode, TTL * 2).await;
        judge(&report, &log, scenario, TTL + SLACK + w.work);
    }
}

/// 5 consumers of a work queue while the server is frozen past the
/// visibility: deliveries lapse on the server's clock, nothing is lost or
/// delivered twice at once, tokens rise.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_server_paused() {
    let server = Arc::new(RedisServer::start());
    let cs = clients(&[server.port(); 5]).await;
    let w = scenarios::queue(TTL, run_for());
    let (report, log) = run_queue_workload(cs, "queue-paused", w, paused(&server)).await;
    judge(&report, &log, "queue-server-paused", TTL + SLACK + w.work);
}

/// Every workload at once under random faults through the clients'
/// proxies (see `conformance::faults::random`). Run by `scripts/faults
/// --random`: `COORD_FAULT_SECONDS` sets how long, `COORD_FAULT_SEED`
/// replays a schedule.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "random fault schedules, run by scripts/faults --random"]
async fn random_faults_on_every_workload() {
    let server = RedisServer::start();
    conformance::faults::random::every_workload(
        BACKEND,
        TTL,
        TTL + SLACK + Duration::from_secs(1),
        schedule(Duration::from_secs(20)),
        conformance::faults::random::seed(),
        |n| proxied(&server, n),
    )
    .await;
}
