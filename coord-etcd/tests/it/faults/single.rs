//! Faults on a single etcd: a client cut off (also while it holds the
//! lock), the server frozen, the server killed and restarted, compactions
//! while waiters watch.

use std::sync::Arc;
use std::time::Duration;

use conformance::faults::{FaultLog, cut_off_victim, run_lock_workload};
use conformance::testkit::etcd::EtcdServer;
use conformance::testkit::proxy::FaultProxy;
use etcd_client::CompactionOptions;
use tokio::time::{Instant, sleep};

use super::common::*;

/// One-way latency of each client's link in `compaction_during_watches`.
const LINK_LATENCY: Duration = Duration::from_millis(15);

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
    let mut w = workload(true);
    w.duration = w.duration.max(Duration::from_secs(13));
    let (report, log, cut) = cut_off_victim(
        "cut-off",
        &victim,
        &proxies[4],
        &proxies[0],
        clients_via(&ports[..4]).await,
        w,
    )
    .await;
    judge(&report, &log, "client-cut-off", SLACK);
    cut.assert_handover(&report, TTL, TTL + SLACK);
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
            FaultLog::healed_now(1)
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
            FaultLog::healed_now(1)
        })
        .await;
    judge(&report, &log, "server-killed-restarted", SLACK);
}

/// `COMPACTIONS` compactions, each at the current revision (higher than the
/// last), waited for until applied (physically), 50 ms apart, while
/// waiters watch their predecessors; every `RESET_EVERY`th, one client's
/// connections are closed (in turn, each client `COMPACTIONS / RESET_EVERY
/// / 5` times), so its watch must be re-opened from a revision that is
/// compacted by then: etcd cancels that watch with the compact revision,
/// and the waiter must be woken by that (to attempt again and watch anew).
/// The counts are fixed, however long they take (bounded), so the test
/// does not depend on the machine's speed. Polling is set to 30 s, so only
/// the watches can wake a waiter within the wait (8 s): a waiter left
/// unwoken holds up the FIFO queue behind it until its wait ends, which
/// the bound on the gap between grants (4 s) catches. The bound leaves
/// room for a holder whose release a reset lost (its lock lapses a TTL
/// and etcd's expiry lag later) on a loaded machine; the wait is twice it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compaction_during_watches() {
    const COMPACTIONS: usize = 40;
    const RESET_EVERY: usize = 4;
    const GAP: Duration = Duration::from_secs(4);
    let mut w = workload(true);
    w.wait = GAP * 2;
    let server = EtcdServer::start();
    let proxies: Vec<FaultProxy> = (0..5)
        .map(|_| FaultProxy::start(server.client_port()))
        .collect();
    for p in &proxies {
        // Calls as slow as on a server with slow disk writes, where this
        // test found a waiter whose attempt a reset failed sleeping out its
        // wait unqueued (tests/it/lock_waiters.rs): resets land mid-call more
        // often.
        p.latency(LINK_LATENCY);
    }
    let ports: Vec<u16> = proxies.iter().map(|p| p.port()).collect();
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let (report, log) = run_lock_workload(
        clients_via(&ports)
            .await
            .into_iter()
            .map(|c| c.with_poll_interval(Duration::from_secs(30)))
            .collect(),
        "compaction",
        w,
        async {
            let until = Instant::now() + Duration::from_secs(120);
            let (mut done, mut resets, mut last) = (0, 0, 0);
            while done < COMPACTIONS {
                assert!(
                    Instant::now() < until,
                    "only {done} compactions in 120 s (the workload writes no more?)"
                );
                sleep(Duration::from_millis(50)).await;
                let rev = raw
                    .get("x", None)
                    .await
                    .unwrap()
                    .header()
                    .unwrap()
                    .revision();
                if rev <= last {
                    continue;
                }
                raw.compact(rev, Some(CompactionOptions::new().with_physical()))
                    .await
                    .unwrap_or_else(|e| panic!("compaction at {rev} failed: {e}"));
                last = rev;
                done += 1;
                if done % RESET_EVERY == 0 {
                    proxies[resets % proxies.len()].reset();
                    resets += 1;
                }
            }
            println!("compaction: {done} compactions, {resets} connection resets");
            FaultLog::healed_now(done)
        },
    )
    .await;
    // The recovery bound must be at least twice the wait (an acquire that
    // waits it out counts as answered only when it ends).
    judge(
        &report,
        &log,
        "compaction-during-watches",
        (w.wait * 2).saturating_sub(TTL).max(SLACK),
    );
    let gap = longest_gap(&report);
    println!("compaction: longest gap between grants {gap:?}");
    assert!(
        gap <= GAP,
        "no grant for {gap:?} while compactions ran: a waiter was not woken"
    );
}
