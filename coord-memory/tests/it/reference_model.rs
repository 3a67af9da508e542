//! The reference model through its public API, on paused time so TTLs
//! cost nothing.

use std::time::Duration;

use coord_core::{Algorithm, Error, FencingToken, LockOptions, Quota};

use coord_memory::MemoryBackend;

const S: Duration = Duration::from_secs(1);

#[tokio::test(start_paused = true)]
async fn lock_expires_after_ttl_and_not_before() {
    let coord = MemoryBackend::coord();
    let locks = coord.locks().unwrap();
    let g = locks.acquire("a", 10 * S, Duration::ZERO).await.unwrap();
    tokio::time::advance(9 * S).await;
    assert!(locks.try_acquire("a", S).await.unwrap().is_none());
    tokio::time::advance(2 * S).await;
    let g2 = locks.try_acquire("a", S).await.unwrap().expect("expired");
    assert!(g2.fencing_token() > g.fencing_token());
    assert!(matches!(g.release().await, Err(Error::NotHeld { .. })));
    g2.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn waiter_takes_over_at_expiry_without_notification() {
    let coord = MemoryBackend::coord().with_poll_interval(3600 * S);
    let locks = coord.locks().unwrap();
    let g = locks.acquire("b", 5 * S, Duration::ZERO).await.unwrap();
    let start = tokio::time::Instant::now();
    let g2 = locks.acquire("b", 5 * S, 60 * S).await.unwrap();
    let waited = start.elapsed();
    assert!(waited >= 5 * S && waited < 6 * S, "{waited:?}");
    drop(g);
    g2.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn extend_keeps_token_and_never_resurrects() {
    let coord = MemoryBackend::coord();
    let locks = coord.locks().unwrap();
    let g = locks.acquire("c", 2 * S, Duration::ZERO).await.unwrap();
    let t = g.fencing_token();
    tokio::time::advance(S).await;
    g.extend(10 * S).await.unwrap();
    tokio::time::advance(5 * S).await;
    assert!(locks.try_acquire("c", S).await.unwrap().is_none());
    assert_eq!(g.fencing_token(), t);
    tokio::time::advance(6 * S).await;
    assert!(matches!(g.extend(10 * S).await, Err(Error::NotHeld { .. })));
    assert!(locks.try_acquire("c", S).await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn watchdog_holds_for_many_ttls_and_lost_fires_on_force_release() {
    let coord = MemoryBackend::coord();
    let locks = coord.locks().unwrap();
    let g = locks
        .acquire_with("d", LockOptions::new(3 * S).watchdog(true))
        .await
        .unwrap();
    tokio::time::sleep(30 * S).await;
    assert!(g.is_valid());
    assert!(locks.try_acquire("d", S).await.unwrap().is_none());
    let lost = g.lost();
    assert!(locks.force_release("d").await.unwrap());
    tokio::time::timeout(5 * S, lost).await.expect("lost fires");
    assert!(!g.is_valid());
}

#[tokio::test(start_paused = true)]
async fn lost_fires_at_validity_deadline_without_watchdog() {
    let coord = MemoryBackend::coord();
    let locks = coord.locks().unwrap();
    let g = locks.acquire("e", 10 * S, Duration::ZERO).await.unwrap();
    let token = g.lost_token();
    let start = tokio::time::Instant::now();
    token.cancelled().await;
    let t = start.elapsed();
    assert!(t < 10 * S && t >= 9 * S, "{t:?}");
}

#[tokio::test(start_paused = true)]
async fn leases_renew_revoke_and_expire() {
    let coord = MemoryBackend::coord();
    let leases = coord.leases().unwrap();
    let l = leases.grant("w7", 10 * S).await.unwrap().unwrap();
    assert!(leases.grant("w7", 10 * S).await.unwrap().is_none());
    let r = leases.remaining("w7").await.unwrap().unwrap();
    assert!(r <= 10 * S);
    tokio::time::advance(11 * S).await;
    assert!(!leases.is_alive("w7").await.unwrap());
    assert!(matches!(l.renew(10 * S).await, Err(Error::NotHeld { .. })));
    assert!(!leases.is_alive("w7").await.unwrap());
    let l2 = leases.grant("w7", 10 * S).await.unwrap().unwrap();
    l2.revoke().await.unwrap();
    assert!(!leases.is_alive("w7").await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn election_replaces_a_dead_leader_within_ttl() {
    let coord = MemoryBackend::coord().with_poll_interval(3600 * S);
    let el = coord.elections().unwrap();
    let a = el.campaign("e", "a", 5 * S, Duration::ZERO).await.unwrap();
    let start = tokio::time::Instant::now();
    let b = el.campaign("e", "b", 5 * S, 60 * S).await.unwrap();
    assert!(start.elapsed() < 6 * S);
    assert!(b.term() > a.term());
    assert_eq!(el.leader("e").await.unwrap().unwrap().candidate, "b");
}

#[tokio::test(start_paused = true)]
async fn limiter_algorithms_admit_limit_then_recover() {
    let coord = MemoryBackend::coord();
    let lim = coord.limiter().unwrap();
    for alg in Algorithm::ALL {
        let q = Quota::new(5, 10 * S, alg);
        let key = format!("k-{alg:?}");
        let mut admitted = 0;
        let mut last = None;
        for _ in 0..15 {
            let d = lim.check(&key, q).await.unwrap();
            if d.allowed {
                admitted += 1;
            } else {
                assert!(d.retry_after > Duration::ZERO, "{alg:?}");
            }
            last = Some(d);
        }
        assert_eq!(admitted, 5, "{alg:?}");
        let d = last.unwrap();
        assert_eq!(d.remaining, 0, "{alg:?}");
        tokio::time::advance(d.retry_after).await;
        assert!(
            lim.check(&key, q).await.unwrap().allowed,
            "{alg:?} after retry_after"
        );
        tokio::time::advance(30 * S).await;
        let d = lim.check(&key, q).await.unwrap();
        assert!(d.allowed && d.remaining == 4, "{alg:?} {d:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn barrier_generations_and_party_mismatch() {
    let coord = MemoryBackend::coord();
    let b = coord.barriers().unwrap();
    let b1 = b.clone();
    let t = tokio::spawn(async move { b1.wait("g", 2, "p1", 60 * S).await });
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(matches!(
        b.wait("g", 3, "p2", S).await,
        Err(Error::InvalidArgument {
            field: "parties",
            ..
        })
    ));
    let g = b.wait("g", 2, "p2", 60 * S).await.unwrap();
    assert_eq!(t.await.unwrap().unwrap(), g);
    let b1 = b.clone();
    let t = tokio::spawn(async move { b1.wait("g", 2, "p1", 60 * S).await });
    let g2 = b.wait("g", 2, "p2", 60 * S).await.unwrap();
    assert_eq!(t.await.unwrap().unwrap(), g2);
    assert!(g2 > g, "generations rise: {g} then {g2}");
}

#[tokio::test(start_paused = true)]
async fn fencing_tokens_rise() {
    let coord = MemoryBackend::coord();
    let f = coord.fencing().unwrap();
    let a = f.next("r").await.unwrap();
    let b = f.next("r").await.unwrap();
    assert!(b > a && a > FencingToken(0));
}

// ---- semaphores ----

#[tokio::test(start_paused = true)]
async fn semaphore_admits_total_then_refuses_and_takes_many_all_or_none() {
    let coord = MemoryBackend::coord();
    let sem = coord.semaphores().unwrap();
    assert!(sem.is_fifo());
    let a = sem
        .try_acquire_many("s", 2, 3, 10 * S)
        .await
        .unwrap()
        .unwrap();
    let b = sem.try_acquire("s", 3, 10 * S).await.unwrap().unwrap();
    assert!(sem.try_acquire("s", 3, 10 * S).await.unwrap().is_none());
    assert!(b.fencing_token() > a.fencing_token());
    a.release().await.unwrap();
    // Two are free: a request for three takes none of them.
    assert!(sem.try_acquire_many("s", 3, 3, S).await.unwrap().is_none());
    assert!(
        sem.try_acquire_many("s", 2, 3, S)
            .await
            .unwrap()
            .is_some_and(|p| p.permits() == 2)
    );
}

#[tokio::test(start_paused = true)]
async fn semaphore_total_binds_while_in_use_and_resets_when_idle() {
    let coord = MemoryBackend::coord();
    let sem = coord.semaphores().unwrap();
    let p = sem.try_acquire("t", 2, 5 * S).await.unwrap().unwrap();
    let e = sem.try_acquire("t", 3, 5 * S).await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument {
                field: "permits_total",
                ..
            }
        ),
        "{e:?}"
    );
    // The mismatch changed nothing: one of the two permits is still free.
    let q = sem.try_acquire("t", 2, 5 * S).await.unwrap().unwrap();
    q.release().await.unwrap();
    p.release().await.unwrap();
    // Idle: the next request sets the total.
    let r = sem.try_acquire_many("t", 3, 3, 5 * S).await.unwrap();
    assert!(r.is_some());
}

/// The FIFO rule: a waiter for 2 at the head is not overtaken by later
/// requests for 1, waiting or single attempts; it is granted as soon as
/// two are free, woken by the release, not by polling.
#[tokio::test(start_paused = true)]
async fn semaphore_head_of_queue_is_not_overtaken_by_smaller_requests() {
    let coord = MemoryBackend::coord().with_poll_interval(3600 * S);
    let sem = coord.semaphores().unwrap();
    let a = sem
        .try_acquire_many("f", 2, 3, 60 * S)
        .await
        .unwrap()
        .unwrap();
    let s2 = sem.clone();
    let big = tokio::spawn(async move { s2.acquire_many("f", 2, 3, 60 * S, 600 * S).await });
    tokio::time::sleep(100 * Duration::from_millis(1)).await;
    // One permit is free, but the head of the queue wants two.
    assert!(sem.try_acquire("f", 3, 60 * S).await.unwrap().is_none());
    let s3 = sem.clone();
    let small = tokio::spawn(async move { s3.acquire("f", 3, 60 * S, 600 * S).await });
    tokio::time::sleep(100 * Duration::from_millis(1)).await;
    assert!(
        !small.is_finished(),
        "a later small request overtook the head"
    );
    let released_at = tokio::time::Instant::now();
    a.release().await.unwrap();
    let big = big.await.unwrap().unwrap();
    assert!(released_at.elapsed() < S, "head not woken by the release");
    // Then the small one behind it: one permit is left.
    let small = small.await.unwrap().unwrap();
    assert!(small.fencing_token() > big.fencing_token());
}

/// A waiting acquire that times out leaves no place in line: a smaller
/// request right after it is not held up.
#[tokio::test(start_paused = true)]
async fn semaphore_timed_out_waiter_leaves_no_place_in_line() {
    let coord = MemoryBackend::coord();
    let sem = coord.semaphores().unwrap();
    let _a = sem
        .try_acquire_many("q", 2, 3, 60 * S)
        .await
        .unwrap()
        .unwrap();
    let e = sem.acquire_many("q", 2, 3, 60 * S, S).await.unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert!(sem.try_acquire("q", 3, 60 * S).await.unwrap().is_some());
}

/// A place in line whose waiter vanished without cleanup lapses after
/// `QUEUE_ENTRY_TTL`.
#[tokio::test(start_paused = true)]
async fn semaphore_abandoned_place_in_line_lapses() {
    use coord_core::{OwnerToken, PermitRequest, Semaphore};
    let backend = MemoryBackend::new();
    let hold = PermitRequest {
        permits: 2,
        total: 3,
        ttl: 3600 * S,
        queue: false,
    };
    let holder = OwnerToken::random();
    let got = backend
        .try_acquire("l", holder.step(), &hold)
        .await
        .unwrap();
    assert!(matches!(got, coord_core::Attempt::Granted(_)));
    let ghost = PermitRequest {
        queue: true,
        ..hold
    };
    let held = backend
        .try_acquire("l", OwnerToken::random().step(), &ghost)
        .await
        .unwrap();
    let coord_core::Attempt::Held { expires_in } = held else {
        panic!("{held:?}")
    };
    assert!(expires_in.unwrap() <= coord_memory::QUEUE_REFRESH);
    let one = PermitRequest { permits: 1, ..hold };
    let me = OwnerToken::random();
    assert!(matches!(
        backend.try_acquire("l", me.step(), &one).await.unwrap(),
        coord_core::Attempt::Held { .. }
    ));
    tokio::time::advance(coord_memory::QUEUE_ENTRY_TTL + S).await;
    assert!(matches!(
        backend.try_acquire("l", me.step(), &one).await.unwrap(),
        coord_core::Attempt::Granted(_)
    ));
}

/// A waiting acquire that is dropped (cancelled) gives up its place in
/// line: the cleanup with its owner token removes it, so a smaller request
/// behind it is not held up until the entry lapses.
#[tokio::test(start_paused = true)]
async fn semaphore_cancelled_waiter_gives_up_its_place_in_line() {
    let coord = MemoryBackend::coord();
    let sem = coord.semaphores().unwrap();
    let _held = sem
        .try_acquire_many("c", 2, 3, 60 * S)
        .await
        .unwrap()
        .unwrap();
    let s2 = sem.clone();
    let waiting = tokio::spawn(async move { s2.acquire_many("c", 2, 3, 60 * S, 600 * S).await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(sem.try_acquire("c", 3, 60 * S).await.unwrap().is_none());
    waiting.abort();
    let _ = waiting.await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(sem.try_acquire("c", 3, 60 * S).await.unwrap().is_some());
}
