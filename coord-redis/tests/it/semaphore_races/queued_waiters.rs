//! The queue of waiters: a cancelled head does not block it, the total
//! binds while only waiters are queued, a writer taking every permit is
//! not starved by readers, and a step's cost does not grow with the queue.

use crate::common;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use common::{SEC, granted};
use conformance::testkit::redis::RedisServer;
use coord_core::{Error, OwnerToken, Semaphore};
use coord_redis::RedisBackend;
use tokio::time::{Instant, sleep, timeout};

use super::{MS, backend, hget, is_held, req};

/// The head of the queue (asking for every permit) is cancelled by a
/// dropped future; the small request behind it must not wait for the
/// head's place to lapse (30 s): the core's cleanup removes the place and
/// the store wakes the one behind as soon as a permit comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_queue_head_does_not_block_the_queue() {
    let server = RedisServer::start();
    let (c1, c2, c3) = (
        backend(&server.url()).await.into_coord(),
        backend(&server.url()).await.into_coord(),
        backend(&server.url()).await.into_coord(),
    );
    let (s1, s2, s3) = (
        c1.semaphores().unwrap(),
        c2.semaphores().unwrap(),
        c3.semaphores().unwrap(),
    );
    let holder = s1.acquire("head", 3, 60 * SEC, SEC).await.unwrap();
    let head = tokio::spawn(async move {
        // Cancelled after 300 ms while queued.
        timeout(300 * MS, s2.acquire_many("head", 3, 3, 60 * SEC, 60 * SEC))
            .await
            .is_err()
    });
    sleep(100 * MS).await;
    let start = Instant::now();
    let behind = tokio::spawn(async move { s3.acquire("head", 3, 60 * SEC, 60 * SEC).await });
    assert!(head.await.unwrap(), "the head was granted?");
    // The one behind needs 1 of 3 with 2 free, but the head (3) was ahead.
    sleep(200 * MS).await;
    let p = timeout(3 * SEC, behind)
        .await
        .expect("the waiter behind a cancelled head is still blocked after 3 s")
        .unwrap()
        .unwrap();
    assert!(start.elapsed() < 3 * SEC);
    p.release().await.unwrap();
    holder.release().await.unwrap();
}

/// While only queued waiters exist (the holder expired), the total still
/// binds: another total is `InvalidArgument{permits_total}` and changes
/// nothing (the place, the total, the queued sum stay), for a single
/// attempt and a waiting one alike.
#[tokio::test]
async fn total_binds_while_only_waiters_are_queued() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let (h, w, x) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    granted(
        b.try_acquire("onlyq", h.step(), &req(2, 2, 200 * MS, false))
            .await
            .unwrap(),
    );
    assert!(is_held(
        &b.try_acquire("onlyq", w.step(), &req(2, 2, 30 * SEC, true))
            .await
            .unwrap()
    ));
    sleep(300 * MS).await;
    let state = "coord:semaphore:{onlyq}";
    let before = server.command(&["HGETALL", state]);
    for queue in [false, true] {
        match b
            .try_acquire("onlyq", x.step(), &req(1, 5, 30 * SEC, queue))
            .await
        {
            Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, "permits_total"),
            other => panic!("expected InvalidArgument(permits_total), got {other:?}"),
        }
    }
    assert_eq!(hget(&server, state, "total").as_deref(), Some("2"));
    assert_eq!(
        server
            .command(&["ZCARD", "coord:semaphore:{onlyq}:queue"])
            .as_int(),
        Some(1)
    );
    assert_eq!(
        hget(&server, &format!("{state}:queue-permits"), &x.to_hex()),
        None
    );
    let _ = before;
    // The queued one is granted with its own total; then idle again, a new
    // total is accepted.
    granted(
        b.try_acquire("onlyq", w.step(), &req(2, 2, 30 * SEC, true))
            .await
            .unwrap(),
    );
    assert!(b.release("onlyq", w.step()).await.unwrap());
    granted(
        b.try_acquire("onlyq", x.step(), &req(1, 5, 30 * SEC, false))
            .await
            .unwrap(),
    );
    assert!(b.release("onlyq", x.step()).await.unwrap());
}

/// A writer asking for all MAX_PERMITS permits while 1-permit readers
/// stream in continuously (8 tasks, each re-acquiring at once): FIFO means
/// the writer is granted once the readers ahead of it release (well within
/// a second or two), readers that came later wait behind it, and while the
/// writer holds, no reader holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_taking_every_permit_is_not_starved_by_readers() {
    const TOTAL: u32 = coord_core::validate::MAX_PERMITS;
    let server = RedisServer::start();
    let readers_in = Arc::new(AtomicI64::new(0));
    let writer_in = Arc::new(AtomicI64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut readers = Vec::new();
    for _ in 0..8 {
        let sem = backend(&server.url())
            .await
            .into_coord()
            .semaphores()
            .unwrap();
        let (readers_in, writer_in, stop) = (readers_in.clone(), writer_in.clone(), stop.clone());
        readers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let p = sem.acquire("rw", TOTAL, 10 * SEC, 30 * SEC).await.unwrap();
                readers_in.fetch_add(1, Ordering::SeqCst);
                assert_eq!(
                    writer_in.load(Ordering::SeqCst),
                    0,
                    "reader beside the writer"
                );
                sleep(30 * MS).await;
                readers_in.fetch_sub(1, Ordering::SeqCst);
                p.release().await.unwrap();
                n += 1;
            }
            n
        }));
    }
    sleep(500 * MS).await;
    let wsem = backend(&server.url())
        .await
        .into_coord()
        .semaphores()
        .unwrap();
    for _ in 0..3 {
        let start = Instant::now();
        let w = wsem
            .acquire_many("rw", TOTAL, TOTAL, 10 * SEC, 10 * SEC)
            .await
            .expect("the writer was starved");
        let took = start.elapsed();
        writer_in.fetch_add(1, Ordering::SeqCst);
        assert_eq!(
            readers_in.load(Ordering::SeqCst),
            0,
            "writer beside readers"
        );
        sleep(100 * MS).await;
        writer_in.fetch_sub(1, Ordering::SeqCst);
        w.release().await.unwrap();
        assert!(took < 5 * SEC, "the writer waited {took:?}");
        sleep(200 * MS).await;
    }
    stop.store(true, Ordering::SeqCst);
    let mut total = 0;
    for r in readers {
        total += timeout(30 * SEC, r).await.expect("reader stuck").unwrap();
    }
    assert!(total > 20, "readers made little progress: {total}");
}

/// How many times the server ran `cmd` (scripts' calls included).
fn calls(server: &RedisServer, cmd: &str) -> i64 {
    server
        .info("commandstats", &format!("cmdstat_{cmd}"))
        .split(',')
        .find_map(|f| f.strip_prefix("calls="))
        .map_or(0, |n| n.parse().unwrap())
}

/// Redis commands the scripts ran so far that walk the queue entry by
/// entry (HGET of a waiter's permits, ZSCORE of its place's expiry).
fn walk_calls(server: &RedisServer) -> i64 {
    calls(server, "hget") + calls(server, "zscore")
}

/// `n` one-permit waiters queue behind a holder of every permit. Returns
/// the per-entry commands (HGET + ZSCORE) the server ran for (one renewal
/// by the waiter at the back, the release of the big grant, the mean per
/// grant while the queue drains in order).
async fn queue_costs(
    server: &RedisServer,
    b: &RedisBackend,
    name: &str,
    n: usize,
) -> (i64, i64, f64) {
    const TOTAL: u32 = coord_core::validate::MAX_PERMITS;
    let big = OwnerToken::random();
    granted(
        b.try_acquire(name, big.step(), &req(TOTAL, TOTAL, 600 * SEC, false))
            .await
            .unwrap(),
    );
    let owners: Vec<OwnerToken> = (0..n).map(|_| OwnerToken::random()).collect();
    for o in &owners {
        assert!(is_held(
            &b.try_acquire(name, o.step(), &req(1, TOTAL, 600 * SEC, true))
                .await
                .unwrap()
        ));
    }
    let w0 = walk_calls(server);
    let last = owners.last().unwrap();
    assert!(is_held(
        &b.try_acquire(name, last.step(), &req(1, TOTAL, 600 * SEC, true))
            .await
            .unwrap()
    ));
    let w1 = walk_calls(server);
    let started = Instant::now();
    assert!(b.release(name, big.step()).await.unwrap());
    let release_took = started.elapsed();
    let w2 = walk_calls(server);
    let started = Instant::now();
    for o in &owners {
        granted(
            b.try_acquire(name, o.step(), &req(1, TOTAL, 600 * SEC, true))
                .await
                .unwrap(),
        );
    }
    let drain_took = started.elapsed();
    let w3 = walk_calls(server);
    for o in &owners {
        assert!(b.release(name, o.step()).await.unwrap());
    }
    let per_grant = (w3 - w2) as f64 / n as f64;
    eprintln!(
        "n={n}: renewal at the back {} calls; release of the big grant {} calls ({release_took:?}); \
         {per_grant:.1} calls per grant (draining took {drain_took:?})",
        w1 - w0,
        w2 - w1
    );
    (w1 - w0, w2 - w1, per_grant)
}

/// A step's cost on the server must not grow with the queue length for
/// a waiter near the head. Were each grant's `wake()` to walk the whole
/// grantable prefix from the head again (one HGET per entry, a ZRANGE per
/// 16), although every entry in it was woken already, draining a queue of
/// n waiters that all fit would cost O(n²) commands inside Redis (which
/// serves nobody else meanwhile); and were a waiter at rank r to renew its
/// place with O(r) commands (HGET + ZSCORE of every place ahead), n
/// polling waiters would cost O(n²) per poll round.
#[tokio::test]
async fn per_step_cost_does_not_grow_with_the_queue() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let (renew_s, _, grant_s) = queue_costs(&server, &b, "cost-small", 100).await;
    let (renew_l, _, grant_l) = queue_costs(&server, &b, "cost-large", 1600).await;
    assert!(
        grant_l < grant_s * 4.0 + 8.0,
        "a grant runs {grant_s:.1} per-entry commands with 100 queued, {grant_l:.1} with 1600"
    );
    assert!(
        renew_l < renew_s * 4 + 8,
        "a renewal at the back runs {renew_s} per-entry commands with 100 queued, {renew_l} with 1600"
    );
}
