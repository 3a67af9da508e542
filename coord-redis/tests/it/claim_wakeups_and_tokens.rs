//! The one-key claims: wake-ups and tokens against a real redis-server.

use crate::common;
use std::time::{Duration, Instant};

use common::{SEC, granted, unique};
use conformance::testkit::redis::RedisServer;
use coord_core::OwnerToken;
use coord_redis::RedisOptions;

/// Two waiters in one client process, the holder in another. The release
/// wakes one of them (one per process); it takes the lock and releases it
/// at once. The second local waiter must then be woken within a round trip
/// or two, not at its polling fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_local_waiter_is_woken_after_the_first_hands_over() {
    let server = RedisServer::start();
    let holder = RedisOptions::new(&server.url()).connect().await.unwrap();
    let waiters = RedisOptions::new(&server.url())
        .connect()
        .await
        .unwrap()
        .with_poll_interval(Duration::from_secs(120));
    let name = unique("two-local");
    let held = holder
        .locks()
        .unwrap()
        .try_acquire(&name, 60 * SEC)
        .await
        .unwrap()
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (w, n) = (waiters.clone(), name.clone());
        tasks.push(tokio::spawn(async move {
            let g = w
                .locks()
                .unwrap()
                .acquire(&n, 60 * SEC, 20 * SEC)
                .await
                .expect("the waiter gets the lock");
            let at = Instant::now();
            g.release().await.unwrap();
            at
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let mut got = Vec::new();
    for t in tasks {
        got.push(t.await.unwrap());
    }
    got.sort();
    let lag = got[1] - released_at;
    assert!(
        lag < 2 * SEC,
        "the second local waiter got the lock {lag:?} after the first release"
    );
}

/// Tokens of new grants of one name rise strictly through every way a
/// claim ends and starts again, mixed at random across three clients:
/// release (deleted, or `=<token>` within the µs), force release, expiry,
/// a same-owner re-grant (the same token, not a new grant), a refused
/// attempt that marks the claim, and a restart of the server without
/// persistence or from an older snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_through_releases_force_releases_expiries_and_restarts() {
    use coord_core::{Attempt, Lock};
    use rand::Rng;
    let server = RedisServer::start();
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(common::backend(&server.url()).await);
    }
    let name = unique("rise");
    let mut last = 0u64;
    let mut held: Option<(usize, OwnerToken, u64)> = None;
    let mut rng = rand::rng();
    for step in 0..400 {
        let c = rng.random_range(0..3);
        let b = &clients[c];
        match rng.random_range(0..7) {
            0..=2 => {
                let owner = OwnerToken::random();
                let ttl = Duration::from_millis(rng.random_range(2..30));
                let waiter = if rng.random_bool(0.5) {
                    Some(Lock::subscribe(b, &name, &owner).await.unwrap())
                } else {
                    None
                };
                let asked = std::time::Instant::now();
                if let Attempt::Granted(t) =
                    common::eventually("acquire", || b.try_acquire(&name, owner.step(), ttl)).await
                {
                    assert!(
                        t.get() > last,
                        "step {step}: token {} after {last}",
                        t.get()
                    );
                    last = t.get();
                    held = Some((c, owner, last));
                    if rng.random_bool(0.3) {
                        // The same owner again: the same token while the
                        // claim lives; after it expired (a TTL of a few ms
                        // runs out under load) a new grant, with a higher
                        // token.
                        if let Attempt::Granted(t2) =
                            b.try_acquire(&name, owner.step(), ttl).await.unwrap()
                        {
                            assert!(
                                t2.get() == last || (t2.get() > last && asked.elapsed() >= ttl),
                                "step {step}: the owner's retry within its TTL got token {} after {last}",
                                t2.get()
                            );
                            last = t2.get();
                            held = Some((c, owner, last));
                        }
                    }
                }
                drop(waiter);
            }
            3 => {
                if let Some((hc, owner, _)) = held.take() {
                    let _ = clients[hc].release(&name, owner.step()).await;
                }
            }
            4 => {
                let _ = b.force_release(&name).await;
            }
            5 => tokio::time::sleep(Duration::from_millis(rng.random_range(0..20))).await,
            _ => {
                // A snapshot now and then; a restart loads the last one (an
                // older snapshot), or starts empty before the first.
                if rng.random_bool(0.3) {
                    server.command(&["SAVE"]);
                } else if rng.random_bool(0.3) {
                    server.restart();
                    held = None;
                }
            }
        }
    }
    assert!(last > 0);
}

/// A waiting acquire's first attempt is delayed in the network past the
/// call timeout; the acquire times out (the lock is held), cleans up, and
/// the holder releases; then the delayed attempt lands on the free lock.
/// It must not take the lock for nobody (for its whole TTL, 60 s): the
/// next acquire must be granted.
///
/// Claims get late-copy marks as semaphores do (`coord_core::late`): the
/// waiter's cleanup release leaves its owner's mark, and the copy,
/// stamped before it, is refused (without the mark, the late copy is
/// granted). `tests/it/late_claims.rs` has the same case for the PHP
/// layout, leases and elections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_attempt_after_a_timed_out_acquire_takes_no_lock() {
    let server = RedisServer::start();
    let (proxy, via, direct) = common::through_proxy(&server).await;
    let name = unique("late-lock");
    // Warm the slow client's connection, so the delayed attempt is one
    // message. One owner: its retry of an unanswered warm-up attempt is
    // that attempt.
    let raw = via.raw_lock().unwrap();
    let warm = OwnerToken::random();
    let (a, _) = common::until_answered("the warm-up attempt", || {
        raw.try_acquire("warm", warm.step(), 10 * SEC)
    })
    .await;
    granted(a);
    let (released, tries) =
        common::until_answered("the warm-up release", || raw.release("warm", warm.step())).await;
    assert!(
        released || tries > 1,
        "the warm-up lock was not held at its release"
    );
    let held = direct
        .locks()
        .unwrap()
        .try_acquire(&name, 60 * SEC)
        .await
        .unwrap()
        .unwrap();
    proxy.latency(Duration::from_millis(1500));
    let waiter = tokio::spawn({
        let (via, name) = (via.clone(), name.clone());
        async move {
            via.locks()
                .unwrap()
                .acquire(&name, 60 * SEC, Duration::from_millis(600))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    proxy.latency(Duration::ZERO);
    let r = waiter.await.unwrap();
    assert!(r.is_err(), "the waiter should time out: {r:?}");
    held.release().await.unwrap();
    // Let the delayed attempt land.
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let next = direct
        .locks()
        .unwrap()
        .try_acquire(&name, 10 * SEC)
        .await
        .unwrap();
    assert!(
        next.is_some(),
        "the lock is free and nobody waits, yet it is refused: the timed-out \
         waiter's late attempt took it"
    );
}
