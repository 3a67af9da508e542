//! An owner's extends racing its other calls: an extend racing a release
//! leaves nothing and the next grant holds, two extends of other TTLs keep
//! the grant, and a holder's attempt racing a moving extend keeps the
//! moved grant.

use std::time::Duration;

use conformance::spin;
use coord_core::OwnerToken;
use tokio::time::sleep;

use crate::semaphore_support;
use semaphore_support::{coord, raw, req, unique};

use super::{
    Found, SETTLE, TTL, TTL2, check_follow_up, check_holds, check_nothing, grants_of, history,
    leak, short, sweep, token, wide,
};

/// A third TTL (a second moving extend).
const TTL3: Duration = Duration::from_secs(1200);

/// Owner O holds the only permit of a fresh name (TTL) through client C.
/// Through C: an extend of O (the grant's TTL in even rounds: a keepalive;
/// another TTL in odd rounds: a move of its keys to a new lease, then the
/// old lease revoked) and, after a spun delay, a release of O. The release
/// must answer true (the grant is live until it), and leave nothing of O.
/// Then O is granted the name again through C (the TTL of the first grant:
/// it may take a lease the race spared), and, once background revocations
/// landed, that grant must be in etcd at its token, and C must extend and
/// release it. Fails if a release of a live grant answers false, if a move
/// lands after a release and brings the grant back, or if either call
/// leaves a record or spare that costs the next grant its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_racing_a_release_leaves_nothing_and_the_next_grant_holds() {
    let tag = "sso-ext-rel";
    let p = unique(tag);
    let cc = coord(&p).await;
    let c = raw(&cc);
    let mut f = Found::default();
    let one = req(1, 1, TTL, false);
    let mut next = Vec::new();
    let mut ext_true = [0; 2];
    let rounds = 360u64;
    for i in 0..rounds {
        let n = leak(format!("e{i}"));
        let o = OwnerToken::random();
        let ettl = if i % 2 == 0 { TTL } else { TTL2 };
        let t0 = token(&c.try_acquire(n, o.step(), &one).await).expect("the first grant");
        let ext = {
            let c = c.clone();
            tokio::spawn(async move { c.extend(n, o.step(), ettl).await })
        };
        tokio::task::yield_now().await;
        spin(if i % 2 == 0 {
            sweep(i / 2)
        } else {
            wide(i / 2)
        });
        let r = c.release(n, o.step()).await;
        let e = ext.await.unwrap();
        ext_true[(i % 2) as usize] += usize::from(matches!(e, Ok(true)));
        let what = format!(
            "token {t0}, extend {}s {}, release {}",
            ettl.as_secs(),
            short(&e),
            short(&r)
        );
        if !matches!(r, Ok(true)) {
            f.add(
                "the release of a live grant not answered true",
                what.clone(),
            );
        }
        check_nothing(&mut f, &p, n, &o, &what).await;
        let a = c.try_acquire(n, o.step(), &one).await;
        match token(&a) {
            Some(t) => next.push((n, o, t, what)),
            None => f.add(
                "the next attempt on a free name not granted",
                format!("{n}: {}; {what}", short(&a)),
            ),
        }
    }
    sleep(SETTLE).await;
    for (n, o, t, what) in &next {
        let what = format!("{what}; then granted {t}");
        check_holds(&mut f, &p, (n, o), (*t, None), &[1], &[TTL], &what).await;
    }
    for (n, o, _, what) in &next {
        check_follow_up(&mut f, &c, &p, n, o, TTL, what).await;
    }
    f.assert_none(
        tag,
        rounds as usize,
        &format!(
            "extends answered true: {} of the same TTL, {} moving",
            ext_true[0], ext_true[1]
        ),
    );
}

/// Owner O holds the only permit of a fresh name (TTL) through client C.
/// Through C, concurrently: an extend of O to TTL2 (a move) and, after a
/// spun delay, an extend of O to TTL3 (another move) in even rounds, or
/// with the grant's TTL (a keepalive, or a move if the first moved it
/// already) in odd ones. Nobody releases: both answer true, and afterwards
/// O's one grant is still there at its token, on a live lease; C extends
/// and releases it. Fails if either extend answers false, or one revokes
/// the lease the other moved the grant to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_extends_of_other_ttls_keep_the_grant() {
    let tag = "sso-ext-ext";
    let p = unique(tag);
    let cc = coord(&p).await;
    let c = raw(&cc);
    let mut f = Found::default();
    let one = req(1, 1, TTL, false);
    let mut held = Vec::new();
    let rounds = 320u64;
    for i in 0..rounds {
        let n = leak(format!("x{i}"));
        let o = OwnerToken::random();
        let t = token(&c.try_acquire(n, o.step(), &one).await).expect("the first grant");
        let second = if i % 2 == 0 { TTL3 } else { TTL };
        let e1 = {
            let c = c.clone();
            tokio::spawn(async move { c.extend(n, o.step(), TTL2).await })
        };
        tokio::task::yield_now().await;
        spin(wide(i / 2));
        let e2 = c.extend(n, o.step(), second).await;
        let e1 = e1.await.unwrap();
        let what = format!(
            "token {t}, extend {}s {}, extend {}s {}",
            TTL2.as_secs(),
            short(&e1),
            second.as_secs(),
            short(&e2)
        );
        if !matches!((&e1, &e2), (Ok(true), Ok(true))) {
            f.add("an extend of a live grant not answered true", what.clone());
        }
        held.push((n, o, t, second, what));
    }
    sleep(SETTLE).await;
    for (n, o, t, second, what) in &held {
        check_holds(&mut f, &p, (n, o), (*t, None), &[1], &[TTL2, *second], what).await;
    }
    for (n, o, _, second, what) in &held {
        check_follow_up(&mut f, &c, &p, n, o, *second, what).await;
    }
    f.assert_none(tag, rounds as usize, "");
}

/// A holder's attempt racing its moving extend: owner O holds the only
/// permit of a fresh name (TTL, token t) through client C. Through C,
/// concurrently: an extend of O to TTL2 (a move to a new lease, the old
/// one revoked) and, after a spun delay, an attempt of O with TTL (even
/// rounds) or TTL2 (odd rounds). The attempt reads O's grant on the old
/// lease, keeps that lease alive and records it; the extend records the
/// new lease. Nobody releases: the attempt must answer Granted(t) (the
/// owner holds), the extend true, and O's one grant stays at t. With D2
/// (without one call at a time), in about a fifth of the rounds the grant
/// moved to the extend's lease is deleted (that lease revoked by the
/// attempt, in `semaphore/acquire.rs`) and the attempt answers a new token:
/// between the two, the permit was free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_attempt_racing_a_moving_extend_keeps_the_moved_grant() {
    let tag = "sso-att-ext";
    let p = unique(tag);
    let cc = coord(&p).await;
    let c = raw(&cc);
    let mut f = Found::default();
    let one = req(1, 1, TTL, false);
    let mut held = Vec::new();
    let rounds = 320u64;
    for i in 0..rounds {
        let n = leak(format!("h{i}"));
        let o = OwnerToken::random();
        let t = token(&c.try_acquire(n, o.step(), &one).await).expect("the first grant");
        let attl = if i % 2 == 0 { TTL } else { TTL2 };
        let e = {
            let c = c.clone();
            tokio::spawn(async move { c.extend(n, o.step(), TTL2).await })
        };
        tokio::task::yield_now().await;
        spin(wide(i / 2));
        let a = c.try_acquire(n, o.step(), &req(1, 1, attl, false)).await;
        let e = e.await.unwrap();
        let what = format!(
            "token {t}, extend {}s {}, attempt {}s {}",
            TTL2.as_secs(),
            short(&e),
            attl.as_secs(),
            short(&a)
        );
        if !matches!(e, Ok(true)) {
            f.add("the extend of a live grant not answered true", what.clone());
        }
        if token(&a) != Some(t) {
            f.add(
                "the holder's attempt not answered Granted with its token",
                what.clone(),
            );
        }
        held.push((n, o, t, attl, what));
    }
    sleep(SETTLE).await;
    let mut shown = 0;
    for (n, o, t, attl, what) in &held {
        check_holds(&mut f, &p, (n, o), (*t, None), &[1], &[TTL2, *attl], what).await;
        let now = grants_of(&p, n, o).await;
        if shown < 3 && now.iter().any(|r| r.create != *t) {
            shown += 1;
            println!("{tag} {n} ({what}):\n{}", history(&p, n, *t).await);
        }
    }
    for (n, o, _, attl, what) in &held {
        check_follow_up(&mut f, &c, &p, n, o, *attl, what).await;
    }
    f.assert_none(tag, rounds as usize, "");
}
