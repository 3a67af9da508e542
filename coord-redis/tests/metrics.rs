//! The wake-up subscriber's reconnect is counted
//! (`coord_reconnects_total{store="redis",what="subscriber"}`).

use std::time::Duration;

use conformance::testkit::redis as kit;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

#[test]
fn a_killed_subscriber_connection_is_counted_as_a_reconnect() {
    let server = kit::server();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let reconnects = move || {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(k, _, _, _)| {
                k.key().name() == "coord_reconnects_total"
                    && k.key()
                        .labels()
                        .any(|l| l.key() == "what" && l.value() == "subscriber")
                    && k.key()
                        .labels()
                        .any(|l| l.key() == "store" && l.value() == "redis")
            })
            .map(|(_, _, _, v)| match v {
                DebugValue::Counter(n) => n,
                other => panic!("not a counter: {other:?}"),
            })
            .sum::<u64>()
    };
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let coord = coord_redis::connect(&server.url()).await.unwrap();
                assert!(coord.capabilities().notifications);
                // Every subscriber connection of the server is cut: ours
                // reconnects.
                server.command(&["CLIENT", "KILL", "TYPE", "pubsub"]);
                let until = tokio::time::Instant::now() + Duration::from_secs(10);
                while reconnects() == 0 {
                    assert!(
                        tokio::time::Instant::now() < until,
                        "no reconnect counted within 10 s"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                drop(coord);
            })
    });
}
