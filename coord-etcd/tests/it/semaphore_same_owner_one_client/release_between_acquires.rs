//! Acquire, release and acquire again of one owner racing each other:
//! two tokens are answered only around a release.

use conformance::spin;
use coord_core::OwnerToken;
use tokio::time::sleep;

use crate::semaphore_support;
use semaphore_support::{coord, raw, req, unique};

use super::{
    Found, SETTLE, TTL, check_follow_up, check_holds, check_nothing, grants_of, leak, short, sweep,
    token, wide,
};

/// Owner O, no grant, on a fresh name with room for two (total 2, one
/// permit asked). Through client C: an attempt A1, after a spun delay a
/// release R, after another an attempt A2 (the same request). What the
/// answers imply:
/// - both Granted with one token t: R true means it came after both
///   (nothing of O left), false before both (t held);
/// - two tokens: only a release between them explains it, so R must be
///   true and the later token's grant held (the earlier one gone);
/// - never two grants of O, never more permits than the total.
///
/// D1 makes it fail (two tokens with the release answered false: the two
/// attempts both granted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_release_acquire_answer_two_tokens_only_around_a_release() {
    let tag = "sso-arc";
    let p = unique(tag);
    let cc = coord(&p).await;
    let c = raw(&cc);
    let mut f = Found::default();
    let r1 = req(1, 2, TTL, false);
    let mut must_hold = Vec::new();
    let mut must_go = Vec::new();
    let (mut one_token, mut two_tokens, mut released) = (0, 0, 0);
    let rounds = 360u64;
    for i in 0..rounds {
        let n = leak(format!("d{i}"));
        let o = OwnerToken::random();
        let a1 = {
            let c = c.clone();
            tokio::spawn(async move { c.try_acquire(n, o.step(), &r1).await })
        };
        tokio::task::yield_now().await;
        spin(wide(i));
        let rel = {
            let c = c.clone();
            tokio::spawn(async move { c.release(n, o.step()).await })
        };
        tokio::task::yield_now().await;
        spin(sweep(i / 60));
        let a2 = c.try_acquire(n, o.step(), &r1).await;
        let (a1, rel) = (a1.await.unwrap(), rel.await.unwrap());
        let at_once = grants_of(&p, n, &o).await.len();
        let what = format!(
            "A1 {}, release {}, A2 {}",
            short(&a1),
            short(&rel),
            short(&a2)
        );
        if at_once > 1 {
            f.add(
                "two grants of the owner in etcd once all three answered",
                format!("{n}: {at_once} grants; {what}"),
            );
        }
        released += usize::from(matches!(rel, Ok(true)));
        match (token(&a1), token(&a2), &rel) {
            (Some(x), Some(y), Ok(true)) if x == y => {
                one_token += 1;
                must_go.push((n, o, what));
            }
            (Some(x), Some(y), Ok(false)) if x == y => {
                one_token += 1;
                must_hold.push((n, o, x, what));
            }
            (Some(x), Some(y), Ok(true)) => {
                two_tokens += 1;
                must_hold.push((n, o, x.max(y), what));
            }
            (Some(_), Some(_), Ok(false)) => {
                two_tokens += 1;
                f.add(
                    "two tokens answered with no release between them",
                    format!("{n}: {what}"),
                );
            }
            _ => f.add("a call not answered as expected", format!("{n}: {what}")),
        }
    }
    sleep(SETTLE).await;
    for (n, o, t, what) in &must_hold {
        check_holds(&mut f, &p, (n, o), (*t, None), &[1], &[TTL], what).await;
    }
    for (n, o, what) in &must_go {
        check_nothing(&mut f, &p, n, o, what).await;
    }
    for (n, o, _, what) in &must_hold {
        check_follow_up(&mut f, &c, &p, n, o, TTL, what).await;
    }
    f.assert_none(
        tag,
        rounds as usize,
        &format!(
            "one token in {one_token} rounds, two in {two_tokens}; the release true in {released}"
        ),
    );
}
