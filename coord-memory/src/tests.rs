//! Unit tests of the reference model, on paused time so TTLs cost nothing.

use std::time::Duration;

use coord_core::{Algorithm, Error, FencingToken, LockOptions, Quota};

use super::MemoryBackend;

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
