//! The election, barrier, limiter, semaphore, read-write lock and work queue workloads of `conformance::faults`
//! on PostgreSQL, under real faults: one client cut off (or its replies
//! lost) by its proxy and healed, and the whole server frozen with
//! `SIGSTOP` past the TTL and resumed. Each asserts 0 violations and
//! progress after the heal. One at a time (`SERIAL`), like the others.

use std::time::Duration;

use conformance::faults::{
    FaultLog, PermitKind, Report, fault_for, run_barrier_workload, run_election_workload,
    run_limiter_workload, scenarios, schedule,
};
use conformance::testkit::postgres::cluster;
use conformance::testkit::proxy::{FaultProxy, Mode};
use coord_core::Coord;

use super::{BACKEND, SERIAL, SLACK, TTL, client, clients, database, via};

const BARRIER_TIMEOUT: Duration = Duration::from_millis(1500);

fn run_for() -> Duration {
    schedule(Duration::from_secs(6))
}

fn judge(report: &Report, log: &FaultLog, scenario: &str, bound: Duration) {
    report.assert_ok(scenario, BACKEND, log.injected, bound);
}

/// A fresh database, `n` proxies to the server and one client behind each;
/// the database's direct URL.
async fn proxied(tag: &str, n: usize) -> (Vec<FaultProxy>, Vec<Coord>, String) {
    let (url, pg) = database(tag).await;
    let proxies: Vec<FaultProxy> = (0..n).map(|_| FaultProxy::start(pg.port())).collect();
    let urls: Vec<String> = proxies.iter().map(|p| via(pg, &url, p.port())).collect();
    (proxies, clients(&urls).await, url)
}

/// `n` clients of a fresh database, direct.
async fn direct(tag: &str, n: usize) -> Vec<Coord> {
    let (url, _) = database(tag).await;
    clients(&vec![url; n]).await
}

/// The whole server frozen past the TTL: `SIGSTOP` 1.5 s into the run,
/// for 2 TTLs.
async fn paused() -> FaultLog {
    fault_for(
        Duration::from_millis(1500),
        TTL * 2,
        || cluster().pause(),
        |pids| cluster().resume(&pids),
    )
    .await
}

/// 4 candidates and 2 observers, each behind its own proxy; the leader
/// and observer 0 are cut off for 2 TTLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn election_leader_cut_off() {
    let _serial = SERIAL.lock().await;
    let (proxies, mut cs, url) = proxied("el-cut", 6).await;
    let observers = cs.split_off(4);
    let watch = client(&url).await;
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
    let _serial = SERIAL.lock().await;
    let mut cs = direct("el-paused", 6).await;
    let observers = cs.split_off(4);
    let w = scenarios::election(TTL, run_for());
    let (report, log) = run_election_workload(cs, observers, "el-paused", w, paused()).await;
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
    let _serial = SERIAL.lock().await;
    let (proxies, cs, _) = proxied(scenario, 4).await;
    let w = scenarios::barrier(BARRIER_TIMEOUT, run_for());
    let hold = BARRIER_TIMEOUT * 2;
    let (report, log) =
        scenarios::barrier_participant_faulted(cs, &proxies, scenario, w, mode, hold).await;
    judge(&report, &log, scenario, BARRIER_TIMEOUT + SLACK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn barrier_server_paused() {
    let _serial = SERIAL.lock().await;
    let cs = direct("bar-paused", 4).await;
    let w = scenarios::barrier(BARRIER_TIMEOUT, run_for());
    let (report, log) = run_barrier_workload(cs, "bar-paused", w, paused()).await;
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
    let _serial = SERIAL.lock().await;
    let (proxies, cs, _) = proxied("lim-lost", 4).await;
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
    let _serial = SERIAL.lock().await;
    let cs = direct("lim-paused", 4).await;
    let w = scenarios::limiter(run_for());
    let (report, log) = run_limiter_workload(cs, "lim-paused", w, paused()).await;
    judge(
        &report,
        &log,
        "limiter-server-paused",
        w.quota.window + SLACK,
    );
}

/// 5 clients on a semaphore of 3 permits (1 or 2 at a time), each behind
/// its own proxy; client 0 is cut off for 2 TTLs: never more than 3 valid
/// at once, tokens unique and rising, progress after the heal.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn semaphore_client_cut_off() {
    let _serial = SERIAL.lock().await;
    let (proxies, cs, _) = proxied("sem-cut", 5).await;
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

/// A read-write lock (every third acquire a write) with client 0's replies
/// lost for 2 TTLs: a writer is always alone, tokens rise.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rwlock_replies_lost() {
    let _serial = SERIAL.lock().await;
    let (proxies, cs, _) = proxied("rw-lost", 5).await;
    let w = scenarios::permits(PermitKind::RwLock { write_every: 3 }, TTL, run_for());
    let (report, log) =
        scenarios::permit_client_cut_off(cs, &proxies, "rw-lost", w, Mode::DropReplies, TTL * 2)
            .await;
    judge(&report, &log, "rwlock-replies-lost", TTL + SLACK + w.work);
}

/// 5 consumers of a work queue, each behind its own proxy; consumer 0 is
/// cut off for 2 visibilities (its deliveries lapse and go to others), or
/// its replies are lost (pushes, pops, acks and nacks applied but unheard):
/// no message lost or acked twice, no two valid deliveries of one message,
/// tokens unique and rising, progress after the heal.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_consumer_cut_off_or_replies_lost() {
    let _serial = SERIAL.lock().await;
    for (mode, scenario) in [
        (Mode::Blackhole, "queue-consumer-cut-off"),
        (Mode::DropReplies, "queue-consumer-replies-lost"),
    ] {
        let (proxies, cs, _) = proxied(scenario, 5).await;
        let w = scenarios::queue(TTL, run_for());
        let (report, log) =
            scenarios::queue_consumer_cut_off(cs, &proxies, scenario, w, mode, TTL * 2).await;
        judge(&report, &log, scenario, TTL + SLACK + w.work);
    }
}

/// Every workload at once under random faults through the clients'
/// proxies (see `conformance::faults::random`). Run by `scripts/faults
/// --random`: `COORD_FAULT_SECONDS` sets how long, `COORD_FAULT_SEED`
/// replays a schedule.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "random fault schedules, run by scripts/faults --random"]
async fn random_faults_on_every_workload() {
    let _serial = SERIAL.lock().await;
    conformance::faults::random::every_workload(
        BACKEND,
        TTL,
        TTL + SLACK + Duration::from_secs(1),
        schedule(Duration::from_secs(20)),
        conformance::faults::random::seed(),
        |n| async move {
            let (proxies, clients, _) = proxied("random", n).await;
            (proxies, clients)
        },
    )
    .await;
}
