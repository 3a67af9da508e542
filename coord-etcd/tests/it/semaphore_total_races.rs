//! etcd semaphores: a `permits_total` binds while the name has holders or
//! waiters (docs/guarantees.md), also against an attempt with another
//! total racing for the first permit of an idle name. Each attempt checks
//! the totals on its read; the grant transaction must notice a first grant
//! with another total made since that read, or both are granted (the
//! total-1 holder then has company, and every later attempt is refused
//! until one of them releases).
//!
//! Two clients of the binary's shared etcd (connections of their own), a
//! key prefix of the test's own, a fresh idle name per round; a place
//! written on a read the name outlived is made real with
//! `FaultProxy::deliver_late` (see `semaphore_late.rs`).

use std::sync::Arc;

use conformance::testkit::etcd;
use conformance::testkit::proxy::FaultProxy;
use coord_core::{Attempt, Error, OwnerToken, Semaphore};
use tokio::sync::Barrier;

use crate::{late_support, semaphore_support};
use semaphore_support::*;

/// Rounds of the race: without the check, both attempts are granted in
/// more than half of them.
const ROUNDS: usize = 60;

/// How one racing attempt ended.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    Granted,
    Refused,
    OtherTotal,
}

fn outcome(a: &coord_core::Result<Attempt>) -> Outcome {
    match a {
        Ok(Attempt::Granted(_)) => Outcome::Granted,
        Ok(Attempt::Held { .. }) => Outcome::Refused,
        Err(Error::InvalidArgument {
            field: "permits_total",
            ..
        }) => Outcome::OtherTotal,
        Err(e) => panic!("a racing attempt failed: {e:?}"),
    }
}

/// One attempt of `owner` for one permit of `name` out of `total`, after
/// `start` lets every racer go.
async fn attempt(
    sem: Arc<dyn Semaphore>,
    start: Arc<Barrier>,
    name: String,
    owner: OwnerToken,
    total: u32,
) -> coord_core::Result<Attempt> {
    start.wait().await;
    sem.try_acquire(&name, owner.step(), &req(1, total, LONG, false))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_grants_with_different_totals_never_both_hold() {
    let p = unique("total-race");
    let (one, two) = (raw(&coord(&p).await), raw(&coord(&p).await));
    let mut both = Vec::new();
    for round in 0..ROUNDS {
        let n = format!("r{round}");
        let (o1, o2) = (OwnerToken::random(), OwnerToken::random());
        let start = Arc::new(Barrier::new(2));
        let a1 = tokio::spawn(attempt(one.clone(), start.clone(), n.clone(), o1, 1));
        let a2 = tokio::spawn(attempt(two.clone(), start, n.clone(), o2, 2));
        let (r1, r2) = (a1.await.unwrap(), a2.await.unwrap());
        let (x1, x2) = (outcome(&r1), outcome(&r2));
        let (grants, places, slots) = state(&p, &n).await;
        assert!(
            places.is_empty(),
            "round {round}: a one-shot attempt queued"
        );
        let totals: Vec<u32> = grants.iter().map(|g| g.total).collect();
        if x1 == Outcome::Granted && x2 == Outcome::Granted {
            // Leave the name idle for the check below, and go on counting.
            both.push(round);
            assert!(one.release(&n, o1.step()).await.unwrap());
            assert!(two.release(&n, o2.step()).await.unwrap());
            continue;
        }
        // Exactly one holds, the other was turned away without a trace.
        let (holder, h_owner, h_total, other, o_owner, o_total) = match (x1, x2) {
            (Outcome::Granted, Outcome::OtherTotal | Outcome::Refused) => {
                (&one, &o1, 1, &two, &o2, 2)
            }
            (Outcome::OtherTotal | Outcome::Refused, Outcome::Granted) => {
                (&two, &o2, 2, &one, &o1, 1)
            }
            _ => panic!("round {round}: neither granted on an idle name: {r1:?}, {r2:?}"),
        };
        assert_eq!(totals, vec![h_total], "round {round}: etcd's grants");
        assert_eq!(slots, 1, "round {round}: slot keys");
        // While it holds, the other total stays refused.
        let again = other
            .try_acquire(&n, o_owner.step(), &req(1, o_total, LONG, false))
            .await;
        assert_eq!(
            outcome(&again),
            Outcome::OtherTotal,
            "round {round}: the other total while the name is held: {again:?}"
        );
        // Once the holder released, the other total is the name's.
        assert!(holder.release(&n, h_owner.step()).await.unwrap());
        granted(
            other
                .try_acquire(&n, o_owner.step(), &req(1, o_total, LONG, false))
                .await,
        );
        assert!(other.release(&n, o_owner.step()).await.unwrap());
        assert!(
            sem_keys(&p, &n).await.is_empty(),
            "round {round}: the idle name left keys"
        );
    }
    assert!(
        both.is_empty(),
        "totals 1 and 2 were both granted in {} of {ROUNDS} rounds: {both:?}",
        both.len()
    );
}

/// A waiter's place is written on a read that showed the name held with
/// its total (2), but reaches etcd only after that holder released and
/// another owner took the name with total 1: it must not join the name,
/// whose total is now 1 (a place of total 2 beside a grant of total 1
/// turns every attempt of either total away while it lives, 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_place_written_after_the_total_changed_never_joins_the_name() {
    use late_support::{CALL_TIMEOUT, CUT_AFTER, DELAY, connect, direct, writes_an_owner_key};
    let p = unique("total-place");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let far = connect(proxy.port(), &p, CALL_TIMEOUT).await;
    let near = direct(&p).await;
    let n = "q";
    // Warm the slow client's connection.
    late_support::warm_semaphore(&*far).await;
    let (holder, waiter, next) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    granted(
        near.try_acquire(n, holder.step(), &req(2, 2, LONG, false))
            .await,
    );
    proxy.deliver_late(writes_an_owner_key(format!("sem/{n}/w/")), DELAY, CUT_AFTER);
    let queued = far
        .try_acquire(n, waiter.step(), &req(1, 2, LONG, true))
        .await;
    assert_eq!(
        proxy.held(),
        1,
        "the place's write was not held: {queued:?}"
    );
    assert_eq!(proxy.delivered(), 0, "the held place was not late");
    assert!(near.release(n, holder.step()).await.unwrap());
    granted(
        near.try_acquire(n, next.step(), &req(1, 1, LONG, false))
            .await,
    );
    late_support::until_the_late_copy_landed(&proxy).await;
    let (grants, places, _) = state(&p, n).await;
    proxy.heal();
    let _ = far.release(n, waiter.step()).await;
    assert!(near.release(n, next.step()).await.unwrap());
    assert!(
        grants.iter().chain(&places).all(|r| r.total == 1),
        "the name holds totals other than its grant's: grants {grants:#?}, places {places:#?}"
    );
    assert!(sem_keys(&p, n).await.is_empty(), "the idle name left keys");
}
