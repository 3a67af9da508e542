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
    let reconnects = move || conformance::metrics::reconnects(&snapshotter, "redis", "subscriber");
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

/// Counted since the last snapshot (the debugging recorder hands out a
/// counter's increments since the last snapshot, of every counter at
/// once): `coord_store_errors_total{store="redis"}` of all kinds, and
/// `coord_cleanup_failures_total{store="redis"}` by `what`.
fn counts(snapshotter: &metrics_util::debugging::Snapshotter) -> (u64, Vec<(String, u64)>) {
    let (mut errors, mut cleanups) = (0, Vec::new());
    for (k, _, _, v) in snapshotter.snapshot().into_vec() {
        let key = k.key();
        if !key
            .labels()
            .any(|l| l.key() == "store" && l.value() == "redis")
        {
            continue;
        }
        let DebugValue::Counter(n) = v else {
            continue;
        };
        match key.name() {
            "coord_store_errors_total" => errors += n,
            "coord_cleanup_failures_total" => {
                let what = key.labels().find(|l| l.key() == "what");
                cleanups.push((what.map(|l| l.value().to_string()).unwrap_or_default(), n));
            }
            _ => {}
        }
    }
    (errors, cleanups)
}

/// Store errors counted since the last snapshot (see [`counts`]).
fn store_errors(snapshotter: &metrics_util::debugging::Snapshotter) -> u64 {
    counts(snapshotter).0
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
                // the background is sent again for ten minutes
                // (`CLEANUP_RETRY_FOR`) and then counts once, as a store
                // error and as a failed cleanup. The background cleanups of
                // the failed calls above (the barrier arrival's) count as
                // failed cleanups, not as store errors again. The clock is
                // paused from here: it jumps ahead whenever every task
                // waits (each send is refused at once).
                tokio::time::pause();
                let dropped = tokio::time::Instant::now();
                drop(held2);
                // (A snapshot hands out every counter's increments once.)
                let (mut counted, mut cleanups) = (0, Vec::new());
                let until = tokio::time::Instant::now()
                    + coord_core::util::CLEANUP_RETRY_FOR
                    + Duration::from_secs(60);
                while tokio::time::Instant::now() < until && counted == 0 {
                    let (errors, more) = counts(&snapshotter);
                    counted += errors;
                    cleanups.extend(more);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let gave_up = dropped.elapsed();
                if gave_up + coord_core::util::CLEANUP_PAUSE_MAX
                    < coord_core::util::CLEANUP_RETRY_FOR
                {
                    failed.push(format!("release on drop given up after {gave_up:?}"));
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
                let (errors, more) = counts(&snapshotter);
                counted += errors;
                cleanups.extend(more);
                if counted != 1 {
                    failed.push(format!("release on drop: {counted} store errors counted"));
                }
                for what in ["end_claim", "barrier_withdraw"] {
                    if !cleanups.iter().any(|(w, n)| w == what && *n >= 1) {
                        failed.push(format!(
                            "no failed cleanup counted for {what}: {cleanups:?}"
                        ));
                    }
                }
                assert!(failed.is_empty(), "{failed:#?}");
                drop(coord);
            })
    });
}
