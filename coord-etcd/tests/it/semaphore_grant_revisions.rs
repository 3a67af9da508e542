//! etcd semaphore grants through several clients: release and extend act
//! on a grant at its create revision; a lease adopted from another client
//! is never spared or revoked; adopted grants move onto the extender's
//! lease.
//!
//! Each test drives a real etcd (the binary's shared server, a prefix of
//! its own per test): one owner token through several clients of the raw
//! trait, the TTL a retry through another client is answered with, lost
//! replies of a moving extend, belief accounting of every client's answers
//! against the total, and the found-by-value release under contention.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use conformance::testkit::etcd;
use conformance::testkit::proxy::FaultProxy;
use coord_core::{Attempt, OwnerToken, Semaphore};
use tokio::sync::Mutex;
use tokio::time::sleep;

use crate::semaphore_support;
use semaphore_support::*;

/// The trait: "If `owner` already holds a grant of `name`, the attempt
/// succeeds again with the same token ... it may refresh the TTL", and the
/// reference store (coord-memory) sets the grant's expiry to the retry's
/// TTL. A retry through another client with a longer TTL is answered
/// Granted (the caller counts its validity from that TTL), so the grant
/// must then last that long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_through_other_client_with_longer_ttl_keeps_the_grant_that_long() {
    let p = unique("fix-ttl2");
    let (ca, cb) = (coord(&p).await, coord(&p).await);
    let (a, b) = (raw(&ca), raw(&cb));
    let n = "t";
    let o = OwnerToken::random();
    let t1 = granted(a.try_acquire(n, &o, &req(1, 1, SHORT, false)).await);
    let t2 = granted(b.try_acquire(n, &o, &req(1, 1, LONG, false)).await);
    assert_eq!(t1, t2);
    sleep(PAST_SHORT).await;
    let kept = has_grant(&p, n, &o).await;
    let intruder = b
        .try_acquire(n, &OwnerToken::random(), &req(1, 1, LONG, false))
        .await;
    assert!(
        kept,
        "adopted grant answered Granted for {LONG:?} but etcd dropped it after {PAST_SHORT:?} \
         (the first client's {SHORT:?} lease); a new owner then got {intruder:?}"
    );
    assert!(matches!(intruder, Ok(Attempt::Held { .. })), "{intruder:?}");
    assert!(b.release(n, &o).await.unwrap());
}

/// The same through one client: a retry of an own grant with a longer TTL
/// is answered Granted, so it must last the longer TTL (as on memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_through_same_client_with_longer_ttl_keeps_the_grant_that_long() {
    let p = unique("fix-ttl1");
    let ca = coord(&p).await;
    let a = raw(&ca);
    let n = "t";
    let o = OwnerToken::random();
    let t1 = granted(a.try_acquire(n, &o, &req(1, 1, SHORT, false)).await);
    let t2 = granted(a.try_acquire(n, &o, &req(1, 1, LONG, false)).await);
    assert_eq!(t1, t2);
    sleep(PAST_SHORT).await;
    let kept = has_grant(&p, n, &o).await;
    let intruder = a
        .try_acquire(n, &OwnerToken::random(), &req(1, 1, LONG, false))
        .await;
    assert!(
        kept,
        "retried grant answered Granted for {LONG:?} but etcd dropped it after {PAST_SHORT:?} \
         (the first attempt's {SHORT:?} lease); a new owner then got {intruder:?}"
    );
    assert!(matches!(intruder, Ok(Attempt::Held { .. })), "{intruder:?}");
    assert!(a.release(n, &o).await.unwrap());
}

/// An extend that moves the grant (another TTL) whose reply is lost: the
/// call errs, so the holder knows nothing new, and its grant must still be
/// held until its last known deadline (the grant was live; an extend never
/// ends a grant). If the move landed on the new lease and that lease is
/// then revoked for the error, the grant is gone while its holder (still
/// inside its validity) believes it holds, and another owner is granted the
/// same permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_reply_of_a_moving_extend_keeps_the_grant() {
    let p = unique("fix-lostmove");
    let proxy = Arc::new(FaultProxy::start(etcd::shared().client_port()));
    let far_c = coord_at(proxy.port(), &p, 3000).await;
    let far = raw(&far_c);
    let near_c = coord(&p).await;
    let near = raw(&near_c);
    let n = "m";
    let o = OwnerToken::random();
    granted(far.try_acquire(n, &o, &req(1, 1, LONG, false)).await);
    let g = state(&p, n).await.0[0].clone();
    // Another TTL: a move. Its request reaches etcd, its reply does not.
    let dropper = drop_reply_of_move(proxy.clone(), g.key.clone(), g.lease);
    sleep(Duration::from_millis(200)).await;
    proxy.latency(Duration::from_millis(250));
    let r = far.extend(n, &o, Duration::from_secs(20)).await;
    let moved = tokio::time::timeout(Duration::from_secs(5), dropper)
        .await
        .map(|j| j.unwrap())
        .unwrap_or(false);
    proxy.heal();
    assert!(
        moved && r.is_err(),
        "the move applied ({moved}), its reply dropped: {r:?}"
    );
    // The revocation (if any) runs in the background.
    sleep(Duration::from_millis(1500)).await;
    let kept = has_grant(&p, n, &o).await;
    let ext = far.extend(n, &o, LONG).await;
    let intruder = near
        .try_acquire(n, &OwnerToken::random(), &req(1, 1, LONG, false))
        .await;
    assert!(
        kept && matches!(ext, Ok(true)),
        "grant kept in etcd: {kept}; extend through the healed client (within the grant's \
         {LONG:?}): {ext:?}; a second owner then got {intruder:?}"
    );
    assert!(matches!(intruder, Ok(Attempt::Held { .. })), "{intruder:?}");
    let _ = far.release(n, &o).await;
}

/// Same, for an adopted grant. A retry of the owner through another
/// client moves the grant onto that client's lease with the retry's TTL
/// at once (the adopted lease's TTL is unknown), so the move whose reply
/// is lost here is the retry's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_reply_of_an_adopters_first_extend_keeps_the_grant() {
    let p = unique("fix-lostadopt");
    let proxy = Arc::new(FaultProxy::start(etcd::shared().client_port()));
    let far_c = coord_at(proxy.port(), &p, 3000).await;
    let far = raw(&far_c);
    let near_c = coord(&p).await;
    let near = raw(&near_c);
    let n = "m";
    let o = OwnerToken::random();
    granted(near.try_acquire(n, &o, &req(1, 1, LONG, false)).await);
    let g = state(&p, n).await.0[0].clone();
    let dropper = drop_reply_of_move(proxy.clone(), g.key.clone(), g.lease);
    sleep(Duration::from_millis(200)).await;
    proxy.latency(Duration::from_millis(250));
    let r = far.try_acquire(n, &o, &req(1, 1, LONG, false)).await;
    let moved = tokio::time::timeout(Duration::from_secs(5), dropper)
        .await
        .map(|j| j.unwrap())
        .unwrap_or(false);
    proxy.heal();
    assert!(
        moved && r.is_err(),
        "the move applied ({moved}), its reply dropped: {r:?}"
    );
    sleep(Duration::from_millis(1500)).await;
    let kept = has_grant(&p, n, &o).await;
    let intruder = near
        .try_acquire(n, &OwnerToken::random(), &req(1, 1, LONG, false))
        .await;
    assert!(
        kept,
        "adopted grant gone after a lost extend reply (its writer still holds it for \
         {LONG:?}); a second owner then got {intruder:?}"
    );
    assert!(matches!(intruder, Ok(Attempt::Held { .. })), "{intruder:?}");
    let _ = near.release(n, &o).await;
}

/// What every client was told, summed: the permits of owners whose last
/// answer was a grant (and not released since) never exceed the total.
#[derive(Default)]
struct Beliefs {
    held: u32,
    tokens: HashSet<u64>,
}

/// Tasks, each with an owner token of its own, used through three clients
/// at random (sequentially within a task): acquire (with and without a
/// queue place), a retry through another client (another TTL), extends of
/// two TTLs, releases. Each answer is checked against what the task was
/// told before: a held owner's extend and release succeed, a released one's
/// fail, a grant never makes the believed permits exceed the total, new
/// grants' tokens never repeat, a retry keeps its token. etcd's
/// view is checked meanwhile; at the end nothing is left under the name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_owner_through_three_clients_answers_add_up() {
    let p = unique("fix-beliefs");
    let clients: Vec<Arc<dyn Semaphore>> = vec![
        raw(&coord(&p).await),
        raw(&coord(&p).await),
        raw(&coord(&p).await),
    ];
    let n = "b";
    let total = 3;
    let stop = Arc::new(AtomicBool::new(false));
    let obs = observer(p.clone(), n.into(), total, stop.clone());
    let beliefs = Arc::new(Mutex::new(Beliefs::default()));
    let mut tasks = Vec::new();
    for t in 0..6u64 {
        let clients = clients.clone();
        let beliefs = beliefs.clone();
        let p = p.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((t + 1) * 0x1234_5677));
            let o = OwnerToken::random();
            let permits = 1 + (t % 2) as u32;
            let mut mine: Option<u64> = None;
            let mut queued = false;
            let mut hist: Vec<String> = Vec::new();
            for _ in 0..60 {
                let ci = rng.below(3) as usize;
                let c = &clients[ci];
                let ttl = if rng.below(2) == 0 { LONG } else { LONG * 2 };
                match (mine, rng.below(5)) {
                    (None, 0..=2) | (Some(_), 0) => {
                        let queue = rng.below(2) == 0;
                        let a = c.try_acquire(n, &o, &req(permits, total, ttl, queue)).await;
                        hist.push(format!("acq c{ci} {ttl:?} q={queue}: {a:?}"));
                        let mut b = beliefs.lock().await;
                        match a {
                            Ok(Attempt::Granted(tok)) => {
                                let tok = tok.get();
                                match mine {
                                    Some(m) => assert_eq!(m, tok, "a retry got another token"),
                                    None => {
                                        b.held += permits;
                                        assert!(
                                            b.held <= total,
                                            "answers grant {} > {total} permits",
                                            b.held
                                        );
                                        assert!(b.tokens.insert(tok), "token {tok} issued twice");
                                        mine = Some(tok);
                                        queued = false;
                                    }
                                }
                            }
                            Ok(Attempt::Held { .. }) => {
                                assert!(mine.is_none(), "a holder's retry was refused");
                                queued |= queue;
                            }
                            Err(e) => panic!("acquire: {e}"),
                        }
                    }
                    (Some(_), 1 | 2) => {
                        let r = c.extend(n, &o, ttl).await.unwrap();
                        hist.push(format!("ext c{ci} {ttl:?}: {r}"));
                        // A false answer here would come from a stale
                        // record deciding alone (see
                        // `stale_record_in_one_client_...`): the grant
                        // must then still be there (belief kept).
                        if !r {
                            assert!(
                                has_grant(&p, n, &o).await,
                                "extend false, grant gone: {hist:#?}"
                            );
                        }
                    }
                    (Some(_), _) => {
                        // Belief ends before the call; a false answer (a
                        // stale record deciding alone) leaves the grant
                        // in etcd, and the belief comes back.
                        beliefs.lock().await.held -= permits;
                        let r = c.release(n, &o).await.unwrap();
                        hist.push(format!("rel c{ci}: {r}"));
                        if r {
                            mine = None;
                        } else {
                            assert!(
                                has_grant(&p, n, &o).await,
                                "release false, grant gone: {hist:#?}"
                            );
                            let mut b = beliefs.lock().await;
                            b.held += permits;
                            assert!(b.held <= total, "answers grant {} > {total}", b.held);
                        }
                    }
                    (None, _) => {
                        let r = c.release(n, &o).await.unwrap();
                        hist.push(format!("rel(non-holder) c{ci}: {r}"));
                        assert!(!r, "a release of a non-holder answered true: {hist:#?}");
                        queued = false;
                        if rng.below(2) == 0 {
                            let e = c.extend(n, &o, ttl).await.unwrap();
                            assert!(!e, "an extend of a non-holder answered true");
                        }
                    }
                }
                let _ = queued;
            }
            // Whatever is left (grant or place) goes: through every client
            // (one with a stale record may answer false).
            if mine.is_some() {
                beliefs.lock().await.held -= permits;
            }
            let mut gone = false;
            for c in &clients {
                gone |= c.release(n, &o).await.unwrap();
            }
            assert_eq!(gone, mine.is_some(), "{hist:#?}");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    assert!(obs.await.unwrap() > 0);
    let (h, w, s) = state(&p, n).await;
    assert!(
        h.is_empty() && w.is_empty() && s == 0,
        "left: {h:#?} {w:#?} {s}"
    );
}

/// One owner, two clients, each operation pair started at once (acquire,
/// retry with another TTL, extend of two TTLs, release, force_release) on
/// a name whose other permits another owner holds. etcd's view never
/// exceeds the total; afterwards both clients release, nothing of the
/// owner is left, and exactly `total` fresh owners are granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_owner_two_clients_every_pair_at_once() {
    let p = unique("fix-pairs");
    let (ca, cb, cc) = (coord(&p).await, coord(&p).await, coord(&p).await);
    let (a, b, c) = (raw(&ca), raw(&cb), raw(&cc));
    let n = "q";
    let total = 3;
    let stop = Arc::new(AtomicBool::new(false));
    let obs = observer(p.clone(), n.into(), total, stop.clone());
    let ops = ["acq", "acq2", "ext", "ext2", "rel", "force"];
    async fn run(s: &Arc<dyn Semaphore>, n: &str, o: &OwnerToken, op: &str) -> String {
        let r = match op {
            "acq" => format!("{:?}", s.try_acquire(n, o, &req(2, 3, LONG, false)).await),
            "acq2" => format!(
                "{:?}",
                s.try_acquire(n, o, &req(2, 3, LONG * 2, true)).await
            ),
            "ext" => format!("{:?}", s.extend(n, o, LONG).await),
            "ext2" => format!("{:?}", s.extend(n, o, LONG * 2).await),
            "rel" => format!("{:?}", s.release(n, o).await),
            _ => format!("{:?}", s.force_release(n).await),
        };
        assert!(!r.starts_with("Err"), "{op}: {r}");
        r
    }
    for (i, x) in ops.iter().enumerate() {
        for y in &ops[i..] {
            for lead in 0..3 {
                let o = OwnerToken::random();
                let other = OwnerToken::random();
                // The owner holds 2 (through a or b), another owner 1.
                let first = if lead == 1 { &b } else { &a };
                granted(first.try_acquire(n, &o, &req(2, 3, LONG, false)).await);
                granted(c.try_acquire(n, &other, &req(1, 3, LONG, false)).await);
                if lead == 2 {
                    // b adopts before the pair.
                    granted(b.try_acquire(n, &o, &req(2, 3, LONG, false)).await);
                }
                let (rx, ry) = tokio::join!(run(&a, n, &o, x), run(&b, n, &o, y));
                // Clean up: every client's release, then the owner is gone.
                for s in [&a, &b, &c] {
                    s.release(n, &o).await.unwrap();
                }
                c.release(n, &other).await.unwrap();
                let (h, w, s) = state(&p, n).await;
                assert!(
                    h.is_empty() && w.is_empty() && s == 0,
                    "{x}/{y} lead {lead} ({rx}, {ry}): left {h:#?} {w:#?} slots {s}"
                );
                // Stale records in a and b must not block or over-grant.
                let fresh: Vec<OwnerToken> = (0..3).map(|_| OwnerToken::random()).collect();
                for (k, f) in fresh.iter().enumerate() {
                    let s = [&a, &b, &c][k];
                    granted(s.try_acquire(n, f, &req(1, 3, LONG, false)).await);
                }
                held(
                    a.try_acquire(n, &OwnerToken::random(), &req(1, 3, LONG, false))
                        .await,
                    "a 4th permit of 3",
                );
                // A stale release or extend of `o` leaves them alone.
                for s in [&a, &b, &c] {
                    assert!(!s.extend(n, &o, LONG).await.unwrap(), "{x}/{y}");
                    assert!(!s.release(n, &o).await.unwrap(), "{x}/{y}");
                }
                assert_eq!(state(&p, n).await.0.len(), 3, "{x}/{y} lead {lead}");
                for (k, f) in fresh.iter().enumerate() {
                    let s = [&a, &b, &c][k];
                    assert!(s.release(n, f).await.unwrap(), "{x}/{y} lead {lead}");
                }
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    assert!(obs.await.unwrap() > 0);
}

/// The release that reads first (a queued owner, whose place is on
/// record) gives up after 5 rounds only if the owner's own keys keep
/// changing: ordinary contention (other owners granted, queued and
/// released on the same name through the same clients) must never make a
/// legitimate release fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_of_queued_owners_under_churn_never_unavailable() {
    let p = unique("fix-rounds");
    let (ca, cb) = (coord(&p).await, coord(&p).await);
    let (a, b) = (raw(&ca), raw(&cb));
    let n = "r";
    let total = 2;
    let stop = Arc::new(AtomicBool::new(false));
    let obs = observer(p.clone(), n.into(), total, stop.clone());
    let mut churn = Vec::new();
    for t in 0..3u64 {
        let (s, stop) = (if t % 2 == 0 { a.clone() } else { b.clone() }, stop.clone());
        churn.push(tokio::spawn(async move {
            let mut rng = Rng(77 + t);
            while !stop.load(Ordering::Relaxed) {
                let o = OwnerToken::random();
                if let Ok(Attempt::Granted(_)) =
                    s.try_acquire(n, &o, &req(1, total, LONG, true)).await
                {
                    sleep(Duration::from_millis(rng.below(5))).await;
                }
                s.release(n, &o).await.unwrap();
            }
        }));
    }
    let mut failures = Vec::new();
    for i in 0..150u64 {
        let s = if i % 2 == 0 { &a } else { &b };
        let o = OwnerToken::random();
        let got = s.try_acquire(n, &o, &req(2, total, LONG, true)).await;
        // Sometimes a retry through the other client adopts the place.
        if i % 3 == 0 {
            let other = if i % 2 == 0 { &b } else { &a };
            let _ = other.try_acquire(n, &o, &req(2, total, LONG, true)).await;
        }
        match s.release(n, &o).await {
            Ok(r) => assert!(r || !matches!(got, Ok(Attempt::Granted(_))), "{i}: {got:?}"),
            Err(e) => failures.push(format!("{i}: {e}")),
        }
        // The other client's record (adopted place) released too.
        let other = if i % 2 == 0 { &b } else { &a };
        if let Err(e) = other.release(n, &o).await {
            failures.push(format!("{i} (other): {e}"));
        }
        let left = state(&p, n)
            .await
            .1
            .iter()
            .filter(|r| r.owner == o.to_hex())
            .count();
        assert_eq!(left, 0, "{i}: the released owner's place is left");
    }
    stop.store(true, Ordering::Relaxed);
    for c in churn {
        c.await.unwrap();
    }
    assert!(obs.await.unwrap() > 0);
    assert!(
        failures.is_empty(),
        "legitimate releases failed: {failures:?}"
    );
}

/// A client whose record of the owner's grant is stale (the grant was
/// released through another client, and the owner granted again there)
/// must still answer for the owner's live grant: the trait's extend is
/// true and release returns the permits iff the owner holds a live grant
/// (as on memory). The stale record (its create revision) must not
/// decide alone: if it did, extend would answer false, and release would
/// answer false and leave the grant and its permits held until its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_record_in_one_client_still_answers_for_the_live_grant() {
    let p = unique("fix-stale");
    let (ca, cb) = (coord(&p).await, coord(&p).await);
    let (a, b) = (raw(&ca), raw(&cb));
    // Release through the stale client.
    let (n, o) = ("s", OwnerToken::random());
    let t1 = granted(a.try_acquire(n, &o, &req(1, 2, LONG, false)).await);
    assert!(b.release(n, &o).await.unwrap());
    let t2 = granted(b.try_acquire(n, &o, &req(1, 2, LONG, false)).await);
    assert!(t2 > t1);
    let rel = a.release(n, &o).await.unwrap();
    let left = has_grant(&p, n, &o).await;
    // Extend through the stale client (another name, the same steps).
    let (m, q) = ("s2", OwnerToken::random());
    granted(a.try_acquire(m, &q, &req(1, 2, LONG, false)).await);
    assert!(b.release(m, &q).await.unwrap());
    granted(b.try_acquire(m, &q, &req(1, 2, LONG, false)).await);
    let ext = a.extend(m, &q, LONG).await.unwrap();
    let _ = b.release(n, &o).await;
    let _ = b.release(m, &q).await;
    assert!(
        ext && rel && !left,
        "A's extend of the live grant: {ext}; A's release: {rel}; grant still in etcd after \
         that release: {left}"
    );
}
