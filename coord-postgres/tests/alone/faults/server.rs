//! Faults of the server side: PostgreSQL frozen, crashed, its coord
//! backends terminated.

use std::time::Duration;

use conformance::faults::{FaultLog, run_lock_workload};
use conformance::testkit::postgres::cluster;
use tokio::time::sleep;

use super::{
    SERIAL, TTL, assert_woken_by_notify, blocking, clients, database, db_of, judge, workload,
};

/// The whole server (postmaster and every backend) is frozen with
/// `SIGSTOP` for 2 TTLs: every call times out, every holder's guard must
/// end by its local deadline, and the locks expire on the database clock
/// meanwhile. After `SIGCONT` all go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_paused_past_the_ttl() {
    let _serial = SERIAL.lock().await;
    let (url, pg) = database("paused").await;
    let cs = clients(&vec![url.clone(); 5]).await;
    let (report, log) = run_lock_workload(cs, "paused", workload(true), async {
        sleep(Duration::from_millis(2000)).await;
        let pids = blocking(|| cluster().pause()).await;
        println!("server-paused: froze {} processes", pids.len());
        sleep(TTL * 2).await;
        blocking(move || cluster().resume(&pids)).await;
        FaultLog::healed_now(1)
    })
    .await;
    judge(&report, &log, "server-paused");
    assert!(!pg.pids().is_empty());
}

/// A crash (`pg_ctl stop -m immediate`: no checkpoint, WAL replay at the
/// next start) in the middle of the workload, started again at once on the
/// same port. Grants are durable commits, so every rule holds, exclusivity
/// included, and fencing tokens never repeat (the checker judges both);
/// the pools and the LISTEN connections reconnect by themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_crash_restart() {
    let _serial = SERIAL.lock().await;
    let (url, _pg) = database("crash").await;
    let cs = clients(&vec![url.clone(); 5]).await;
    let listener = cs[0].clone();
    let (report, log) = run_lock_workload(cs, "crash", workload(true), crash_restart()).await;
    judge(&report, &log, "server-crash-restart");
    assert_woken_by_notify(&url, listener, "server-crash-restart").await;
}

/// The fault of both crash scenarios: 2 s in, PostgreSQL crashes
/// (`pg_ctl stop -m immediate`) and is started again at once.
pub(super) async fn crash_restart() -> FaultLog {
    sleep(Duration::from_millis(2000)).await;
    blocking(|| {
        cluster().crash();
        cluster().start();
    })
    .await;
    FaultLog::healed_now(1)
}

/// Terminate every backend of this database's coord clients
/// (`pg_terminate_backend`), pooled and LISTEN alike; returns (all,
/// listening).
/// How many LISTEN connections of coord clients `db` has.
fn listening_on(db: &str) -> usize {
    let out = cluster().psql(
        "postgres",
        &format!(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = '{db}' AND application_name = 'coord' AND query LIKE 'LISTEN%'"
        ),
    );
    out.trim().parse().unwrap()
}

fn terminate_coord_backends(db: &str) -> (usize, usize) {
    let out = cluster().psql(
        "postgres",
        &format!(
            "SELECT count(*), count(*) FILTER (WHERE query LIKE 'LISTEN%') \
             FROM (SELECT query, pg_terminate_backend(pid) AS t FROM pg_stat_activity \
                   WHERE datname = '{db}' AND application_name = 'coord' \
                   AND pid <> pg_backend_pid()) x WHERE t"
        ),
    );
    let mut f = out.trim().split('|').map(|s| s.parse::<usize>().unwrap());
    (f.next().unwrap(), f.next().unwrap())
}

/// Every coord connection of the workload's clients, pooled and LISTEN,
/// is terminated by the server (`pg_terminate_backend`) twice in the middle
/// of the workload: calls in flight fail as retryable, the pools replace
/// their connections, and the LISTEN connections come back (a release
/// wakes a waiter, not its poll).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_coord_backend_terminated() {
    let _serial = SERIAL.lock().await;
    let (url, _pg) = database("terminate").await;
    let db = db_of(&url);
    let cs = clients(&vec![url.clone(); 5]).await;
    let listener = cs[0].clone();
    let (report, log) = run_lock_workload(cs, "terminate", workload(true), async {
        let mut total = (0, 0);
        for _ in 0..2 {
            sleep(Duration::from_millis(1500)).await;
            // Every client's LISTEN connection up again (after the first
            // round: reconnected; how long that takes is the machine's),
            // so that each round terminates all five.
            let up_by = std::time::Instant::now() + Duration::from_secs(15);
            loop {
                let d = db.clone();
                let n = blocking(move || listening_on(&d)).await;
                if n >= 5 || std::time::Instant::now() >= up_by {
                    break;
                }
                sleep(Duration::from_millis(100)).await;
            }
            let d = db.clone();
            let (all, listening) = blocking(move || terminate_coord_backends(&d)).await;
            println!("terminate-backends: terminated {all} backends, {listening} listening");
            assert_eq!(
                listening, 5,
                "the LISTEN connection of every client was up and terminated"
            );
            total = (total.0 + all, total.1 + listening);
        }
        assert!(
            total.1 >= 5,
            "the LISTEN connection of every client was terminated: {total:?}"
        );
        assert!(total.0 > total.1, "pooled connections were terminated too");
        FaultLog::healed_now(2)
    })
    .await;
    judge(&report, &log, "terminate-backends");
    assert_woken_by_notify(&url, listener, "terminate-backends").await;
}
