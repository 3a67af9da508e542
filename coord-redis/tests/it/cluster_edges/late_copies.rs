//! Late copies on a Redis Cluster: a one-node cluster that announces a
//! fault proxy's port, so every connection the cluster client opens (its
//! seed's and the ones its slot map names) passes through the proxy, and
//! the late-copy scenarios of `conformance::late_copy` run against it. A
//! client on the node's own port, outside the cluster client, checks.
//!
//! What they catch: a cluster client that sends a request again after its
//! connection dropped or its answer did not come. The first copy may have
//! been applied, or may still be on its way, so the second applies it
//! twice (a push lands twice, a pop delivers to nobody).

use std::time::Duration;

use conformance::testkit::proxy::FaultProxy;
use conformance::testkit::redis::{RedisServer, Resp};
use coord_core::Coord;
use coord_redis::RedisOptions;

use super::blocking;

/// A one-node cluster (every slot on one master) behind a fault proxy:
/// the node, the proxy, a cluster client through the proxy (call timeout
/// 800 ms: above the 300 ms after which the late-copy scenarios cut a
/// held request's connection, so the client sees the cut while its call
/// still waits) and a plain client on the node's port.
async fn one_node_behind_a_proxy() -> (RedisServer, FaultProxy, Coord, Coord) {
    let (node, proxy) = blocking(|| {
        let node = RedisServer::start_with_config(
            "cluster-enabled yes\ncluster-config-file nodes.conf\ncluster-node-timeout 1000\n",
        );
        let proxy = FaultProxy::start(node.port());
        let port = proxy.port().to_string();
        let ok = Resp::Simple("OK".into());
        assert_eq!(
            node.command(&["CONFIG", "SET", "cluster-announce-port", &port]),
            ok
        );
        assert_eq!(
            node.command(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]),
            ok
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let info = node.command(&["CLUSTER", "INFO"]);
            let slots = format!("{:?}", node.command(&["CLUSTER", "SLOTS"]));
            if info
                .as_str()
                .unwrap_or_default()
                .contains("cluster_state:ok")
                && slots.contains(&format!("Int({port})"))
            {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the one-node cluster never became ready: {info:?}, {slots}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        (node, proxy)
    })
    .await;
    let via = RedisOptions::new(&format!("redis+cluster://127.0.0.1:{}", proxy.port()))
        .timeout(Duration::from_millis(800))
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect the cluster client through the proxy");
    let direct = RedisOptions::new(&node.url())
        .connect()
        .await
        .expect("connect to the node's own port");
    (node, proxy, via, direct)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_whose_connection_dropped_lands_once_on_a_cluster() {
    let (_node, proxy, via, direct) = one_node_behind_a_proxy().await;
    conformance::late_copy::late_push_lands_once(&via, &direct, &proxy, &conformance::unique("q"))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_dropped_pop_delivers_nothing_on_a_cluster() {
    let (_node, proxy, via, direct) = one_node_behind_a_proxy().await;
    conformance::late_copy::late_pop_with_one_delivery_allowed(
        &via,
        &direct,
        &proxy,
        &conformance::unique("q"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_dropped_barrier_arrival_counts_nowhere_on_a_cluster() {
    let (_node, proxy, via, direct) = one_node_behind_a_proxy().await;
    conformance::late_copy::late_copy_of_a_timed_out_barrier_arrival(
        &via,
        &direct,
        &proxy,
        &conformance::unique("b"),
    )
    .await;
}
