//! The LISTEN connection's reconnect is counted
//! (`coord_reconnects_total{store="postgres",what="listen"}`).

use std::time::Duration;

use conformance::testkit::postgres::cluster;
use metrics_util::debugging::{DebuggingRecorder, Snapshotter};

/// `coord_reconnects_total{store="postgres",what="listen"}` since the last
/// snapshot.
fn listen_reconnects(snapshotter: &Snapshotter) -> u64 {
    conformance::metrics::reconnects(snapshotter, "postgres", "listen")
}

/// Terminate the sessions of `db` that have run LISTEN; returns how many.
fn terminate_listeners(db: &str) -> u64 {
    cluster()
        .psql(
            "postgres",
            &format!(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE datname = '{db}' AND query LIKE 'LISTEN%' AND pid <> pg_backend_pid()"
            ),
        )
        .trim()
        .parse()
        .expect("a count")
}

#[test]
fn a_terminated_listen_connection_is_counted_as_a_reconnect() {
    let db = format!("metrics_listen_{}", std::process::id());
    let url = cluster().create_database(&db);
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let coord = coord_postgres::connect(&url).await.unwrap();
                assert!(
                    coord.capabilities().notifications,
                    "a direct connection must LISTEN"
                );
                assert_eq!(listen_reconnects(&snapshotter), 0, "no reconnect yet");
                let until = tokio::time::Instant::now() + Duration::from_secs(10);
                // The LISTEN session, seen by the server once it ran LISTEN.
                while terminate_listeners(&db) == 0 {
                    assert!(
                        tokio::time::Instant::now() < until,
                        "no LISTEN session of {db} seen within 10 s"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let mut seen = 0;
                while seen == 0 {
                    assert!(
                        tokio::time::Instant::now() < until,
                        "no LISTEN reconnect counted within 10 s"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    seen += listen_reconnects(&snapshotter);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
                seen += listen_reconnects(&snapshotter);
                assert_eq!(seen, 1, "one terminated session, one reconnect");
                drop(coord);
            })
    });
}
