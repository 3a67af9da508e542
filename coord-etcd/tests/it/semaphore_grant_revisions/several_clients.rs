//! One owner used through several clients at once: the answers of three
//! clients add up against the total, and every pair of operations
//! started at once through two clients.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use coord_core::{Attempt, OwnerToken, Semaphore};
use tokio::sync::Mutex;

use crate::semaphore_support;
use semaphore_support::*;

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
                        let a = c
                            .try_acquire(n, o.step(), &req(permits, total, ttl, queue))
                            .await;
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
                        let r = c.extend(n, o.step(), ttl).await.unwrap();
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
                        let r = c.release(n, o.step()).await.unwrap();
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
                        let r = c.release(n, o.step()).await.unwrap();
                        hist.push(format!("rel(non-holder) c{ci}: {r}"));
                        assert!(!r, "a release of a non-holder answered true: {hist:#?}");
                        queued = false;
                        if rng.below(2) == 0 {
                            let e = c.extend(n, o.step(), ttl).await.unwrap();
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
                gone |= c.release(n, o.step()).await.unwrap();
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
            "acq" => format!(
                "{:?}",
                s.try_acquire(n, o.step(), &req(2, 3, LONG, false)).await
            ),
            "acq2" => format!(
                "{:?}",
                s.try_acquire(n, o.step(), &req(2, 3, LONG * 2, true)).await
            ),
            "ext" => format!("{:?}", s.extend(n, o.step(), LONG).await),
            "ext2" => format!("{:?}", s.extend(n, o.step(), LONG * 2).await),
            "rel" => format!("{:?}", s.release(n, o.step()).await),
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
                granted(
                    first
                        .try_acquire(n, o.step(), &req(2, 3, LONG, false))
                        .await,
                );
                granted(
                    c.try_acquire(n, other.step(), &req(1, 3, LONG, false))
                        .await,
                );
                if lead == 2 {
                    // b adopts before the pair.
                    granted(b.try_acquire(n, o.step(), &req(2, 3, LONG, false)).await);
                }
                let (rx, ry) = tokio::join!(run(&a, n, &o, x), run(&b, n, &o, y));
                // Clean up: every client's release, then the owner is gone.
                for s in [&a, &b, &c] {
                    s.release(n, o.step()).await.unwrap();
                }
                c.release(n, other.step()).await.unwrap();
                let (h, w, s) = state(&p, n).await;
                assert!(
                    h.is_empty() && w.is_empty() && s == 0,
                    "{x}/{y} lead {lead} ({rx}, {ry}): left {h:#?} {w:#?} slots {s}"
                );
                // Stale records in a and b must not block or over-grant.
                let fresh: Vec<OwnerToken> = (0..3).map(|_| OwnerToken::random()).collect();
                for (k, f) in fresh.iter().enumerate() {
                    let s = [&a, &b, &c][k];
                    granted(s.try_acquire(n, f.step(), &req(1, 3, LONG, false)).await);
                }
                held(
                    a.try_acquire(n, OwnerToken::random().step(), &req(1, 3, LONG, false))
                        .await,
                    "a 4th permit of 3",
                );
                // A stale release or extend of `o` leaves them alone.
                for s in [&a, &b, &c] {
                    assert!(!s.extend(n, o.step(), LONG).await.unwrap(), "{x}/{y}");
                    assert!(!s.release(n, o.step()).await.unwrap(), "{x}/{y}");
                }
                assert_eq!(state(&p, n).await.0.len(), 3, "{x}/{y} lead {lead}");
                for (k, f) in fresh.iter().enumerate() {
                    let s = [&a, &b, &c][k];
                    assert!(s.release(n, f.step()).await.unwrap(), "{x}/{y} lead {lead}");
                }
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    assert!(obs.await.unwrap() > 0);
}
