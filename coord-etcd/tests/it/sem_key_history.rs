//! What a busy semaphore name leaves in etcd's key index between
//! compactions (the semaphore half of `key_history.rs`).
//!
//! etcd keeps an index entry for every key ever written until a compaction
//! removes the deleted ones, and a range read visits every entry in its
//! range, deleted or not. Every semaphore attempt reads the name's grants
//! (`<prefix>sem/<name>/h/`) and waiters (`.../w/`) by range. A grant
//! named by its owner (`h/<owner hex>`, a new random owner per acquire)
//! would add, with each cycle on a name, an entry that every later
//! attempt on the name visits: N cycles would write N distinct keys.
//! Grants and waiters are named by their lease (`h/<lease hex>`,
//! `w/<lease hex>`, the owner in the value), and a client reuses its
//! leases, so a busy name rewrites a few keys. Slot keys (`s/<i>`, `i`
//! below the total) are bounded.

use crate::history_support;
use std::time::{Duration, Instant};

use conformance::testkit::etcd::EtcdServer;

use history_support::{distinct_keys, revision};

/// One uncontended cycle on `name`: one of 3 permits, released.
async fn cycle(sems: &coord_core::Semaphores, name: &str) {
    sems.try_acquire(name, 3, Duration::from_secs(30))
        .await
        .unwrap()
        .expect("a free permit")
        .release()
        .await
        .unwrap();
}

/// 500 uncontended cycles on one name write a few distinct keys, not one
/// per cycle. Measured (one etcd from the test kit, no compaction, shared
/// 2-core machine, load 1.1-2.8) with grant keys named by their owner
/// (`h/<owner hex>`): 500 cycles on one name wrote 503 distinct keys
/// under `coord:sem/busy/` (500 grant keys and the 3 slots), and server
/// CPU per uncontended cycle on that name
/// (`server_cpu_per_cycle_on_one_name`) rose from 883 to 2020 µs over
/// 30,000 cycles, while a fresh name right after cost 837-855 µs: the
/// cost follows the dead keys of the name, not the server's age. With
/// grants and waiters named by their lease, the owner in the value (as
/// `key_history.rs` checks for locks and elections): 500 cycles write 4
/// distinct keys (the grant and the 3 slots), and over 20,000 cycles on
/// one name a cycle costs 730-1035 µs with no trend (a fresh name
/// 860-870 µs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cycles_on_one_name_do_not_grow_the_key_index() {
    let server = EtcdServer::start();
    let coord = coord_etcd::connect(&server.url()).await.unwrap();
    let sems = coord.semaphores().unwrap();
    // Warm up: the first grants grant leases.
    for _ in 0..10 {
        cycle(&sems, "busy").await;
    }
    let from = revision(&server).await + 1;
    const CYCLES: u32 = 500;
    for _ in 0..CYCLES {
        cycle(&sems, "busy").await;
    }
    let to = revision(&server).await;
    let grown = distinct_keys(&server, "coord:sem/busy/", from, to).await;
    eprintln!("{CYCLES} cycles on one name wrote {grown} distinct keys");
    assert!(
        grown < 50,
        "{CYCLES} cycles on one name wrote {grown} distinct keys, each an entry in \
         etcd's key index until a compaction"
    );
}

/// The waiting path: two clients take turns on one permit, each acquire
/// waiting (a place in the queue, `w/<lease hex>`) while the other holds.
/// Place and grant leases are reused as the other keys are, so rounds of
/// queueing on one name write a few keys, not one per wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_on_one_name_do_not_grow_the_key_index() {
    let server = EtcdServer::start();
    let clients = [
        coord_etcd::connect(&server.url()).await.unwrap(),
        coord_etcd::connect(&server.url()).await.unwrap(),
    ];
    const ROUNDS: u32 = 100;
    let round = |from_rev: bool| {
        let server = &server;
        let clients = &clients;
        async move {
            let from = if from_rev {
                revision(server).await + 1
            } else {
                0
            };
            let tasks = clients.iter().map(|c| {
                let sems = c.semaphores().unwrap();
                async move {
                    for _ in 0..ROUNDS {
                        let g = sems
                            .acquire(
                                "queued",
                                1,
                                Duration::from_secs(30),
                                Duration::from_secs(20),
                            )
                            .await
                            .unwrap();
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        g.release().await.unwrap();
                    }
                }
            });
            futures::future::join_all(tasks).await;
            from
        }
    };
    // Warm up: the first rounds grant leases.
    round(false).await;
    let from = round(true).await;
    let to = revision(&server).await;
    let dir = "coord:sem/queued/";
    let grown = distinct_keys(&server, dir, from, to).await;
    let places = {
        let mut raw = etcd_client::Client::connect([server.endpoint()], None)
            .await
            .unwrap();
        let o = etcd_client::GetOptions::new().with_prefix();
        raw.get(dir, Some(o)).await.unwrap().kvs().len()
    };
    eprintln!(
        "{} waiting acquires on one name wrote {grown} distinct keys",
        2 * ROUNDS
    );
    assert_eq!(places, 0, "keys left under {dir}");
    assert!(
        grown < 50,
        "{} waiting acquires on one name wrote {grown} distinct keys",
        2 * ROUNDS
    );
}

/// A measurement, not a test (it asserts nothing about speed): blocks of
/// uncontended cycles on one name, then a block on a fresh name, each with
/// the server's CPU time per cycle (`process_cpu_seconds_total`).
///
/// ```text
/// SEM_CYCLES=10000 cargo test --release -p coord-etcd --test sem_key_history \
///     -- --ignored --nocapture server_cpu
/// ```
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: prints server CPU per semaphore cycle as cycles on one name add up"]
async fn server_cpu_per_cycle_on_one_name() {
    let total: u32 = std::env::var("SEM_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let block = (total / 10).max(1);
    let server = EtcdServer::start();
    let coord = coord_etcd::connect(&server.url()).await.unwrap();
    let sems = coord.semaphores().unwrap();
    let mut done = 0;
    let run = |name: &'static str| {
        let server = &server;
        let sems = &sems;
        async move {
            let cpu0 = server.metric("process_cpu_seconds_total", &[]);
            let t0 = Instant::now();
            for _ in 0..block {
                cycle(sems, name).await;
            }
            let cpu = server.metric("process_cpu_seconds_total", &[]) - cpu0;
            (
                cpu * 1e6 / f64::from(block),
                t0.elapsed().as_secs_f64() * 1e6 / f64::from(block),
            )
        }
    };
    while done < total {
        let (server_us, wall_us) = run("busy").await;
        done += block;
        println!(
            "busy  after {done:>6} cycles: server CPU {server_us:>6.0} us/cycle, wall {wall_us:>6.0} us/cycle"
        );
    }
    let (server_us, wall_us) = run("fresh").await;
    println!(
        "fresh after {block:>6} cycles: server CPU {server_us:>6.0} us/cycle, wall {wall_us:>6.0} us/cycle"
    );
}
