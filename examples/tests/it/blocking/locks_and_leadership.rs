//! Locks, leases, fencing tokens and elections from plain threads: taken,
//! extended, inspected and released; `with_lock` and `with_leadership`
//! around the caller's work.

use std::time::{Duration, Instant};

use coord::{Acquired, Error, LockOptions, WithLockError};

use super::{S, memory};

#[test]
fn locks_take_extend_inspect_and_release_without_a_runtime() {
    let locks = memory().locks().unwrap();
    let g = locks.try_acquire("blk-lock", 30 * S).unwrap().unwrap();
    assert!(g.is_valid() && !g.has_watchdog());
    assert!(locks.try_acquire("blk-lock", 30 * S).unwrap().is_none());
    let busy = locks.acquire("blk-lock", 30 * S, Duration::from_millis(20));
    assert!(matches!(busy, Err(Error::Timeout { .. })), "{busy:?}");
    g.extend(60 * S).unwrap();
    assert_eq!(g.ttl(), 60 * S);
    assert!(g.valid_until() > Instant::now() + 50 * S);
    let info = locks.inspect("blk-lock").unwrap();
    assert_eq!(info.holders[0].owner_id, g.owner_id());
    match locks
        .acquire_or_holders("blk-lock", LockOptions::new(30 * S), None)
        .unwrap()
    {
        Acquired::Held(Some(info)) => assert_eq!(info.holders[0].owner_id, g.owner_id()),
        other => panic!("{other:?}"),
    }
    let first = g.fencing_token();
    g.release().unwrap();

    let who = serde_json::json!({"host": "blk"});
    let g = locks
        .acquire_with_metadata("blk-lock", LockOptions::new(30 * S).watchdog(true), &who)
        .unwrap();
    assert!(g.fencing_token() > first && g.has_watchdog());
    assert_eq!(
        locks.inspect("blk-lock").unwrap().holders[0]
            .metadata
            .as_ref(),
        Some(&who)
    );
    assert!(locks.force_release("blk-lock").unwrap());
    assert!(matches!(g.release(), Err(Error::NotHeld { .. })));

    let both = locks
        .acquire_all(["blk-lock-b", "blk-lock-a"], LockOptions::new(30 * S))
        .unwrap();
    assert_eq!(both.names(), vec!["blk-lock-a", "blk-lock-b"]);
    assert!(both.is_valid() && both.fencing_token("blk-lock-a").is_some());
    both.release().unwrap();

    let out = locks
        .with_lock("blk-lock-a", LockOptions::new(30 * S), |held| {
            assert!(held.is_valid() && !held.lost_token().is_cancelled());
            held.fencing_token()
        })
        .unwrap();
    assert!(out.get() > 0);
    assert!(locks.try_acquire("blk-lock-a", 30 * S).unwrap().is_some());
}

#[test]
fn with_lock_returns_the_output_as_lost_when_the_lock_went_while_work_ran() {
    let locks = memory().locks().unwrap();
    let r = locks.with_lock("blk-with-lost", LockOptions::new(30 * S), |_| {
        locks.force_release("blk-with-lost").unwrap();
        7
    });
    match r {
        Err(WithLockError::Release { output: 7, error }) => {
            assert!(matches!(error, Error::Lost { .. }), "{error:?}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn with_leadership_keeps_the_leadership_alive_and_resigns_without_a_runtime() {
    let elections = memory().elections().unwrap();
    // Long enough that a renewal (every third of it) slowed by a loaded
    // machine still comes in time.
    let ttl = 2 * S;
    let term = elections
        .with_leadership("blk-with-leader", "a", ttl, Duration::ZERO, |leader| {
            // Two TTLs on this thread: only the watchdog keeps it.
            std::thread::sleep(ttl * 2);
            let now = elections
                .leader("blk-with-leader")
                .unwrap()
                .expect("a leader");
            assert_eq!(
                (now.candidate.as_str(), now.term),
                ("a", leader.fencing_token())
            );
            leader.fencing_token()
        })
        .expect("led to the end");
    assert!(
        elections.leader("blk-with-leader").unwrap().is_none(),
        "resigned"
    );
    let next = elections
        .campaign("blk-with-leader", "b", ttl, Duration::ZERO)
        .unwrap();
    assert!(next.term() > term);
    next.resign().unwrap();
}

#[test]
fn leases_grant_renew_inspect_and_revoke_without_a_runtime() {
    let leases = memory().leases().unwrap();
    let l = leases.grant("blk-lease", 30 * S).unwrap().unwrap();
    assert!(leases.grant("blk-lease", 30 * S).unwrap().is_none());
    assert!(leases.is_alive("blk-lease").unwrap());
    l.renew(60 * S).unwrap();
    assert!(leases.remaining("blk-lease").unwrap().unwrap() > 50 * S);
    assert!(matches!(
        leases.grant_or_holders("blk-lease", 30 * S, None).unwrap(),
        Acquired::Held(Some(_))
    ));
    l.revoke().unwrap();
    assert!(!leases.is_alive("blk-lease").unwrap());
    let me = serde_json::json!({"worker": 7});
    let l = leases
        .grant_with_metadata("blk-lease", 30 * S, &me)
        .unwrap()
        .unwrap();
    assert_eq!(
        leases.inspect("blk-lease").unwrap().holders[0]
            .metadata
            .as_ref(),
        Some(&me)
    );
    l.revoke().unwrap();
}

#[test]
fn fencing_tokens_rise_without_a_runtime() {
    let fencing = memory().fencing().unwrap();
    let a = fencing.next("blk-fence").unwrap();
    let b = fencing.next("blk-fence").unwrap();
    assert!(b > a);
}

#[test]
fn an_election_is_won_observed_and_resigned_without_a_runtime() {
    let coord = memory();
    let elections = coord.elections().unwrap();
    let mut changes = elections.observe("blk-elect").unwrap();
    assert_eq!(changes.next().unwrap().unwrap(), None, "vacant at first");

    let mut lead = elections
        .campaign("blk-elect", "node-1", 30 * S, S)
        .unwrap();
    lead.keep_alive();
    assert_eq!(lead.candidate(), "node-1");
    assert_eq!(lead.term(), lead.fencing_token());
    let seen = changes.next_timeout(5 * S).unwrap().unwrap().unwrap();
    assert_eq!(
        (seen.candidate.as_str(), seen.term),
        ("node-1", lead.term())
    );
    let leader = elections.leader("blk-elect").unwrap().unwrap();
    assert_eq!(leader.candidate, "node-1");
    assert_eq!(
        elections.inspect("blk-elect").unwrap().unwrap().owner_id,
        lead.owner_id()
    );
    assert!(
        elections
            .try_campaign("blk-elect", "node-2", 30 * S)
            .unwrap()
            .is_none()
    );
    assert!(
        changes.next_timeout(Duration::from_millis(50)).is_none(),
        "no change while the leader leads"
    );

    let first = lead.term();
    lead.resign().unwrap();
    assert_eq!(changes.next_timeout(5 * S).unwrap().unwrap(), None);
    let next = elections
        .try_campaign("blk-elect", "node-2", 30 * S)
        .unwrap()
        .unwrap();
    assert!(next.term() > first);
    next.resign().unwrap();
}
