//! The wake-up subscriber's reconnect is counted
//! (`coord_reconnects_total{store="redis",what="subscriber"}`).

use std::time::Duration;

use conformance::testkit::redis as kit;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

#[test]
fn a_killed_subscriber_connection_is_counted_as_a_reconnect() {
    // A server of its own: the test cuts every subscriber connection of
    // the server, which would cut other tests' wake-ups on a shared one.
    let server = kit::RedisServer::start();
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

/// `coord_store_errors_total{store="redis"}`, all kinds, counted since the
/// last snapshot (the debugging recorder hands out a counter's increments
/// since the last snapshot).
fn store_errors(snapshotter: &metrics_util::debugging::Snapshotter) -> u64 {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, _, _, _)| {
            k.key().name() == "coord_store_errors_total"
                && k.key()
                    .labels()
                    .any(|l| l.key() == "store" && l.value() == "redis")
        })
        .map(|(_, _, _, v)| match v {
            DebugValue::Counter(n) => n,
            other => panic!("not a counter: {other:?}"),
        })
        .sum::<u64>()
}

#[test]
fn every_operation_that_fails_at_the_store_counts_one_store_error() {
    let server = kit::RedisServer::start();
    let url = format!("{}?timeout=300ms&connect_timeout=300ms", server.url());
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let ttl = Duration::from_secs(10);
                let coord = coord_redis::connect(&url).await.unwrap();
                let locks = coord.locks().unwrap();
                let held = locks.try_acquire("e-held", ttl).await.unwrap().unwrap();
                let held2 = locks.try_acquire("e-held2", ttl).await.unwrap().unwrap();
                let leases = coord.leases().unwrap();
                let sems = coord.semaphores().unwrap();
                let fencing = coord.fencing().unwrap();
                let elections = coord.elections().unwrap();
                let barriers = coord.barriers().unwrap();
                let queues = coord.queues().unwrap();
                let limiter = coord.limiter().unwrap();
                assert_eq!(store_errors(&snapshotter), 0, "no store error yet");
                server.stop();
                let mut failed = Vec::new();
                macro_rules! once {
                    ($what:expr, $call:expr) => {{
                        let r = $call.await;
                        assert!(r.is_err(), "{} succeeded with the store stopped", $what);
                        let counted = store_errors(&snapshotter);
                        if counted != 1 {
                            failed.push(format!(
                                "{}: {counted} store errors counted ({:?})",
                                $what,
                                r.err()
                            ));
                        }
                    }};
                }
                let q =
                    coord_core::Quota::new(5, Duration::from_secs(60), coord_core::Algorithm::Gcra);
                once!("lock acquire", locks.try_acquire("e", ttl));
                once!("lock extend", held.extend(ttl));
                once!("lock release", held.release());
                once!("lock inspect", locks.inspect("e"));
                once!("lock force_release", locks.force_release("e"));
                once!("lease remaining", leases.remaining("e"));
                once!("lease inspect", leases.inspect("e"));
                once!("semaphore inspect", sems.inspect("e"));
                once!("semaphore force_release", sems.force_release("e"));
                once!("fencing next", fencing.next("e"));
                once!("election leader", elections.leader("e"));
                once!(
                    "barrier wait",
                    barriers.wait("e", 2, "p", Duration::from_millis(500))
                );
                once!("limiter check", limiter.check("e", q));
                once!("queue push", queues.push("e", b"x"));
                once!("queue pop", queues.pop("e", ttl, Duration::ZERO));
                once!("queue peek", queues.peek("e", coord_core::Lane::Main, 10));
                once!("queue stats", queues.stats("e"));
                once!("queue redrive", queues.redrive("e", 10));
                once!("queue purge", queues.purge("e"));
                // Observing retries a failed read quietly; each one counts.
                {
                    use futures::StreamExt;
                    let mut changes = Box::pin(elections.observe("e").unwrap());
                    let r = tokio::time::timeout(Duration::from_secs(1), changes.next()).await;
                    assert!(r.is_err(), "observe yielded with the store stopped: {r:?}");
                    if store_errors(&snapshotter) == 0 {
                        failed.push("election observe: no store error counted".to_string());
                    }
                }
                // A guard dropped while the store is down: its release in
                // the background counts once too.
                drop(held2);
                let mut counted = 0;
                let until = tokio::time::Instant::now() + Duration::from_secs(5);
                while tokio::time::Instant::now() < until {
                    counted += store_errors(&snapshotter);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                if counted != 1 {
                    failed.push(format!("release on drop: {counted} store errors counted"));
                }
                assert!(failed.is_empty(), "{failed:#?}");
                drop(coord);
            })
    });
}
