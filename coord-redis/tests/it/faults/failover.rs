//! Data loss by failover: the clients' primary dies and a replica that
//! missed its last writes is promoted in its place.

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use conformance::faults::{FaultLog, run_lock_workload};
use conformance::testkit::proxy::FaultProxy;
use conformance::testkit::redis::RedisServer;
use tokio::time::sleep;

use super::{blocking, clients, judge, workload};

/// A proxy that forwards each new connection to whatever port `target`
/// holds at that moment: the clients' fixed address, moved to the
/// promoted replica at failover (as a virtual IP or a DNS switch would).
fn retargetable(target: Arc<AtomicU16>) -> FaultProxy {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the failover proxy");
    FaultProxy::with_listener(listener, move || {
        TcpStream::connect(("127.0.0.1", target.load(Ordering::SeqCst)))
    })
}

fn offset(server: &RedisServer, field: &str) -> u64 {
    let v = server.info("replication", field);
    v.parse()
        .unwrap_or_else(|_| panic!("INFO replication {field}: {v:?}"))
}

/// Failover to a replica that missed the last second of writes. The
/// replica syncs through a proxy; 2 s into the workload that link is
/// blackholed, the primary goes on for 1 s (grants, releases and tokens
/// the replica never sees), then it is killed (`SIGKILL`), the replica is
/// promoted (`REPLICAOF NO ONE`) and the clients' address moves to it.
///
/// What Redis's asynchronous replication cannot keep: a lock granted after
/// the replica's last sync is gone on the promoted replica while its guard
/// is still valid, so two guards may be valid at once (waived and counted
/// in the matrix; this is what fencing is for). What coord must keep,
/// and the checker judges: tokens rise in grant order and never repeat
/// (they are max(stored + 1, server µs), so a counter that came back older
/// does not matter), the fenced resource never goes back or loses an
/// update, and every client goes on after the failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_to_a_replica_that_missed_writes() {
    let primary = Arc::new(RedisServer::start());
    let replica = Arc::new(RedisServer::start());
    let link = FaultProxy::start(primary.port());
    {
        let (r, port) = (replica.clone(), link.port());
        blocking(move || r.replicate_from(port)).await;
    }
    let target = Arc::new(AtomicU16::new(primary.port()));
    let proxies: Vec<FaultProxy> = (0..5).map(|_| retargetable(target.clone())).collect();
    let ports: Vec<u16> = proxies.iter().map(FaultProxy::port).collect();
    let missed = Arc::new(AtomicU16::new(0));
    let (p, r, t, m) = (
        primary.clone(),
        replica.clone(),
        target.clone(),
        missed.clone(),
    );
    let proxies = Arc::new(proxies);
    let px = proxies.clone();
    let (mut report, log) = run_lock_workload(
        clients(&ports).await,
        "failover",
        workload(true),
        async move {
            sleep(Duration::from_millis(2000)).await;
            link.blackhole();
            sleep(Duration::from_millis(1000)).await;
            blocking(move || {
                let written = offset(&p, "master_repl_offset");
                p.kill();
                let seen = offset(&r, "slave_repl_offset");
                assert!(
                    written > seen,
                    "the replica missed nothing (primary at {written}, replica at {seen})"
                );
                m.store(1, Ordering::SeqCst);
                let promoted = r.command(&["REPLICAOF", "NO", "ONE"]);
                assert_eq!(
                    promoted.as_str(),
                    Some("OK"),
                    "REPLICAOF NO ONE: {promoted:?}"
                );
                t.store(r.port(), Ordering::SeqCst);
            })
            .await;
            // Connections to the dead primary are gone; new ones reach the
            // promoted replica.
            for proxy in px.iter() {
                proxy.reset();
            }
            FaultLog::healed_now(1)
        },
    )
    .await;
    assert_eq!(missed.load(Ordering::SeqCst), 1, "the failover did not run");
    report.waive("one valid holder at a time");
    judge(&report, &log, "failover-lagging-replica");
    drop(proxies);
}
