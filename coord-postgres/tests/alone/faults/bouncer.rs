//! Faults with PgBouncer (transaction pooling) between the clients and
//! PostgreSQL: PgBouncer killed and restarted, PgBouncer frozen, and
//! PostgreSQL crashed behind it.

use std::sync::Arc;
use std::time::Duration;

use conformance::faults::{FaultLog, run_lock_workload};
use conformance::testkit::postgres::{PgBouncer, cluster};
use conformance::testkit::proxy::FaultProxy;
use coord_core::Coord;
use tokio::time::sleep;

use super::server::crash_restart;
use super::{
    SERIAL, SLACK, TTL, assert_woken_by_notify, blocking, client, client_with, database, db_of,
    judge, workload,
};

/// Five clients (see [`client`]) whose statements go through `bouncer`
/// and whose LISTEN connection goes to PostgreSQL directly (`listen_url`,
/// as PgBouncer's transaction pooling cannot carry LISTEN).
async fn clients_through(bouncer: &PgBouncer, url: &str) -> Vec<Coord> {
    let through = bouncer.url_for(&db_of(url));
    let mut cs = Vec::new();
    for _ in 0..5 {
        cs.push(client_with(&through, |b| b.listen_url(url)).await);
    }
    cs
}

/// PgBouncer frozen (`SIGSTOP`) for 2 TTLs mid-workload: every statement
/// times out (the connections stay open: no reset tells the client), every
/// holder's guard ends by its local deadline, the locks expire on the
/// database clock; after `SIGCONT` the statements that were queued in
/// PgBouncer run late (their replies are long abandoned) and all go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pgbouncer_paused_past_the_ttl() {
    let _serial = SERIAL.lock().await;
    let (url, _pg) = database("bouncer_paused").await;
    let bouncer = Arc::new(blocking(|| PgBouncer::start(cluster())).await);
    let cs = clients_through(&bouncer, &url).await;
    let b = bouncer.clone();
    let (report, log) = run_lock_workload(cs, "bouncer-paused", workload(true), async {
        sleep(Duration::from_millis(2000)).await;
        let b2 = b.clone();
        let pid = blocking(move || b2.pause()).await;
        sleep(TTL * 2).await;
        blocking(move || b.resume(pid)).await;
        FaultLog::healed_now(1)
    })
    .await;
    judge(&report, &log, "pgbouncer-paused");
    let c = client(&bouncer.url_for(&db_of(&url))).await;
    let g = c.locks().unwrap().try_acquire("after", TTL).await.unwrap();
    g.expect("free after the heal").release().await.unwrap();
}

/// PostgreSQL crashes (`pg_ctl stop -m immediate`) and starts again while
/// the clients talk to it through PgBouncer: PgBouncer's server
/// connections die, statements in flight fail (some committed, unheard),
/// PgBouncer reconnects to the new server by itself, and the direct LISTEN
/// connections come back. Grants are durable commits: every rule holds,
/// exclusivity included.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_crash_behind_pgbouncer() {
    let _serial = SERIAL.lock().await;
    let (url, _pg) = database("bouncer_crash").await;
    let bouncer = blocking(|| PgBouncer::start(cluster())).await;
    let cs = clients_through(&bouncer, &url).await;
    let listener = cs[0].clone();
    let (report, log) =
        run_lock_workload(cs, "bouncer-crash", workload(true), crash_restart()).await;
    judge(&report, &log, "server-crash-behind-pgbouncer");
    assert_woken_by_notify(&url, listener, "server-crash-behind-pgbouncer").await;
}

/// Statements through PgBouncer (transaction pooling), LISTEN direct
/// (`listen_url`). PgBouncer is killed (`SIGKILL`) mid-workload and
/// started again on the same port: every pooled connection drops at once,
/// statements in flight are lost (some committed, unheard), and the pools
/// must reconnect through the new PgBouncer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pgbouncer_restarted() {
    let _serial = SERIAL.lock().await;
    let (url, _pg) = database("bouncer").await;
    let bouncer = Arc::new(blocking(|| PgBouncer::start(cluster())).await);
    let cs = clients_through(&bouncer, &url).await;
    let b = bouncer.clone();
    let (report, log) = run_lock_workload(cs, "bouncer", workload(true), async {
        sleep(Duration::from_millis(2000)).await;
        blocking(move || b.restart()).await;
        FaultLog::healed_now(1)
    })
    .await;
    judge(&report, &log, "pgbouncer-restart");
    // The restarted PgBouncer still serves new clients.
    let c = client(&bouncer.url_for(&db_of(&url))).await;
    let g = c.locks().unwrap().try_acquire("after", TTL).await.unwrap();
    g.expect("free").release().await.unwrap();
}

/// Every workload at once under random faults, each client's statements
/// going through a proxy of its own to PgBouncer (transaction pooling)
/// and its LISTEN connection direct (see `conformance::faults::random`).
/// Run by `scripts/faults --random`: `COORD_FAULT_SECONDS` sets how long,
/// `COORD_FAULT_SEED` replays a schedule.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "random fault schedules, run by scripts/faults --random"]
async fn random_faults_on_every_workload_through_pgbouncer() {
    let _serial = SERIAL.lock().await;
    let bouncer = Arc::new(blocking(|| PgBouncer::start(cluster())).await);
    conformance::faults::random::every_workload(
        "postgres-pgbouncer",
        TTL,
        TTL + SLACK + Duration::from_secs(1),
        conformance::faults::schedule(Duration::from_secs(20)),
        conformance::faults::random::seed(),
        |n| {
            let bouncer = bouncer.clone();
            async move {
                let (url, _) = database("random_bouncer").await;
                let through = bouncer.url_for(&db_of(&url));
                let direct = format!(":{}/", bouncer.port());
                let mut proxies = Vec::new();
                let mut cs = Vec::new();
                for _ in 0..n {
                    let p = FaultProxy::start(bouncer.port());
                    let via = through.replace(&direct, &format!(":{}/", p.port()));
                    cs.push(client_with(&via, |b| b.listen_url(&url)).await);
                    proxies.push(p);
                }
                (proxies, cs)
            }
        },
    )
    .await;
}

/// A PgBouncer killed and not started again leaves its pid file behind,
/// and its pid free for any process to take: stopping that PgBouncer
/// afterwards signals no process that took the pid since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_killed_pgbouncer_spares_the_process_that_took_its_pid() {
    let _serial = SERIAL.lock().await;
    let bouncer = blocking(|| PgBouncer::start(cluster())).await;
    let pid = bouncer.pid().expect("pgbouncer wrote its pid file");
    conformance::testkit::postgres::signal(pid, "KILL");
    // Its wrapper ends on its own once its stdin is closed.
    let survived =
        blocking(move || conformance::testkit::pid_taker_survives(pid, || drop(bouncer))).await;
    assert!(
        survived,
        "stopping the killed pgbouncer killed pid {pid}, another process's by then"
    );
}
