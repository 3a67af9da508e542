//! A watch that re-opens after its stream broke is counted
//! (`coord_reconnects_total{store="etcd",what="watch"}`): the shared
//! watches of elections, barriers and queue lanes.

use std::time::Duration;

use conformance::testkit::etcd::EtcdServer;
use conformance::testkit::proxy::FaultProxy;
use coord_core::Election;
use coord_etcd::{EtcdBackend, EtcdOptions};
use metrics_util::debugging::{DebuggingRecorder, Snapshotter};

/// `coord_reconnects_total{store="etcd",what="watch"}` since the last
/// snapshot.
fn watch_reconnects(snapshotter: &Snapshotter) -> u64 {
    conformance::metrics::reconnects(snapshotter, "etcd", "watch")
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
                // An election observer's shared watch (client/watch.rs), opened
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

/// Which waiter's watch a test cuts.
#[derive(Clone, Copy, Debug)]
enum Waiting {
    /// A lock waiter: the watch on its predecessor in the lock's queue.
    Lock,
    /// A semaphore waiter: the watch that mirrors the semaphore's keys.
    Semaphore,
}

/// A holder (connected directly) holds `name`; a waiter (through a fault
/// proxy) waits for it. The proxy's connections are reset: the waiter's
/// watch opens again, which counts, and the waiter is still granted once
/// the holder releases.
fn a_waiters_reopened_watch_is_counted(waiting: Waiting) {
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
                let ttl = Duration::from_secs(20);
                let holder = coord_etcd::connect(&server.url()).await.unwrap();
                let url = format!(
                    "etcd://127.0.0.1:{}?timeout=500ms&connect_timeout=500ms",
                    proxy.port()
                );
                let client = coord_etcd::connect(&url).await.unwrap();
                let (held, waiter) = match waiting {
                    Waiting::Lock => {
                        let held = holder.locks().unwrap().try_acquire("m", ttl).await.unwrap();
                        let locks = client.locks().unwrap();
                        let waiter = tokio::spawn(async move {
                            locks
                                .acquire("m", ttl, Duration::from_secs(30))
                                .await
                                .map(drop)
                        });
                        (held.unwrap(), waiter)
                    }
                    Waiting::Semaphore => {
                        let sems = holder.semaphores().unwrap();
                        let held = sems.try_acquire("m", 1, ttl).await.unwrap().unwrap();
                        let sems = client.semaphores().unwrap();
                        let waiter = tokio::spawn(async move {
                            sems.acquire("m", 1, ttl, Duration::from_secs(30))
                                .await
                                .map(drop)
                        });
                        (held.into_guard(), waiter)
                    }
                };
                // The waiter queued, its watch open.
                tokio::time::sleep(Duration::from_secs(1)).await;
                assert!(
                    !waiter.is_finished(),
                    "{waiting:?}: the waiter did not wait"
                );
                assert_eq!(
                    watch_reconnects(&snapshotter),
                    0,
                    "{waiting:?}: no reconnect yet"
                );
                proxy.reset();
                let until = tokio::time::Instant::now() + Duration::from_secs(10);
                let mut seen = 0;
                while seen == 0 {
                    assert!(
                        tokio::time::Instant::now() < until,
                        "{waiting:?}: no watch reconnect counted within 10 s"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    seen += watch_reconnects(&snapshotter);
                }
                held.release().await.unwrap();
                let granted = tokio::time::timeout(Duration::from_secs(10), waiter)
                    .await
                    .expect("the waiter was granted within 10 s of the release")
                    .unwrap();
                granted.unwrap();
            })
    });
}

#[test]
fn a_lock_waiters_reopened_watch_is_counted_as_a_reconnect() {
    a_waiters_reopened_watch_is_counted(Waiting::Lock);
}

#[test]
fn a_semaphore_waiters_reopened_watch_is_counted_as_a_reconnect() {
    a_waiters_reopened_watch_is_counted(Waiting::Semaphore);
}
