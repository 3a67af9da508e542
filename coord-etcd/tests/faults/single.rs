//! Faults on a single etcd: a client cut off (also while it holds the
//! lock), the server frozen, the server killed and restarted, compactions
//! while waiters watch.

use std::sync::Arc;
use std::time::Duration;

use conformance::faults::run_lock_workload;
use conformance::testkit::etcd::EtcdServer;
use conformance::testkit::proxy::FaultProxy;
use coord_core::LockOptions;
use tokio::time::{Instant, sleep};

use super::common::*;

/// A victim client (own proxy) holds the lock, watchdog on, when the
/// workload starts; it is cut off for 2 TTLs: its guard must report the
/// loss, and the 4 workload clients must get the lock within TTL + `SLACK`
/// of the cut, never while the victim's guard was still valid. Then
/// workload client 0 (also behind a proxy) is cut off for 2 TTLs and must
/// recover after the heal, while the others keep going.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_cut_off_by_the_proxy() {
    let server = EtcdServer::start();
    let proxies: Vec<FaultProxy> = (0..5)
        .map(|_| FaultProxy::start(server.client_port()))
        .collect();
    let ports: Vec<u16> = proxies.iter().map(|p| p.port()).collect();
    let victim = clients_via(&ports[4..]).await.remove(0);
    let opts = LockOptions::new(TTL).watchdog(true);
    let guard = victim
        .locks()
        .unwrap()
        .acquire_with("cut-off", opts)
        .await
        .unwrap();
    let cut = std::sync::Mutex::new(None);
    let victim_valid = std::sync::Mutex::new(None);
    let mut w = workload(true);
    w.duration = w.duration.max(Duration::from_secs(13));
    let (report, log) = run_lock_workload(clients_via(&ports[..4]).await, "cut-off", w, async {
        sleep(Duration::from_millis(1000)).await;
        proxies[4].blackhole();
        *cut.lock().unwrap() = Some(Instant::now());
        sleep(TTL * 2).await;
        assert!(
            !guard.is_valid(),
            "the cut victim's guard is still valid after 2 TTLs"
        );
        tokio::time::timeout(Duration::from_millis(100), guard.lost())
            .await
            .expect("the cut victim's lost signal fired");
        proxies[4].heal();
        *victim_valid.lock().unwrap() = Some(guard.valid_until());
        let released = guard.release().await;
        assert!(
            released.as_ref().is_err_and(|e| e.is_ownership_lost()),
            "{released:?}"
        );
        sleep(Duration::from_millis(1000)).await;
        proxies[0].blackhole();
        sleep(TTL * 2).await;
        proxies[0].heal();
        healed(2)
    })
    .await;
    judge(&report, &log, "client-cut-off", SLACK);
    let cut = cut.into_inner().unwrap().unwrap();
    let first = first_grant_after(&report, cut);
    println!(
        "client-cut-off: first grant {:?} after the holder was cut off",
        first - cut
    );
    assert!(
        first - cut <= TTL + SLACK,
        "first grant {:?} after the holder was cut off",
        first - cut
    );
    let earliest = report.grants.iter().map(|g| g.granted).min().unwrap();
    let victim_valid = victim_valid.into_inner().unwrap().unwrap();
    assert!(
        earliest >= victim_valid && victim_valid <= cut + TTL,
        "a workload client got the lock while the cut victim's guard was still valid"
    );
    assert!(
        earliest >= cut,
        "a workload client got the lock while the victim held it"
    );
    // Client 0's cut: whatever it held or queued must be freed by its
    // lease, so the others never waited longer than TTL + SLACK.
    let gap = longest_gap(&report);
    println!("client-cut-off: longest gap between grants {gap:?}");
    assert!(
        gap <= TTL + SLACK + Duration::from_millis(500),
        "no grant for {gap:?} while a client was cut off"
    );
}

/// The server is frozen (`SIGSTOP`) for 2 TTLs; after `SIGCONT` the
/// leases still run (etcd does not expire leases on a frozen clock
/// retroactively, so holders' guards end by their local deadline while
/// the keys may outlive them: no overlap either way), and all go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_paused_past_the_ttl() {
    let server = Arc::new(EtcdServer::start());
    let eps = vec![server.endpoint()];
    let s = server.clone();
    let (report, log) =
        run_lock_workload(clients(&eps, 5).await, "paused", workload(true), async {
            sleep(Duration::from_millis(2000)).await;
            let s2 = s.clone();
            blocking(move || s2.pause()).await;
            sleep(TTL * 2).await;
            blocking(move || s.resume()).await;
            healed(1)
        })
        .await;
    judge(&report, &log, "server-paused", SLACK);
}

/// kill -9, restarted at once on the same port and data: held locks
/// survive (etcd persists every write before acknowledging it), so every
/// rule holds, exclusivity included, and tokens keep rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_killed_and_restarted() {
    let server = Arc::new(EtcdServer::start());
    let eps = vec![server.endpoint()];
    let s = server.clone();
    let (report, log) =
        run_lock_workload(clients(&eps, 5).await, "killed", workload(true), async {
            sleep(Duration::from_millis(2000)).await;
            blocking(move || {
                s.kill();
                s.start_again();
            })
            .await;
            healed(1)
        })
        .await;
    judge(&report, &log, "server-killed-restarted", SLACK);
}

/// Compactions at the current revision every 50 ms while waiters watch
/// their predecessors, and every 400 ms one client's connections are
/// closed (in turn) so its watches must be re-opened from a revision that
/// is likely compacted already: waiters must still be woken. Polling is set to
/// 30 s, so only the watches can wake a waiter within the wait (4 s): a
/// waiter left unwoken holds up the FIFO queue behind it for its whole
/// wait, which the bound on the gap between grants (one TTL) catches.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compaction_during_watches() {
    let server = EtcdServer::start();
    let proxies: Vec<FaultProxy> = (0..5)
        .map(|_| FaultProxy::start(server.client_port()))
        .collect();
    let ports: Vec<u16> = proxies.iter().map(|p| p.port()).collect();
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let compactions = std::sync::atomic::AtomicUsize::new(0);
    let (report, log) = run_lock_workload(
        clients_via(&ports)
            .await
            .into_iter()
            .map(|c| c.with_poll_interval(Duration::from_secs(30)))
            .collect(),
        "compaction",
        workload(true),
        async {
            let until = Instant::now() + Duration::from_secs(5);
            let mut n = 0;
            while Instant::now() < until {
                sleep(Duration::from_millis(50)).await;
                n += 1;
                if n % 8 == 4 {
                    proxies[(n / 8) % proxies.len()].reset();
                }
                let rev = raw
                    .get("x", None)
                    .await
                    .unwrap()
                    .header()
                    .unwrap()
                    .revision();
                if raw.compact(rev, None).await.is_ok() {
                    compactions.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
            healed(n)
        },
    )
    .await;
    let c = compactions.load(std::sync::atomic::Ordering::SeqCst);
    println!("compaction: {c} compactions");
    assert!(c >= 40, "only {c} compactions ran");
    judge(&report, &log, "compaction-during-watches", SLACK);
    let gap = longest_gap(&report);
    println!("compaction: longest gap between grants {gap:?}");
    assert!(
        gap <= TTL,
        "no grant for {gap:?} while compactions ran: a waiter was not woken"
    );
}
