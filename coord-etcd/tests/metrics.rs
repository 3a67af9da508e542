//! A watch that re-opens after its stream broke is counted
//! (`coord_reconnects_total{store="etcd",what="watch"}`): the shared
//! watches of elections, barriers and queue lanes.

use std::time::Duration;

use conformance::testkit::etcd::EtcdServer;
use conformance::testkit::proxy::FaultProxy;
use coord_core::Election;
use coord_etcd::{EtcdBackend, EtcdOptions};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// `coord_reconnects_total{store="etcd",what="watch"}` since the last
/// snapshot (the debugging recorder hands out increments since then).
fn watch_reconnects(snapshotter: &Snapshotter) -> u64 {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, _, _, _)| {
            let has = |l: &str, v: &str| k.key().labels().any(|x| x.key() == l && x.value() == v);
            k.key().name() == "coord_reconnects_total"
                && has("store", "etcd")
                && has("what", "watch")
        })
        .map(|(_, _, _, v)| match v {
            DebugValue::Counter(n) => n,
            other => panic!("not a counter: {other:?}"),
        })
        .sum()
}

#[test]
fn a_watch_reopened_after_a_reset_connection_is_counted_as_a_reconnect() {
    let server = EtcdServer::start();
    let proxy = FaultProxy::start(server.client_port());
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let url = format!(
                    "etcd://127.0.0.1:{}?timeout=500ms&connect_timeout=500ms",
                    proxy.port()
                );
                let b: std::sync::Arc<EtcdBackend> =
                    EtcdBackend::connect(EtcdOptions::parse(&url).unwrap())
                        .await
                        .unwrap();
                // An election observer's shared watch (watch.rs), opened
                // and running.
                let waiter = Election::subscribe(&*b, "m").await.unwrap();
                tokio::time::sleep(Duration::from_millis(500)).await;
                assert_eq!(watch_reconnects(&snapshotter), 0, "no reconnect yet");
                // Its connection is cut: the watch opens again.
                proxy.reset();
                let mut seen = 0;
                let until = tokio::time::Instant::now() + Duration::from_secs(10);
                while seen == 0 {
                    assert!(
                        tokio::time::Instant::now() < until,
                        "no watch reconnect counted within 10 s"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    seen += watch_reconnects(&snapshotter);
                }
                // One re-open, one count.
                tokio::time::sleep(Duration::from_millis(500)).await;
                seen += watch_reconnects(&snapshotter);
                assert_eq!(seen, 1, "one reset, one reconnect");
                drop(waiter);
            })
    });
}
