//! etcd semaphores' moving retry: a retry with another TTL moves the grant
//! onto a lease of its own via `sem_extend`; a moving extend whose reply
//! is lost does not revoke the lease the grant moved to; stale records
//! fall back to finding the owner's grant by its value.
//!
//! Every test drives the binary's shared real etcd, with a key prefix of
//! its own; lost replies go through a `FaultProxy` whose replies are
//! dropped from the moment etcd applied the move (seen by a watch).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use conformance::testkit::etcd;
use conformance::testkit::proxy::FaultProxy;
use coord_core::{Attempt, OwnerToken};
use tokio::time::{Instant, sleep, timeout};

use crate::semaphore_support;
use semaphore_support::*;

/// The remaining TTL etcd reports for `lease` (-1: gone).
async fn lease_ttl(lease: i64) -> i64 {
    raw_etcd()
        .await
        .lease_time_to_live(lease, None)
        .await
        .map_or(-1, |r| r.ttl())
}

/// A permit (the guard API) extended to a shorter TTL whose move landed
/// but whose reply was lost. The new lease is not revoked, but it has the
/// extend's shorter TTL and nobody keeps it: etcd drops the grant at the
/// short TTL and a second owner may be granted the only permit. So the
/// guard's `remaining()` must come down with it (docs/guarantees.md: "never exceeds
/// what the server would say"): a shorter extend caps the deadline as it
/// is sent, whatever its outcome. Were `Guard::extend` to err and keep its
/// old deadline, `remaining()` would still promise ~20 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_of_a_shorter_extend_brings_remaining_down_to_the_server() {
    let p = unique("d25-shorter");
    let proxy = Arc::new(FaultProxy::start(etcd::shared().client_port()));
    let far_c = coord_at(proxy.port(), &p, 3000).await;
    let near_c = coord(&p).await;
    let near = raw(&near_c);
    let n = "m";
    let sem = far_c.semaphores().unwrap();
    let permit = sem
        .try_acquire(n, 1, LONG)
        .await
        .unwrap()
        .expect("the only permit is free");
    let g = state(&p, n).await.0[0].clone();
    let dropper = drop_reply_of_move(proxy.clone(), g.key.clone(), g.lease);
    sleep(Duration::from_millis(200)).await;
    proxy.latency(Duration::from_millis(250));
    let r = permit.extend(SHORT).await;
    let moved = timeout(Duration::from_secs(5), dropper)
        .await
        .map(|j| j.unwrap())
        .unwrap_or(false);
    proxy.heal();
    assert!(
        moved && r.is_err(),
        "the move applied ({moved}), its reply dropped: {r:?}"
    );
    sleep(PAST_SHORT).await;
    let remaining = permit.remaining();
    let kept = state(&p, n).await.0.iter().any(|r| r.owner == g.owner);
    let intruder = near
        .try_acquire(n, OwnerToken::random().step(), &req(1, 1, LONG, false))
        .await;
    let intruder_granted = matches!(intruder, Ok(Attempt::Granted(_)));
    if let Ok(Attempt::Granted(_)) = &intruder {
        // Leave nothing behind for the shared server.
        let _ = near.force_release(n).await;
    }
    let _ = permit.release().await;
    assert!(
        remaining.is_zero() || (kept && !intruder_granted),
        "permit.remaining() = {remaining:?} after the lost reply of extend({SHORT:?}), yet \
         its grant in etcd: {kept}; a second owner then got {intruder:?}"
    );
}

/// A retry through client A of an owner whose grant (at token t1) was
/// made through B, with another TTL: A reads the grant, keeps its lease
/// alive, then moves it (`sem_extend` before answering). If, between A's
/// read and A's move, the owner's grant is released and granted again
/// through B (token t2 > t1, B answered t2), `sem_extend` falls back to
/// the owner's live grant by value and moves that one. A must answer the
/// token of the grant it moved, never Granted(t1), a token of a grant
/// that no longer exists: the attempt starts afresh unless the grant
/// moved is the one it read.
///
/// Deterministic: A goes through a proxy with latency; B's release and
/// regrant are started the moment etcd shows A's keepalive of the grant's
/// lease (its TTL jumps back up), well before A's next request passes the
/// proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_another_ttl_answers_the_token_of_the_grant_it_moved() {
    let p = unique("d25-token");
    let proxy = Arc::new(FaultProxy::start(etcd::shared().client_port()));
    let a_c = coord_at(proxy.port(), &p, 30_000).await;
    let a = raw(&a_c);
    let b_c = coord(&p).await;
    let b = raw(&b_c);
    let n = "t";
    let o = OwnerToken::random();
    let t1 = granted(b.try_acquire(n, o.step(), &req(1, 2, LONG, false)).await);
    let g = state(&p, n).await.0[0].clone();
    // Let the grant's lease lose a few seconds of its TTL, so A's
    // keepalive of it shows.
    sleep(Duration::from_millis(3500)).await;
    let before = lease_ttl(g.lease).await;
    assert!(before > 0 && before <= 27, "lease TTL {before}");
    // Warm A's connection, then slow it down.
    let _ = a.extend("warm", OwnerToken::random().step(), LONG).await;
    proxy.latency(Duration::from_millis(400));
    let watcher = {
        let b = b.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            let mut etcd = raw_etcd().await;
            loop {
                let ttl = etcd
                    .lease_time_to_live(g.lease, None)
                    .await
                    .map_or(-1, |r| r.ttl());
                if ttl > before + 1 {
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "A's keepalive never seen"
                );
                sleep(Duration::from_millis(10)).await;
            }
            assert!(b.release(n, o.step()).await.unwrap());
            granted(b.try_acquire(n, o.step(), &req(1, 2, LONG, false)).await)
        })
    };
    let ta = granted(
        a.try_acquire(n, o.step(), &req(1, 2, LONG * 2, false))
            .await,
    );
    let t2 = watcher.await.unwrap();
    proxy.heal();
    let live = state(&p, n).await.0;
    let _ = b.release(n, o.step()).await;
    let _ = a.release(n, o.step()).await;
    assert!(t2 > t1, "the regrant's token {t2} after {t1}");
    assert_eq!(live.len(), 1, "{live:#?}");
    assert!(
        ta == live[0].create as u64 && ta >= t2,
        "A answered Granted({ta}) after B answered Granted({t2}) for the same owner; the grant \
         A's retry moved onto its lease is at {} (first grant {t1})",
        live[0].create
    );
}

/// A moving extend (another TTL) whose move landed but whose reply was
/// lost, then release through the same client: answered true, nothing of
/// the name is left in etcd, the permits are free again, and the client's
/// later extend and release of the owner answer false.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_of_a_moving_extend_then_release_leaves_nothing() {
    let p = unique("d25-lostrel");
    let proxy = Arc::new(FaultProxy::start(etcd::shared().client_port()));
    let far_c = coord_at(proxy.port(), &p, 3000).await;
    let far = raw(&far_c);
    let near_c = coord(&p).await;
    let near = raw(&near_c);
    let n = "m";
    let o = OwnerToken::random();
    let t = granted(far.try_acquire(n, o.step(), &req(2, 2, SHORT, false)).await);
    let g = state(&p, n).await.0[0].clone();
    let dropper = drop_reply_of_move(proxy.clone(), g.key.clone(), g.lease);
    sleep(Duration::from_millis(200)).await;
    proxy.latency(Duration::from_millis(250));
    let r = far.extend(n, o.step(), LONG).await;
    let moved = timeout(Duration::from_secs(5), dropper)
        .await
        .map(|j| j.unwrap())
        .unwrap_or(false);
    proxy.heal();
    assert!(
        moved && r.is_err(),
        "move applied {moved}, reply lost: {r:?}"
    );
    // Past the first lease's TTL: the grant lives on the moved-to lease.
    sleep(PAST_SHORT).await;
    let h = state(&p, n).await.0;
    assert_eq!(h.len(), 1, "{h:#?}");
    assert_eq!(h[0].create as u64, t, "the move kept the token");
    // A retry through the same client answers the same token.
    assert_eq!(
        granted(far.try_acquire(n, o.step(), &req(2, 2, LONG, false)).await),
        t
    );
    assert!(far.release(n, o.step()).await.unwrap());
    let (h, w, s) = state(&p, n).await;
    assert!(
        h.is_empty() && w.is_empty() && s == 0,
        "left: {h:#?} {w:#?} {s}"
    );
    assert!(!far.extend(n, o.step(), LONG).await.unwrap());
    assert!(!far.release(n, o.step()).await.unwrap());
    let q = OwnerToken::random();
    granted(near.try_acquire(n, q.step(), &req(2, 2, LONG, false)).await);
    assert!(near.release(n, q.step()).await.unwrap());
}

/// A retry with another TTL (which moves the grant) dropped mid-call at
/// many points, through the client that made the grant and through
/// another one: the owner keeps exactly one grant at its token until a
/// release, which answers true through the writer and leaves nothing; the
/// other client then answers false; all permits are free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_moving_retry_then_release_leaves_nothing() {
    let p = unique("d25-cancel");
    let (ca, cb) = (coord(&p).await, coord(&p).await);
    let (a, b) = (raw(&ca), raw(&cb));
    let n = "c";
    let stop = Arc::new(AtomicBool::new(false));
    let obs = observer(p.clone(), n.into(), 2, stop.clone());
    for cut_us in [
        0u64, 200, 500, 1000, 1500, 2000, 3000, 4000, 6000, 9000, 15000,
    ] {
        for through_b in [false, true] {
            let o = OwnerToken::random();
            let t = granted(a.try_acquire(n, o.step(), &req(2, 2, SHORT, false)).await);
            let retrier = if through_b { &b } else { &a };
            let r = timeout(
                Duration::from_micros(cut_us),
                retrier.try_acquire(n, o.step(), &req(2, 2, LONG, false)),
            )
            .await;
            if let Ok(r) = r {
                assert_eq!(granted(r), t, "a retry answered another token");
            }
            // Let background revocations land.
            sleep(Duration::from_millis(300)).await;
            let h = state(&p, n).await.0;
            assert_eq!(h.len(), 1, "cut {cut_us}us b={through_b}: {h:#?}");
            assert_eq!(h[0].create as u64, t);
            assert!(
                a.release(n, o.step()).await.unwrap(),
                "cut {cut_us}us b={through_b}: release through the writer"
            );
            assert!(!b.release(n, o.step()).await.unwrap());
            assert!(!b.extend(n, o.step(), LONG).await.unwrap());
            let (h, w, s) = state(&p, n).await;
            assert!(
                h.is_empty() && w.is_empty() && s == 0,
                "cut {cut_us}us b={through_b}: left {h:#?} {w:#?} {s}"
            );
        }
    }
    let q = OwnerToken::random();
    granted(b.try_acquire(n, q.step(), &req(2, 2, LONG, false)).await);
    assert!(b.release(n, q.step()).await.unwrap());
    stop.store(true, Ordering::Relaxed);
    assert!(obs.await.unwrap() > 0);
}

/// One owner through two clients, both extending at once with different
/// TTLs (each extend moves the grant away from the other's lease), for
/// many rounds, with another owner holding the other permit: every extend
/// answers true, the owner keeps exactly one grant at its first token, no
/// more than the total is ever held in etcd, a third owner is refused
/// throughout; then one release answers true, the other false, and
/// nothing of the owner is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_moving_extends_through_two_clients_keep_one_grant() {
    let p = unique("d25-ext2");
    let (ca, cb, cc) = (coord(&p).await, coord(&p).await, coord(&p).await);
    let (a, b, c) = (raw(&ca), raw(&cb), raw(&cc));
    let n = "e";
    let stop = Arc::new(AtomicBool::new(false));
    let obs = observer(p.clone(), n.into(), 3, stop.clone());
    let o = OwnerToken::random();
    let other = OwnerToken::random();
    let t = granted(a.try_acquire(n, o.step(), &req(2, 3, LONG, false)).await);
    granted(
        c.try_acquire(n, other.step(), &req(1, 3, LONG, false))
            .await,
    );
    assert_eq!(
        granted(
            b.try_acquire(n, o.step(), &req(2, 3, LONG * 2, false))
                .await
        ),
        t
    );
    for round in 0..25u32 {
        let (ta, tb) = if round % 2 == 0 {
            (LONG, LONG * 2)
        } else {
            (LONG * 2, LONG)
        };
        let (ra, rb) = tokio::join!(a.extend(n, o.step(), ta), b.extend(n, o.step(), tb));
        assert!(
            ra.as_ref().is_ok_and(|x| *x) && rb.as_ref().is_ok_and(|x| *x),
            "round {round}: {ra:?} {rb:?}"
        );
        let h = state(&p, n).await.0;
        let mine: Vec<&Rec> = h.iter().filter(|r| r.owner == o.to_hex()).collect();
        assert_eq!(mine.len(), 1, "round {round}: {h:#?}");
        assert_eq!(mine[0].create as u64, t, "round {round}");
        if round % 5 == 0 {
            let x = c
                .try_acquire(n, OwnerToken::random().step(), &req(1, 3, LONG, false))
                .await;
            assert!(matches!(x, Ok(Attempt::Held { .. })), "{x:?}");
        }
    }
    let (ra, rb) = tokio::join!(a.release(n, o.step()), b.release(n, o.step()));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert!(ra ^ rb, "exactly one release answers true: {ra} {rb}");
    assert!(!has_grant(&p, n, &o).await);
    assert!(c.release(n, other.step()).await.unwrap());
    sleep(Duration::from_millis(200)).await;
    let (h, w, s) = state(&p, n).await;
    assert!(
        h.is_empty() && w.is_empty() && s == 0,
        "left: {h:#?} {w:#?} {s}"
    );
    stop.store(true, Ordering::Relaxed);
    assert!(obs.await.unwrap() > 0);
}
