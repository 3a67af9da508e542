//! The server losing a semaphore's state: tokens keep rising across a
//! restart, a snapshot and `DEBUG SLEEP`, waiters are granted after a
//! restart that loses everything, one lost key does not wedge the
//! semaphore, and a state hash rebuilt by a refused extend expires.

use crate::common;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use common::{SEC, eventually, granted};
use conformance::testkit::redis::RedisServer;
use conformance::testkit::wait::until;
use coord_core::{Attempt, OwnerToken, Semaphore};
use tokio::time::{Instant, sleep, timeout};

use super::{MS, att, backend, hget, req};

/// Tokens keep rising across a restart that loses everything (no
/// persistence), across a restart from an older snapshot (`SAVE`, then
/// more grants, then restart), and across a `DEBUG SLEEP` that lets every
/// grant expire server-side.
#[tokio::test]
async fn tokens_rise_across_restart_snapshot_and_debug_sleep() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let o = OwnerToken::random();
    let mut last = 0u64;
    for _ in 0..50 {
        let t = granted(
            b.try_acquire(
                "tok",
                OwnerToken::random().step(),
                &req(1, 1000, 30 * SEC, false),
            )
            .await
            .unwrap(),
        );
        assert!(t > last);
        last = t;
    }
    server.command(&["SAVE"]);
    for _ in 0..50 {
        let t = granted(
            b.try_acquire(
                "tok",
                OwnerToken::random().step(),
                &req(1, 1000, 30 * SEC, false),
            )
            .await
            .unwrap(),
        );
        assert!(t > last);
        last = t;
    }
    server.restart(); // loads the older snapshot
    let t = granted(
        eventually("after snapshot restart", || {
            att(&b, "tok", o, req(1, 1000, 30 * SEC, false))
        })
        .await,
    );
    assert!(t > last, "token {t} after restart is not above {last}");
    last = t;
    // Now a restart that loses everything (an empty snapshot, then kill).
    server.command(&["FLUSHALL"]);
    server.command(&["SAVE"]);
    server.kill();
    server.start_again();
    let t = granted(
        eventually("after empty restart", || {
            att(
                &b,
                "tok",
                OwnerToken::random(),
                req(1, 1000, 30 * SEC, false),
            )
        })
        .await,
    );
    assert!(t > last, "token {t} after restart is not above {last}");
    last = t;
    // Every permit taken by a short grant that expires while the server is
    // frozen (SIGSTOP; DEBUG SLEEP is disabled on this build).
    granted(
        b.try_acquire(
            "tok",
            OwnerToken::random().step(),
            &req(999, 1000, 100 * MS, false),
        )
        .await
        .unwrap(),
    );
    server.pause();
    std::thread::sleep(Duration::from_millis(300));
    server.resume();
    let t = granted(
        eventually("after pause", || {
            att(
                &b,
                "tok",
                OwnerToken::random(),
                req(999, 1000, 30 * SEC, false),
            )
        })
        .await,
    );
    assert!(t > last, "token {t} after the pause is not above {last}");
    let _ = o;
}

/// The state hash of a busy name is lost, then the first script to run is
/// an extend that finds nothing to extend: the hash it rebuilds must still
/// get the name's lifetime, or it outlives every grant (a key with no TTL
/// is never evicted under `volatile-*` either).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_hash_rebuilt_by_a_refused_extend_expires_with_the_name() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let h = OwnerToken::random();
    granted(
        b.try_acquire("rebuilt", h.step(), &req(1, 2, 10 * SEC, false))
            .await
            .unwrap(),
    );
    server.command(&["DEL", "coord:semaphore:{rebuilt}"]);
    let stranger = OwnerToken::random();
    assert!(
        !b.extend("rebuilt", stranger.step(), 10 * SEC)
            .await
            .unwrap()
    );
    let pttl = server
        .command(&["PTTL", "coord:semaphore:{rebuilt}"])
        .as_int()
        .unwrap();
    assert!(
        pttl > 0,
        "the rebuilt state hash has PTTL {pttl} (-1: it never expires)"
    );
}

/// The server restarts (all data lost) while two permits are held and
/// three waiters queue: the waiters are granted promptly afterwards (the
/// state is gone, so two of them at once), with tokens above the old
/// holders', and the old holders' extends fail (nothing resurrected).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_after_a_restart_that_loses_the_state() {
    let server = RedisServer::start();
    let coord = backend(&server.url()).await.into_coord();
    let sem = coord.semaphores().unwrap();
    let a = sem.acquire("rs", 2, 60 * SEC, SEC).await.unwrap();
    let b2 = sem.acquire("rs", 2, 60 * SEC, SEC).await.unwrap();
    let top = a.fencing_token().get().max(b2.fencing_token().get());
    let inside = Arc::new(AtomicI64::new(0));
    let mut ws = Vec::new();
    for _ in 0..3 {
        let s = backend(&server.url())
            .await
            .into_coord()
            .semaphores()
            .unwrap();
        let inside = inside.clone();
        ws.push(tokio::spawn(async move {
            let p = s.acquire("rs", 2, 60 * SEC, 30 * SEC).await.unwrap();
            let start = Instant::now();
            assert!(inside.fetch_add(1, Ordering::SeqCst) < 2);
            sleep(300 * MS).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            let t = p.fencing_token().get();
            p.release().await.unwrap();
            (t, start)
        }));
    }
    // Each waiter connected and queued (on a loaded machine that takes a
    // while).
    until("the three waiters queued", 10 * SEC, || async {
        server
            .command(&["ZCARD", "coord:semaphore:{rs}:queue"])
            .as_int()
            == Some(3)
    })
    .await;
    server.kill();
    server.start_again();
    let restarted = Instant::now();
    for w in ws {
        let (t, _) = timeout(10 * SEC, w)
            .await
            .expect("a waiter stuck after the restart")
            .unwrap();
        assert!(t > top, "token {t} after the restart is not above {top}");
    }
    assert!(
        restarted.elapsed() < 5 * SEC,
        "waiters took {:?} after the restart",
        restarted.elapsed()
    );
    assert!(
        a.extend(60 * SEC).await.is_err(),
        "an old grant was resurrected"
    );
    drop(b2);
}

/// One of the keys of a busy name is lost (evicted under a `volatile-*`
/// or `allkeys-*` maxmemory policy, every key here having a TTL; simulated
/// with `DEL`). A lock (one key) just ends; a semaphore should at worst
/// lose the grants recorded there, and never wedge. Each key in turn: a
/// holder has 2 of 2 permits (500 ms TTL), a waiter waits for 1, the key
/// goes; the waiter must be granted within its wait, and then the name
/// still admits no more than its total (2 more permits are refused).
///
/// The `holders` hash is the hard case: the cached `held` sum is only
/// decremented through it, so without a repair it stays at `total`, and
/// since a waiting acquire renews its place (which extends every key's
/// TTL), the name would stay full of nothing for as long as anybody
/// waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_key_does_not_wedge_the_semaphore() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let sem = backend(&server.url())
        .await
        .into_coord()
        .semaphores()
        .unwrap();
    for lost in [
        ":holders",
        ":grants",
        "",
        ":queue",
        ":queue-expiry",
        ":queue-permits",
    ] {
        let name = format!("evict{}", lost.replace(':', "-"));
        let base = format!("coord:semaphore:{{{name}}}");
        let h = OwnerToken::random();
        granted(
            b.try_acquire(&name, h.step(), &req(2, 2, 500 * MS, false))
                .await
                .unwrap(),
        );
        let w = {
            let (sem, name) = (sem.clone(), name.clone());
            tokio::spawn(async move { sem.acquire(&name, 2, 10 * SEC, 5 * SEC).await })
        };
        sleep(100 * MS).await;
        server.command(&["DEL", &format!("{base}{lost}")]);
        let r = w.await.unwrap();
        assert!(
            r.is_ok(),
            "losing `{base}{lost}` wedged the name: {r:?}; held = {:?}, grants {:?}",
            hget(&server, &base, "held"),
            server
                .command(&["ZCARD", &format!("{base}:grants")])
                .as_int()
        );
        let other = OwnerToken::random();
        let again = b
            .try_acquire(&name, other.step(), &req(2, 2, 10 * SEC, false))
            .await
            .unwrap();
        assert!(
            !matches!(again, Attempt::Granted(_)),
            "after losing `{base}{lost}`, 2 permits of 2 were granted beside the waiter's"
        );
        drop(r);
    }
}
