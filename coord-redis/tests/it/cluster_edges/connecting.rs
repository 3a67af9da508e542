//! Connecting through the nodes listed in the URL (the seeds): one of
//! them frozen, and only one live among many dead ones.

use std::sync::Arc;
use std::time::Duration;

use conformance::faults::woken_after_release;
use conformance::testkit::redis::{self as kit, RedisCluster, RedisServer};
use tokio::time::Instant;

use super::{TTL, blocking, connect, every_primitive};

/// `redis+cluster://` with `first` listed first, then every other node.
fn url_with_first(c: &RedisCluster, first: u16) -> String {
    let mut ports = vec![first];
    ports.extend(c.nodes().iter().map(|n| n.port()).filter(|&p| p != first));
    let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    format!("redis+cluster://{}", hosts.join(","))
}

/// The nodes that are replicas now.
fn replicas(c: &RedisCluster) -> Vec<&RedisServer> {
    c.nodes()
        .iter()
        .filter(|n| n.try_command(&["PING"]).is_ok() && n.info("replication", "role") == "slave")
        .collect()
}

/// One replica frozen (`SIGSTOP`: a hung host; one that accepts TCP
/// connections and never answers). It serves no slot, the cluster is
/// healthy, and the first seed is a live master: `connect` must succeed
/// and every primitive work. `redis`' cluster client waits for EVERY seed
/// up to its connection timeout, so that timeout must be well under the
/// limit coord puts on the whole connect (`Source::open`): were it
/// `connect_timeout` itself, one unresponsive seed out of six would make
/// every new client fail, and the docs' advice ("list several seeds, so a
/// client can start while one is down") would hold only for a seed that
/// refuses connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_connects_while_one_seed_is_frozen() {
    let cluster = Arc::new(blocking(RedisCluster::start).await);
    let c = cluster.clone();
    let port = blocking(move || {
        let r = replicas(&c)[0];
        r.pause();
        r.port()
    })
    .await;
    let first = cluster.masters()[0].port();
    let url = url_with_first(&cluster, first);
    let started = Instant::now();
    let res = connect(&url, "frozen:").await;
    let took = started.elapsed();
    let res = match res {
        Ok(coord) => every_primitive(&coord, "job").await,
        Err(e) => Err(format!("connect: {e}")),
    };
    let c = cluster.clone();
    blocking(move || {
        c.nodes()
            .iter()
            .find(|n| n.port() == port)
            .unwrap()
            .resume()
    })
    .await;
    res.unwrap_or_else(|e| panic!("replica {port} frozen, after {took:?}: {e}"));
}

/// Seeds that are dead for good (nothing listens: connection refused),
/// the first of them and all but one: the client connects through the
/// one that answers and discovers the rest of the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_connects_through_the_one_live_seed_of_many() {
    let live = kit::cluster().nodes()[0].port();
    let dead: Vec<u16> = (0..5)
        .map(|_| conformance::testkit::port::free_port())
        .collect();
    for hosts in [
        vec![dead[0], live],
        vec![dead[0], dead[1], dead[2], dead[3], dead[4], live],
        vec![dead[0], dead[1], live, dead[2]],
    ] {
        let hosts: Vec<String> = hosts.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let url = format!("redis+cluster://{}", hosts.join(","));
        let prefix = conformance::unique("dead-seeds") + ":";
        let c = connect(&url, &prefix)
            .await
            .unwrap_or_else(|e| panic!("{url}: connect: {e}"));
        every_primitive(&c, "job")
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        // Wake-ups still come, from whichever seed took the subscription.
        let w = connect(&url, &prefix).await.unwrap();
        let took = woken_after_release(&c, w, TTL).await;
        // From before the release call (its round trip included); the
        // waiter polls every 30 s (15 s at the soonest, jittered), so 3 s
        // still tells a wake-up from a poll on a loaded machine.
        assert!(took < Duration::from_secs(3), "{url}: woken after {took:?}");
    }
}
