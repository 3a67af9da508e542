//! Redis behind Sentinel beyond the conformance suite
//! (`conformance_sentinel`): coord finds the master through the sentinels,
//! and when the master is killed mid-workload and the sentinels promote
//! its replica, fencing stays safe while coord follows: its commands and
//! its wake-up subscription move to the new master.

use std::sync::Arc;
use std::time::Duration;

use conformance::faults::{FaultLog, LockWorkload, run_lock_workload, woken_after_release};
use conformance::testkit::redis::{self as kit, RedisSentinel};
use coord_core::{Coord, Error};
use coord_redis::RedisOptions;
use tokio::time::sleep;

const TTL: Duration = Duration::from_secs(1);

/// A client of `url` with short call timeouts, as a service with a 1 s
/// lock TTL would configure it.
async fn client(url: &str) -> Coord {
    RedisOptions::new(url)
        .timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect to the test Redis behind Sentinel")
}

/// Run `f` (a blocking kit call) off the async workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("a kit call panicked")
}

#[tokio::test]
async fn coord_writes_to_the_master_the_sentinels_name() {
    let url = kit::sentinel().url();
    let c = client(&url).await;
    assert_eq!(
        c.capabilities().deployment,
        coord_core::Deployment::Sentinel
    );
    let name = conformance::unique("on-master");
    let g = c
        .locks()
        .unwrap()
        .try_acquire(&name, Duration::from_secs(30))
        .await
        .unwrap()
        .expect("a free name");
    let key = format!("coord:lock:{{{name}}}");
    let on_master = blocking(move || kit::sentinel().master().command(&["EXISTS", &key])).await;
    assert_eq!(on_master.as_int(), Some(1), "the claim is on the master");
    g.release().await.unwrap();
}

#[tokio::test]
async fn an_unknown_master_name_or_no_sentinel_is_a_clear_error() {
    let url = kit::sentinel().url();
    let wrong = url.replace("/coord", "/nosuchmaster");
    let e = client_err(&wrong).await;
    assert!(
        matches!(&e, Error::Unavailable { message, .. } if message.contains("nosuchmaster")),
        "{e:?}"
    );
    let port = conformance::testkit::port::free_port();
    let e = client_err(&format!("redis+sentinel://:hunter2@127.0.0.1:{port}/coord")).await;
    assert!(matches!(&e, Error::Unavailable { .. }), "{e:?}");
    assert!(!e.to_string().contains("hunter2"), "{e}");
}

async fn client_err(url: &str) -> Error {
    RedisOptions::new(url)
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap_err()
}

/// The master is killed (`SIGKILL`) 2 s into a 5-client lock workload and
/// the sentinels promote its replica (down after 1 s, quorum 2).
///
/// What Redis's asynchronous replication cannot keep: a lock granted after
/// the replica's last sync is gone on the promoted replica while its guard
/// is still valid, so two guards may be valid at once (waived and counted;
/// this is what fencing is for). What coord must keep, and the checker
/// judges: tokens rise in grant order and never repeat, the fenced
/// resource never goes back or loses an update, and every client goes on
/// after the failover, on the new master; then a waiter connected before
/// the failover is woken by a release through its moved subscription (not
/// by its 30 s poll).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_master_killed_mid_workload_keeps_fencing_and_coord_follows_the_promoted_replica() {
    let d = Arc::new(blocking(RedisSentinel::start).await);
    let url = d.url();
    let mut clients = Vec::new();
    for _ in 0..5 {
        clients.push(client(&url).await);
    }
    let waiter = client(&url).await;
    let name = conformance::unique("sentinel-failover");
    let workload = LockWorkload {
        ttl: TTL,
        // At most half the recovery bound (see `LockWorkload::wait`).
        wait: Duration::from_secs(1),
        watchdog: true,
        work: Duration::from_millis(20),
        duration: Duration::from_secs(12),
    };
    let dd = d.clone();
    let (mut report, log) = run_lock_workload(clients, &name, workload, async move {
        sleep(Duration::from_secs(2)).await;
        let took = blocking(move || dd.fail_over()).await;
        println!("sentinel failover: the replica was promoted {took:?} after the kill");
        FaultLog::healed_now(1)
    })
    .await;
    let waived = report.waive("one valid holder at a time");
    println!("sentinel failover: {waived} overlapping validity windows waived");
    report.assert_ok(
        "sentinel-master-killed",
        "redis-sentinel",
        log.injected,
        TTL * 4,
    );
    report.assert_every_client_recovered("sentinel-master-killed", "redis-sentinel", TTL * 4);
    let dd = d.clone();
    let key = format!("coord:lock:{{{name}}}");
    let written = blocking(move || dd.master().command(&["EXISTS", &key])).await;
    println!("sentinel failover: the workload's claim on the new master: {written:?}");
    assert_woken_by_notification(&url, waiter).await;
}

/// `waiter` (subscribed before the failover) is woken by a release through
/// its subscription, not by its 30 s poll.
async fn assert_woken_by_notification(url: &str, waiter: Coord) {
    let took = woken_after_release(&client(url).await, waiter, TTL * 3).await;
    println!("sentinel failover: waiter woken {took:?} after the release");
    // From before the release call (its round trip included); the waiter
    // polls every 30 s (15 s at the soonest, jittered), so 3 s still tells a
    // wake-up from a poll on a loaded machine.
    assert!(
        took < Duration::from_secs(3),
        "the waiter was woken {took:?} after the release: its subscription did not move"
    );
}

/// A failover on command (`SENTINEL FAILOVER`) 2 s into a 5-client lock
/// workload: the old master keeps running as a replica and keeps the
/// clients' connections, answering every write with `READONLY`. coord must
/// ask the sentinels again and move to the new master, not retry the
/// demoted one forever; fencing and progress are judged as above (a
/// switch-over waits for the replica to catch up, so no grant is lost
/// here, but the rule is waived as for any Redis failover).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_switch_over_moves_coord_off_the_demoted_master() {
    let d = Arc::new(blocking(RedisSentinel::start).await);
    let url = d.url();
    let mut clients = Vec::new();
    for _ in 0..5 {
        clients.push(client(&url).await);
    }
    let waiter = client(&url).await;
    let name = conformance::unique("sentinel-switch");
    let workload = LockWorkload {
        ttl: TTL,
        // At most half the recovery bound (see `LockWorkload::wait`).
        wait: Duration::from_secs(1),
        watchdog: true,
        work: Duration::from_millis(20),
        duration: Duration::from_secs(8),
    };
    let dd = d.clone();
    let (mut report, log) = run_lock_workload(clients, &name, workload, async move {
        sleep(Duration::from_secs(2)).await;
        let took = blocking(move || dd.switch_over()).await;
        println!("sentinel switch-over: done {took:?} after the command");
        FaultLog::healed_now(1)
    })
    .await;
    let waived = report.waive("one valid holder at a time");
    println!("sentinel switch-over: {waived} overlapping validity windows waived");
    report.assert_ok(
        "sentinel-switch-over",
        "redis-sentinel",
        log.injected,
        TTL * 4,
    );
    report.assert_every_client_recovered("sentinel-switch-over", "redis-sentinel", TTL * 4);
    assert_woken_by_notification(&url, waiter).await;
}
