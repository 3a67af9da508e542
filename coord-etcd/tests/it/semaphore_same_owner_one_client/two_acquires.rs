//! Two concurrent attempts of one owner with no grant yet: with room for
//! both, for the only permit, with two TTLs, or with different permit
//! counts, they make or keep exactly one grant.

use std::time::Duration;

use conformance::spin;
use coord_core::{Attempt, OwnerToken, PermitRequest};
use tokio::time::sleep;

use crate::semaphore_support;
use semaphore_support::{coord, raw, req, unique};

use super::{
    Found, SETTLE, Sem, TTL, TTL2, check_follow_up, check_holds, grants_of, history, leak, short,
    sweep, token,
};

/// Two attempts of one owner (no grant yet) on a fresh name, started
/// together through one client, `a` first and `b` after a spun delay:
/// the round's answers and the owner's grants right after both answered
/// (before background revocations land).
async fn two_acquires(
    c: &Sem,
    p: &str,
    n: &'static str,
    o: OwnerToken,
    (a, b): (PermitRequest, PermitRequest),
    delay: Duration,
) -> (
    coord_core::Result<Attempt>,
    coord_core::Result<Attempt>,
    usize,
) {
    let first = {
        let c = c.clone();
        tokio::spawn(async move { c.try_acquire(n, o.step(), &a).await })
    };
    tokio::task::yield_now().await;
    spin(delay);
    let second = c.try_acquire(n, o.step(), &b).await;
    let first = first.await.unwrap();
    let at_once = grants_of(p, n, &o).await.len();
    (first, second, at_once)
}

/// Two concurrent attempts of one owner, `a` and `b`, on fresh names,
/// `rounds` rounds. Checked: both answered Granted (the total always has
/// room for either); both with the same token (the trait: an owner that
/// holds is granted again with the same token, and nothing released it);
/// the owner never had two grants (right after the answers); afterwards
/// its one grant is the token answered, on a live lease; its client
/// extends and releases it.
async fn acquires_race(tag: &str, rounds: u64, a: PermitRequest, b: PermitRequest) {
    let p = unique(tag);
    let cc = coord(&p).await;
    let c = raw(&cc);
    let mut f = Found::default();
    let mut done = Vec::new();
    let (mut same, mut differ) = (0, 0);
    let mut answers = Vec::new();
    for i in 0..rounds {
        let n = leak(format!("a{i}"));
        let o = OwnerToken::random();
        answers.push((n, o, two_acquires(&c, &p, n, o, (a, b), sweep(i)).await));
    }
    for (n, o, (x, y, at_once)) in answers {
        let what = format!("answers {} / {}", short(&x), short(&y));
        if at_once > 1 {
            f.add(
                "two grants of the owner in etcd once both attempts answered",
                format!("{n}: {at_once} grants; {what}"),
            );
        }
        match (token(&x), token(&y)) {
            (Some(tx), Some(ty)) if tx == ty => {
                same += 1;
                done.push((n, o, (tx, None), what));
            }
            (Some(tx), Some(ty)) => {
                differ += 1;
                f.add(
                    "both attempts answered Granted with different tokens",
                    format!("{n}: {what}"),
                );
                done.push((n, o, (tx, Some(ty)), what));
            }
            _ => f.add("an attempt not answered Granted", format!("{n}: {what}")),
        }
    }
    sleep(SETTLE).await;
    let permits = [a.permits, b.permits];
    let ttls = [a.ttl, b.ttl];
    let mut shown = 0;
    for (n, o, (t, also), what) in &done {
        check_holds(&mut f, &p, (n, o), (*t, *also), &permits, &ttls, what).await;
        if let Some(u) = also {
            let live: Vec<i64> = grants_of(&p, n, o).await.iter().map(|r| r.create).collect();
            for x in [*t, *u].iter().filter(|x| !live.contains(x)) {
                f.add(
                    "a grant answered Granted (never released) gone from etcd",
                    format!("{n}: token {x} gone, the owner's grants now {live:?}; {what}"),
                );
            }
            if shown < 2 {
                shown += 1;
                println!(
                    "{tag} {n} ({what}):\n{}",
                    history(&p, n, t.min(u) - 8).await
                );
            }
        }
    }
    for (n, o, _, what) in &done {
        check_follow_up(&mut f, &c, &p, n, o, a.ttl, what).await;
    }
    f.assert_none(
        tag,
        rounds as usize,
        &format!("both Granted with one token in {same}, with two tokens in {differ}"),
    );
}

/// Same TTL, one permit each, room for both (total 2). Each attempt
/// reads no grant of the owner, takes a lease (L1, L2) and writes its own
/// key `h/<L1>`, `h/<L2>` with free slots: nothing in the grant
/// transaction compares the owner's other keys (D1 without one call at a
/// time: about a third of the rounds fail, those where the two attempts
/// draw different slots).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_acquires_with_room_for_both_make_one_grant() {
    let r = req(1, 2, TTL, false);
    acquires_race("sso-acq-room", 320, r, r).await;
}

/// Same TTL, the only permit (total 1): one attempt's slot compare
/// fails and its next round finds the other's grant (adopting it if the
/// winner has not recorded it yet). D3 without one call at a time fails
/// rarely (0 to 4 rounds of several hundred), when the winner's task is
/// polled late after its reply: the loser has by then adopted and moved
/// the grant, and the winner's record revokes the lease it moved to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_acquires_for_the_only_permit_keep_the_grant() {
    let r = req(1, 1, TTL, false);
    acquires_race("sso-acq-one", 150, r, r).await;
}

/// Two TTLs, the only permit: the loser finds the owner's grant of
/// the other TTL and moves it (`sem_extend`) to a lease of its TTL. D3 as
/// above (rare).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_acquires_of_two_ttls_for_the_only_permit_keep_the_grant() {
    acquires_race(
        "sso-acq-ttl",
        150,
        req(1, 1, TTL, false),
        req(1, 1, TTL2, false),
    )
    .await;
}

/// Different permit counts (1 and 2), room for both (total 4): D1 would
/// have the owner hold 3 permits for a moment, then one of the grants
/// answered revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_acquires_of_different_permits_make_one_grant() {
    acquires_race(
        "sso-acq-permits",
        320,
        req(1, 4, TTL, false),
        req(2, 4, TTL, false),
    )
    .await;
}
