//! Masters frozen, killed or restarted while a client calls: the client
//! follows the promoted replica, goes on through a rolling restart, and
//! through a failover while an unrelated replica is frozen.

use std::sync::Arc;
use std::time::Duration;

use conformance::faults::woken_after_release;
use conformance::testkit::redis::{RedisCluster, RedisServer};
use tokio::time::Instant;

use super::{TTL, blocking, cached_scripts, connect, every_primitive, name_on, works_within};

/// The master serving a lock is frozen (`SIGSTOP`: a hung host) and
/// stays frozen; its replica takes over after the node timeout (1 s). A
/// client connected before, with every node as a seed (as the docs advise
/// and the test kit's `url()` does), must go on with that lock on the
/// promoted replica within a few seconds. The cluster client does not
/// leave a node that stops answering by itself; coord's background
/// rebuild after a timeout (`CommandConnection::replace`) does, provided
/// a frozen seed does not use up the whole connect limit (see
/// `a_client_connects_while_one_seed_is_frozen`): else the client's calls
/// time out for as long as the old master stays frozen, and a fresh
/// client cannot connect at all. With the frozen master left out of the
/// seeds the same client goes on within about a second
/// (`a_client_follows_the_replica_of_a_frozen_master_that_is_no_seed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_follows_the_replica_of_a_frozen_master() {
    frozen_master(true).await;
}

/// [`a_client_follows_the_replica_of_a_frozen_master`] with the frozen
/// master not among the client's seeds: the client goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_follows_the_replica_of_a_frozen_master_that_is_no_seed() {
    frozen_master(false).await;
}

/// Wait until `replica` reports itself master and `cluster_state:ok`
/// (asking only `replica`, as the old master may not answer).
fn wait_promoted(replica: &RedisServer) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let info = replica
            .try_command(&["CLUSTER", "INFO"])
            .ok()
            .and_then(|r| r.as_str().map(str::to_string))
            .unwrap_or_default();
        if replica.info("replication", "role") == "master" && info.contains("cluster_state:ok") {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "replica {} not promoted within 30 s",
            replica.port()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn frozen_master(seed: bool) {
    let cluster = Arc::new(blocking(RedisCluster::start).await);
    let prefix = "frozen:";
    let master = cluster.masters()[1].port();
    let c = cluster.clone();
    let (name, replica) =
        blocking(move || (name_on(&c, prefix, master), replica_of(&c, master).port())).await;
    let url = if seed {
        cluster.url()
    } else {
        let hosts: Vec<String> = cluster
            .nodes()
            .iter()
            .filter(|n| n.port() != master)
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    };
    let coord = connect(&url, prefix).await.unwrap();
    works_within(&coord, &name, Duration::from_secs(1))
        .await
        .unwrap();
    let c = cluster.clone();
    let promoted = blocking(move || {
        c.nodes()
            .iter()
            .find(|n| n.port() == master)
            .unwrap()
            .pause();
        let frozen = std::time::Instant::now();
        wait_promoted(c.nodes().iter().find(|n| n.port() == replica).unwrap());
        frozen.elapsed()
    })
    .await;
    let res = works_within(&coord, &name, Duration::from_secs(10)).await;
    let fresh = match connect(&url, prefix).await {
        Ok(f) => match f.locks().unwrap().try_acquire(&name, TTL).await {
            Ok(_) => "works".to_string(),
            Err(e) => format!("call: {e}"),
        },
        Err(e) => format!("connect: {e}"),
    };
    let c = cluster.clone();
    blocking(move || {
        c.nodes()
            .iter()
            .find(|n| n.port() == master)
            .unwrap()
            .resume()
    })
    .await;
    let t = res.unwrap_or_else(|e| {
        panic!(
            "master {master} frozen, replica {replica} promoted {promoted:?} later: the \
             client still fails 10 s after that ({e}); a fresh client: {fresh}"
        )
    });
    println!("promoted after {promoted:?}, the client went on {t:?} later; fresh: {fresh}");
    assert_eq!(fresh, "works");
}

/// A rolling restart: a master is killed (its replica promoted), started
/// again (it rejoins as a replica, with an empty script cache), then the
/// promoted replica is killed, so the restarted node is master again. A
/// client connected at the start goes on with its lock each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "slow, passes: about 18 s alone and over 20 s beside the other tests (a private cluster, two failovers and a restart)"]
async fn a_client_goes_on_through_a_rolling_restart() {
    let started = Instant::now();
    let cluster = Arc::new(blocking(RedisCluster::start).await);
    let prefix = "rolling:";
    let a = cluster.nodes()[0].port();
    let c = cluster.clone();
    let name = blocking(move || name_on(&c, prefix, a)).await;
    let coord = connect(&cluster.url(), prefix).await.unwrap();
    let c = cluster.clone();
    println!(
        "after connect: {:?}",
        blocking(move || cached_scripts(&c)).await
    );
    works_within(&coord, &name, Duration::from_secs(1))
        .await
        .unwrap();
    let c = cluster.clone();
    blocking(move || {
        let a = c.nodes().iter().find(|n| n.port() == a).unwrap();
        c.fail_over(a);
    })
    .await;
    let t = works_within(&coord, &name, Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("after the first failover: {e}"));
    println!("first failover: the client went on after {t:?}");
    let c = cluster.clone();
    blocking(move || {
        let an = c.nodes().iter().find(|n| n.port() == a).unwrap();
        an.start_again();
        c.wait_healthy(Duration::from_secs(30));
        println!("after the restart: {:?}", cached_scripts(&c));
    })
    .await;
    let c = cluster.clone();
    let n = name.clone();
    blocking(move || {
        let key = format!("{prefix}lock:{{{n}}}");
        let promoted = c.master_of(&key);
        assert_ne!(promoted.port(), a);
        c.fail_over(promoted);
        assert_eq!(
            c.master_of(&key).port(),
            a,
            "the restarted node is master again"
        );
        println!("after the second failover: {:?}", cached_scripts(&c));
    })
    .await;
    let t = works_within(&coord, &name, Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("after the second failover (the restarted node master): {e}"));
    println!("second failover: the client went on after {t:?}");
    every_primitive(&coord, &name).await.unwrap();
    // The client's wake-up subscription was on the first seed, the node
    // killed first: it moved, and wake-ups still reach it.
    let holder = connect(&cluster.url(), prefix).await.unwrap();
    let took = woken_after_release(&holder, coord, TTL).await;
    // From before the release call (its round trip included); the
    // waiter polls every 30 s (15 s at the soonest, jittered), so 3 s
    // still tells a wake-up from a poll on a loaded machine.
    assert!(took < Duration::from_secs(3), "woken after {took:?}");
    println!("rolling restart: {:?} in all", started.elapsed());
}

/// The replica of master `port` (by `master_port` of `INFO replication`).
fn replica_of(c: &RedisCluster, port: u16) -> &RedisServer {
    c.nodes()
        .iter()
        .find(|n| {
            n.try_command(&["PING"]).is_ok()
                && n.info("replication", "role") == "slave"
                && n.info("replication", "master_port") == port.to_string()
        })
        .expect("every master has a replica")
}

/// A master dies while a replica of ANOTHER master is frozen (not a
/// seed of the client). The promoted replica has no scripts cached (they
/// were loaded on the masters only), so coord's first call there gets
/// `NOSCRIPT` and reloads the script: the reload must not depend on the
/// frozen, unrelated node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_while_an_unrelated_replica_is_frozen() {
    let cluster = Arc::new(blocking(RedisCluster::start).await);
    let prefix = "unrelated:";
    let masters: Vec<u16> = cluster.masters().iter().map(|m| m.port()).collect();
    let (m1, m2) = (masters[0], masters[1]);
    let c = cluster.clone();
    let (name, r1, r2) = blocking(move || {
        (
            name_on(&c, prefix, m1),
            replica_of(&c, m1).port(),
            replica_of(&c, m2).port(),
        )
    })
    .await;
    let hosts: Vec<String> = cluster
        .nodes()
        .iter()
        .filter(|n| n.port() != r2)
        .map(|n| format!("127.0.0.1:{}", n.port()))
        .collect();
    let url = format!("redis+cluster://{}", hosts.join(","));
    let coord = connect(&url, prefix).await.unwrap();
    works_within(&coord, &name, Duration::from_secs(1))
        .await
        .unwrap();
    let c = cluster.clone();
    blocking(move || {
        c.nodes().iter().find(|n| n.port() == r2).unwrap().pause();
        let r1 = c.nodes().iter().find(|n| n.port() == r1).unwrap();
        println!(
            "scripts on the replica of the master: {}",
            r1.info("memory", "number_of_cached_scripts")
        );
        c.nodes().iter().find(|n| n.port() == m1).unwrap().kill();
        wait_promoted(r1);
    })
    .await;
    let res = works_within(&coord, &name, Duration::from_secs(10)).await;
    let res2 = every_primitive(&coord, &name).await;
    let c = cluster.clone();
    blocking(move || c.nodes().iter().find(|n| n.port() == r2).unwrap().resume()).await;
    let t = res.unwrap_or_else(|e| panic!("replica {r2} frozen, {m1} killed: {e}"));
    println!("the client went on after {t:?}");
    res2.unwrap_or_else(|e| panic!("replica {r2} frozen, {m1} killed: {e}"));
}
