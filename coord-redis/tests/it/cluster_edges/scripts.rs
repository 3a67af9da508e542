//! The server-side scripts on a cluster: cached on every master after
//! `connect`, and loaded again by the call alone on a node that lost them.

use std::sync::Arc;
use std::time::Duration;

use conformance::testkit::redis::RedisCluster;

use super::{blocking, cached_scripts, connect, name_on, works_within};

/// How many `SCRIPT LOAD`s each node of `c` has run (`INFO
/// commandstats`), by port.
fn script_loads(c: &RedisCluster) -> Vec<(u16, u64)> {
    c.nodes()
        .iter()
        .map(|n| {
            let stat = n.info("commandstats", "cmdstat_script|load");
            let calls = stat
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .map_or(0, |v| v.parse().unwrap());
            (n.port(), calls)
        })
        .collect()
}

/// A master that lost its script cache (a restarted or promoted node has
/// none; here `SCRIPT FLUSH`) gets each script's source with the call
/// (`EVAL`), on that node alone. A `SCRIPT LOAD` would go to every node
/// of the cluster and wait for every answer: one hung node, unrelated to
/// the key, would fail the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lost_its_scripts_gets_them_with_the_call_alone() {
    let cluster = Arc::new(blocking(RedisCluster::start).await);
    let prefix = "flushed:";
    let coord = connect(&cluster.url(), prefix).await.unwrap();
    let m1 = cluster.masters()[0].port();
    let c = cluster.clone();
    let name = blocking(move || name_on(&c, prefix, m1)).await;
    works_within(&coord, &name, Duration::from_secs(5))
        .await
        .unwrap();
    let c = cluster.clone();
    let before = blocking(move || {
        let m = c.nodes().iter().find(|n| n.port() == m1).unwrap();
        m.command(&["SCRIPT", "FLUSH"]);
        script_loads(&c)
    })
    .await;
    works_within(&coord, &name, Duration::from_secs(5))
        .await
        .unwrap();
    let c = cluster.clone();
    let (after, cached) = blocking(move || {
        let m = c.nodes().iter().find(|n| n.port() == m1).unwrap();
        (
            script_loads(&c),
            m.info("memory", "number_of_cached_scripts"),
        )
    })
    .await;
    assert_eq!(
        before, after,
        "SCRIPT LOADs by node (port, calls) before and after a call on the \
         flushed master {m1}"
    );
    assert_ne!(cached, "0", "the flushed master cached no script again");
}

/// After a client connected to a fresh cluster, every master has the
/// scripts cached, as the docs (coord-redis "Redis Cluster") and the
/// comment at the `SCRIPT LOAD` in `RedisBackend::connect` say. Replicas
/// have none: `SCRIPT LOAD` is routed to every node the cluster client has
/// a connection to, and it has none to replicas (it reads from masters
/// only). That does no harm: a promoted replica answers `NOSCRIPT` once
/// per script, and coord sends that call again with the source, to that
/// node alone (`a_node_that_lost_its_scripts_gets_them_with_the_call_alone`;
/// `a_client_goes_on_through_a_rolling_restart` checks it end to end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_cached_on_every_master_after_connect() {
    let cluster = Arc::new(blocking(RedisCluster::start).await);
    let _coord = connect(&cluster.url(), "scripts:").await.unwrap();
    let c = cluster.clone();
    let cached = blocking(move || cached_scripts(&c)).await;
    let on_masters = cached
        .iter()
        .find(|(_, role, _)| role == "master")
        .map(|(_, _, n)| n.clone())
        .unwrap();
    assert!(on_masters != "0", "{cached:?}");
    assert!(
        cached
            .iter()
            .filter(|(_, role, _)| role == "master")
            .all(|(_, _, n)| *n == on_masters),
        "number_of_cached_scripts (port, role, count): {cached:?}"
    );
}
