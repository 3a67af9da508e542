//! Redis Cluster beyond the conformance suite (`conformance_cluster`): the
//! names really spread over every master, what a cluster cannot take is
//! refused up front, and a master killed mid-workload (its replica
//! promoted) keeps fencing safe while coord follows the new master, its
//! commands and its wake-up subscription.

use std::sync::Arc;
use std::time::Duration;

use conformance::faults::{FaultLog, LockWorkload, run_lock_workload, woken_after_release};
use conformance::testkit::redis::{self as kit, RedisCluster};
use coord_core::{Coord, Error};
use coord_redis::{Layout, RedisOptions};
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
        .expect("connect to the test Redis Cluster")
}

/// Run `f` (a blocking kit call) off the async workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("a kit call panicked")
}

/// How many keys under `prefix` each running master holds (`KEYS`:
/// other tests add and remove keys of their own on the shared cluster
/// meanwhile, so a count of every key, `DBSIZE`, cannot tell this test's).
fn keys_per_master(c: &RedisCluster, prefix: &str) -> Vec<usize> {
    let pattern = format!("{prefix}*");
    c.masters()
        .iter()
        .map(|m| match m.command(&["KEYS", &pattern]) {
            kit::Resp::Array(Some(keys)) => keys.len(),
            other => panic!("KEYS on a master: {other:?}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_spread_over_every_master_and_each_lock_is_one_key() {
    let prefix = conformance::unique("spread") + ":";
    let c = RedisOptions::new(&kit::cluster().url())
        .prefix(prefix.clone())
        .connect()
        .await
        .unwrap();
    assert_eq!(c.capabilities().deployment, coord_core::Deployment::Cluster);
    assert!(!c.capabilities().exclusive_across_failover);
    let locks = c.locks().unwrap();
    let mut guards = Vec::new();
    for i in 0..48 {
        guards.push(
            locks
                .try_acquire(&format!("order:{i}"), Duration::from_secs(30))
                .await
                .unwrap()
                .expect("a free name"),
        );
    }
    let p = prefix.clone();
    let during = blocking(move || keys_per_master(kit::cluster(), &p)).await;
    assert_eq!(during.len(), 3, "three masters: {during:?}");
    assert!(
        during.iter().all(|&n| n >= 5),
        "48 names should land on every master: {during:?}"
    );
    assert_eq!(
        during.iter().sum::<usize>(),
        48,
        "each held lock is one key: {during:?}"
    );
    // Each held lock is exactly one key, on the master of its slot.
    let key = format!("{prefix}lock:{{order:7}}");
    let k = key.clone();
    let value = blocking(move || kit::cluster().master_of(&k).command(&["GET", &k])).await;
    assert!(value.as_str().is_some(), "`{key}` on its master: {value:?}");
    for g in guards {
        g.release().await.unwrap();
    }
}

#[tokio::test]
async fn what_a_cluster_cannot_take_is_a_config_error() {
    let url = kit::cluster().url();
    let e = RedisOptions::new(&url)
        .layout(Layout::Php)
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::Config(m) if m.contains("Layout::Coord")),
        "{e:?}"
    );
    let e = coord_redis::connect(&format!("{url}/2")).await.unwrap_err();
    assert!(
        matches!(&e, Error::Config(m) if m.contains("database 0")),
        "{e:?}"
    );
}

/// A lock name whose slot the master `port` serves.
fn name_on(c: &RedisCluster, port: u16) -> String {
    (0..)
        .map(|i| format!("failover-{i}"))
        .find(|n| c.master_of(&format!("coord:lock:{{{n}}}")).port() == port)
        .expect("some name hashes to every master")
}

/// The master serving the workload's lock is killed (`SIGKILL`) 2 s into
/// a 5-client lock workload and its replica takes over (cluster node
/// timeout 1 s). It is also the first node of the URL, where every
/// client's wake-up subscription is, so the subscriptions must move too.
///
/// What Redis's asynchronous replication cannot keep: a lock granted after
/// the replica's last sync is gone on the promoted replica while its guard
/// is still valid, so two guards may be valid at once (waived and counted;
/// this is what fencing is for). What coord must keep, and the checker
/// judges: tokens rise in grant order and never repeat (server µs, so the
/// promoted replica's older state does not matter), the fenced resource
/// never goes back or loses an update, and every client goes on after the
/// failover; then a waiter is woken by a release through its moved
/// subscription (not by its 30 s poll).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_master_killed_mid_workload_keeps_fencing_and_coord_follows_its_replica() {
    let cluster = Arc::new(blocking(RedisCluster::start).await);
    let first = cluster.nodes()[0].port();
    assert_eq!(
        blocking({
            let c = cluster.clone();
            move || c.nodes()[0].info("replication", "role")
        })
        .await,
        "master",
        "redis-cli made the first node a master"
    );
    let name = blocking({
        let c = cluster.clone();
        move || name_on(&c, first)
    })
    .await;
    let url = cluster.url();
    let mut clients = Vec::new();
    for _ in 0..5 {
        clients.push(client(&url).await);
    }
    let waiter = client(&url).await;
    let c = cluster.clone();
    let workload = LockWorkload {
        ttl: TTL,
        // At most half the recovery bound (see `LockWorkload::wait`).
        wait: Duration::from_secs(1),
        watchdog: true,
        work: Duration::from_millis(20),
        duration: Duration::from_secs(10),
    };
    let (mut report, log) = run_lock_workload(clients, &name, workload, async move {
        sleep(Duration::from_secs(2)).await;
        let took = blocking(move || {
            let master = &c.nodes()[0];
            c.fail_over(master)
        })
        .await;
        println!("cluster failover: the replica took over {took:?} after the kill");
        FaultLog::healed_now(1)
    })
    .await;
    let waived = report.waive("one valid holder at a time");
    println!("cluster failover: {waived} overlapping validity windows waived");
    report.assert_ok(
        "cluster-master-killed",
        "redis-cluster",
        log.injected,
        TTL * 4,
    );
    report.assert_every_client_recovered("cluster-master-killed", "redis-cluster", TTL * 4);
    assert_woken_by_notification(&url, waiter).await;
}

/// `waiter` (subscribed before the failover) is woken by a release through
/// its subscription, not by its 30 s poll.
async fn assert_woken_by_notification(url: &str, waiter: Coord) {
    let took = woken_after_release(&client(url).await, waiter, TTL * 3).await;
    println!("cluster failover: waiter woken {took:?} after the release");
    // From before the release call (its round trip included); the waiter
    // polls every 30 s (15 s at the soonest, jittered), so 3 s still tells a
    // wake-up from a poll on a loaded machine.
    assert!(
        took < Duration::from_secs(3),
        "the waiter was woken {took:?} after the release: its subscription did not move"
    );
}

/// The slot of the workload's lock moves to another master while 5
/// clients work on it, at once (the held claim itself is `MIGRATE`d), and
/// back again slowly (500 ms in the ASK phase, where the claim is created
/// on the importing master by `ASKING` clients), then `MOVED`: no data is
/// lost in a slot move, so every rule holds, mutual exclusion included,
/// and every client goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_moved_mid_workload_keeps_every_rule() {
    let name = conformance::unique("resharded");
    let key = format!("coord:lock:{{{name}}}");
    let url = kit::cluster().url();
    let mut clients = Vec::new();
    for _ in 0..5 {
        clients.push(client(&url).await);
    }
    let workload = LockWorkload {
        ttl: TTL,
        // At most half the recovery bound (see `LockWorkload::wait`).
        wait: Duration::from_secs(1),
        watchdog: true,
        work: Duration::from_millis(20),
        duration: Duration::from_secs(7),
    };
    let (report, log) = run_lock_workload(clients, &name, workload, async move {
        sleep(Duration::from_millis(1500)).await;
        let (moved, from, to) = blocking(move || {
            let c = kit::cluster();
            let from = c.master_of(&key).port();
            let to = c
                .masters()
                .into_iter()
                .find(|m| m.port() != from)
                .expect("another master");
            let there = c.migrate_slot(&key, to, Duration::ZERO);
            assert_eq!(c.master_of(&key).port(), to.port(), "the slot moved");
            std::thread::sleep(Duration::from_millis(1000));
            let back = c.nodes().iter().find(|n| n.port() == from).unwrap();
            let returned = c.migrate_slot(&key, back, Duration::from_millis(500));
            assert_eq!(c.master_of(&key).port(), from, "the slot moved back");
            ((there, returned), from, to.port())
        })
        .await;
        println!("resharding: slot moved from port {from} to {to} and back, keys moved {moved:?}");
        FaultLog::healed_now(1)
    })
    .await;
    report.assert_ok("cluster-slot-moved", "redis-cluster", log.injected, TTL * 2);
    report.assert_every_client_recovered("cluster-slot-moved", "redis-cluster", TTL * 2);
}
