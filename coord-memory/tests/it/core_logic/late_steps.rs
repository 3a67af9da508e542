//! The book of steps whose reply never came is the core's
//! (`coord_core::late`): every claim call carries a `Step`, and an owner
//! one of whose steps went unanswered has its later extends and its
//! release told to mark, until that release; other owners' steps are not.

use crate::support;
use std::time::Duration;

use coord_core::Step;
use support::faulty::{Fault, Faulty};

use super::{MS, S};

fn marks(steps: &[Step]) -> Vec<bool> {
    steps.iter().map(|s| s.mark).collect()
}

/// A lock acquire whose first attempt's reply was lost (granted, then
/// granted again to the retry): that owner's extend and release mark; the
/// next acquire's steps, all answered, do not. Each owner's stamps rise.
#[tokio::test(start_paused = true)]
async fn a_lock_owner_with_a_lost_reply_marks_its_extend_and_release() {
    let f = Faulty::new();
    let locks = f.coord(10 * MS).locks().unwrap();
    f.next("lock.try_acquire", Fault::LoseReply, 1);
    let g = locks.acquire("n", 10 * S, 2 * S).await.unwrap();
    g.extend(10 * S).await.unwrap();
    g.release().await.unwrap();
    let g = locks.acquire("n", 10 * S, Duration::ZERO).await.unwrap();
    g.extend(10 * S).await.unwrap();
    g.release().await.unwrap();

    let (a, e, r) = (
        f.steps("lock.try_acquire"),
        f.steps("lock.extend"),
        f.steps("lock.release"),
    );
    assert_eq!(marks(&a), [false, false, false], "attempts never mark");
    assert_eq!(marks(&e), [true, false]);
    assert_eq!(marks(&r), [true, false]);
    let first = a[0].owner;
    assert!(a[1].owner == first && e[0].owner == first && r[0].owner == first);
    assert!(a[2].owner != first && e[1].owner == a[2].owner && r[1].owner == a[2].owner);
    assert!(a[0].stamp < a[1].stamp && a[1].stamp < e[0].stamp && e[0].stamp < r[0].stamp);
}

/// An extend whose reply was lost: the owner's next extend marks, and so
/// does its release; the book forgets the owner at the release.
#[tokio::test(start_paused = true)]
async fn a_lost_extend_reply_marks_the_owners_later_steps() {
    let f = Faulty::new();
    let locks = f.coord(10 * MS).locks().unwrap();
    let g = locks.acquire("n", 10 * S, Duration::ZERO).await.unwrap();
    f.next("lock.extend", Fault::LoseReply, 1);
    assert!(g.extend(10 * S).await.is_err());
    g.extend(10 * S).await.unwrap();
    g.extend(10 * S).await.unwrap();
    g.release().await.unwrap();
    assert_eq!(marks(&f.steps("lock.extend")), [false, true, true]);
    assert_eq!(marks(&f.steps("lock.release")), [true]);
}

/// A lease grant whose reply was lost fails; the core's cleanup revokes
/// as that owner, marking. A later grant by a new owner marks nothing.
#[tokio::test(start_paused = true)]
async fn a_lost_lease_grant_is_revoked_with_a_mark() {
    let f = Faulty::new();
    let leases = f.coord(10 * MS).leases().unwrap();
    f.next("lease.grant", Fault::LoseReply, 1);
    assert!(leases.grant("n", 10 * S).await.is_err());
    // The cleanup runs in the background.
    tokio::time::sleep(S).await;
    let revokes = f.steps("lease.revoke");
    assert_eq!(marks(&revokes), [true]);
    assert_eq!(revokes[0].owner, f.steps("lease.grant")[0].owner);
    let g = leases.grant("n", 10 * S).await.unwrap().expect("free");
    g.revoke().await.unwrap();
    assert_eq!(marks(&f.steps("lease.revoke")), [true, false]);
}

/// A campaign whose first attempt's reply was lost: the leader's
/// resignation marks.
#[tokio::test(start_paused = true)]
async fn a_leader_with_a_lost_campaign_reply_marks_its_resignation() {
    let f = Faulty::new();
    let elections = f.coord(10 * MS).elections().unwrap();
    f.next("election.try_campaign", Fault::LoseReply, 1);
    let l = elections.campaign("n", "me", 10 * S, 2 * S).await.unwrap();
    l.resign().await.unwrap();
    assert_eq!(marks(&f.steps("election.resign")), [true]);
}
