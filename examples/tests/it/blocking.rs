//! The blocking API, called the way it is meant to be: from plain threads
//! with no runtime (`#[test]`, not `#[tokio::test]`).
//!
//! `memory://` is one store per process, shared by every test of this
//! binary: each test uses names of its own. These tests live beside the
//! example programs (not in the `coord` crate) because they call the API
//! only as a user's program does.

use std::thread;
use std::time::{Duration, Instant};

use coord::blocking::*;
use coord::{
    Acquired, Error, Lane, LockOptions, PermitOptions, PopOptions, PushOptions, Quota, RwMode,
    WithLockError,
};

const S: Duration = Duration::from_secs(1);

fn memory() -> Coord {
    connect("memory://").expect("memory:// connects")
}

/// Whether `f` turns true within `within`, checked every 10 ms.
fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

fn is_runtime_refusal(e: &Error) -> bool {
    matches!(e, Error::InvalidArgument { field: "runtime", reason }
        if reason.contains("Use the async API inside a runtime"))
}

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

#[test]
fn a_barrier_lets_three_threads_pass_together() {
    let barriers = memory().barriers().unwrap();
    let waits: Vec<_> = ["p1", "p2", "p3"]
        .into_iter()
        .map(|p| {
            let b = barriers.clone();
            thread::spawn(move || b.wait("blk-barrier", 3, p, 10 * S))
        })
        .collect();
    let generations: Vec<u64> = waits
        .into_iter()
        .map(|t| t.join().unwrap().unwrap())
        .collect();
    assert!(generations.iter().all(|g| *g == generations[0]));
    let alone = barriers.wait("blk-barrier", 3, "p1", Duration::from_millis(50));
    assert!(matches!(alone, Err(Error::Timeout { .. })), "{alone:?}");
}

#[test]
fn a_rate_limiter_admits_denies_and_waits_without_a_runtime() {
    let limiter = memory().limiter().unwrap();
    let quota = Quota::per(2, Duration::from_millis(500));
    assert!(limiter.check("blk-limit", quota).unwrap().allowed);
    assert!(limiter.check_cost("blk-limit", quota, 1).unwrap().allowed);
    let denied = limiter.check("blk-limit", quota).unwrap();
    assert!(!denied.allowed && denied.retry_after > Duration::ZERO);
    assert!(limiter.wait("blk-limit", quota, 1, 5 * S).unwrap().allowed);
}

#[test]
fn semaphore_permits_are_counted_and_given_back_without_a_runtime() {
    let sem = memory().semaphores().unwrap();
    let two = sem
        .try_acquire_many("blk-sem", 2, 3, 30 * S)
        .unwrap()
        .unwrap();
    assert_eq!((two.permits(), two.permits_total()), (2, 3));
    let one = sem.acquire("blk-sem", 3, 30 * S, S).unwrap();
    assert!(sem.try_acquire("blk-sem", 3, 30 * S).unwrap().is_none());
    assert_eq!(sem.inspect("blk-sem").unwrap().holders.len(), 2);
    two.release().unwrap();
    let again = sem.acquire_many("blk-sem", 2, 3, 30 * S, S).unwrap();
    assert!(matches!(
        sem.acquire_or_holders("blk-sem", PermitOptions::new(3, 30 * S), None)
            .unwrap(),
        Acquired::Held(Some(_))
    ));
    again.into_guard().release().unwrap();
    one.release().unwrap();
    let p = sem
        .acquire_with("blk-sem", PermitOptions::new(3, 30 * S).watchdog(true))
        .unwrap();
    assert!(p.has_watchdog());
    assert!(sem.force_release("blk-sem").unwrap());
    assert!(matches!(p.release(), Err(Error::NotHeld { .. })));
}

#[test]
fn read_write_locks_share_reads_and_exclude_writes_without_a_runtime() {
    let rw = memory().rw_locks().unwrap();
    let r1 = rw.read("blk-rw", 30 * S, Duration::ZERO).unwrap();
    let r2 = rw.try_read("blk-rw", 30 * S).unwrap().unwrap();
    assert_eq!((r1.mode(), r1.name()), (RwMode::Read, "blk-rw"));
    assert!(rw.try_write("blk-rw", 30 * S).unwrap().is_none());
    r1.release().unwrap();
    r2.release().unwrap();
    let w = rw.write("blk-rw", 30 * S, S).unwrap();
    assert_eq!(w.mode(), RwMode::Write);
    assert!(rw.try_read("blk-rw", 30 * S).unwrap().is_none());
    w.release().unwrap();
    let w = rw.try_write("blk-rw", 30 * S).unwrap().unwrap();
    assert!(rw.force_release("blk-rw").unwrap());
    let e = w.release().unwrap_err();
    assert!(
        matches!(&e, Error::NotHeld { name } if name == "blk-rw"),
        "{e:?}"
    );
}

#[test]
fn a_queue_pushes_pops_extends_nacks_and_acks_without_a_runtime() {
    let q = memory().queues().unwrap();
    assert!(q.max_payload() > 0 && !q.durable());
    let id = q.push("blk-queue", b"job-1").unwrap();
    q.push_json("blk-queue", &("job", 2), &PushOptions::new())
        .unwrap();
    let dup = PushOptions::new().dedup_id("job-3");
    let first = q.push_with("blk-queue", b"job-3", &dup).unwrap();
    let again = q.push_with("blk-queue", b"job-3", &dup).unwrap();
    assert_eq!((again.id, again.duplicate), (first.id, true));
    assert_eq!(q.stats("blk-queue").unwrap().ready, 3);
    assert_eq!(q.peek("blk-queue", Lane::Main, 10).unwrap().len(), 3);

    let d = q.pop("blk-queue", 30 * S, S).unwrap().unwrap();
    assert_eq!((d.id(), d.payload(), d.attempts()), (id, &b"job-1"[..], 1));
    assert_eq!(
        (d.queue(), d.lane(), d.group()),
        ("blk-queue", Lane::Main, None)
    );
    assert!(d.enqueued_at() <= std::time::SystemTime::now());
    d.extend(60 * S).unwrap();
    assert_eq!(q.stats("blk-queue").unwrap().in_flight, 1);
    d.nack(Duration::ZERO).unwrap();
    let d = q.pop("blk-queue", 30 * S, S).unwrap().unwrap();
    assert_eq!((d.id(), d.attempts()), (id, 2));
    d.ack().unwrap();

    let d = q
        .pop_with("blk-queue", PopOptions::new(30 * S).watchdog(true))
        .unwrap()
        .unwrap();
    assert!(d.has_watchdog());
    assert_eq!(d.json::<(String, u32)>().unwrap(), ("job".to_string(), 2));
    d.ack().unwrap();
    assert_eq!(q.redrive("blk-queue", 10).unwrap(), 0);
    assert_eq!(q.purge("blk-queue").unwrap(), 1);
    assert!(
        q.pop("blk-queue", 30 * S, Duration::ZERO)
            .unwrap()
            .is_none()
    );
}

#[test]
fn a_dropped_lock_guard_is_free_at_once_for_another_client() {
    let (a, b) = (memory(), memory());
    let held = a
        .locks()
        .unwrap()
        .try_acquire("blk-drop", 60 * S)
        .unwrap()
        .unwrap();
    let other = b.locks().unwrap();
    assert!(other.try_acquire("blk-drop", 60 * S).unwrap().is_none());
    drop(held);
    // Zero wait: the drop released it on the store, not left it to its TTL.
    let g = other.try_acquire("blk-drop", 60 * S).unwrap();
    assert!(g.is_some(), "the dropped guard still holds the lock");
}

#[test]
fn every_kind_of_dropped_guard_frees_its_claim_at_once() {
    let (a, b) = (memory(), memory());

    drop(a.leases().unwrap().grant("blk-drop-lease", 60 * S).unwrap());
    assert!(!b.leases().unwrap().is_alive("blk-drop-lease").unwrap());

    drop(
        a.semaphores()
            .unwrap()
            .try_acquire("blk-drop-sem", 1, 60 * S)
            .unwrap(),
    );
    let sem = b.semaphores().unwrap();
    assert!(
        sem.try_acquire("blk-drop-sem", 1, 60 * S)
            .unwrap()
            .is_some()
    );

    drop(
        a.elections()
            .unwrap()
            .try_campaign("blk-drop-elect", "a", 60 * S)
            .unwrap(),
    );
    assert_eq!(
        b.elections().unwrap().leader("blk-drop-elect").unwrap(),
        None
    );

    drop(
        a.rw_locks()
            .unwrap()
            .try_write("blk-drop-rw", 60 * S)
            .unwrap(),
    );
    let rw = b.rw_locks().unwrap();
    assert!(rw.try_write("blk-drop-rw", 60 * S).unwrap().is_some());

    drop(
        a.locks()
            .unwrap()
            .acquire_all(["blk-drop-m1", "blk-drop-m2"], LockOptions::new(60 * S))
            .unwrap(),
    );
    let locks = b.locks().unwrap();
    assert!(locks.try_acquire("blk-drop-m2", 60 * S).unwrap().is_some());

    let q = b.queues().unwrap();
    q.push("blk-drop-queue", b"x").unwrap();
    drop(
        a.queues()
            .unwrap()
            .pop("blk-drop-queue", 60 * S, S)
            .unwrap(),
    );
    let again = q.pop("blk-drop-queue", 60 * S, Duration::ZERO).unwrap();
    assert_eq!(again.expect("given back at once").attempts(), 2);
}

#[test]
fn the_watchdog_keeps_a_claim_alive_while_the_thread_sleeps() {
    let (a, b) = (memory(), memory());
    // Long enough that a renewal (every third of it) slowed by a loaded
    // machine still comes in time.
    let ttl = 2 * S;
    let mut g = a
        .locks()
        .unwrap()
        .try_acquire("blk-watchdog", ttl)
        .unwrap()
        .unwrap();
    g.keep_alive();
    // Two TTLs, with nothing of this thread driving the runtime: its own
    // worker renews.
    thread::sleep(ttl * 2);
    let other = b.locks().unwrap();
    assert!(g.is_valid() && !g.lost_token().is_cancelled());
    assert!(
        other.try_acquire("blk-watchdog", ttl).unwrap().is_none(),
        "the lock lapsed after its TTL although the watchdog was on"
    );
    g.release().unwrap();
    assert!(other.try_acquire("blk-watchdog", ttl).unwrap().is_some());
}

#[test]
fn without_a_watchdog_the_lost_token_fires_at_the_deadline() {
    let locks = memory().locks().unwrap();
    let g = locks
        .try_acquire("blk-lapse", Duration::from_millis(100))
        .unwrap()
        .unwrap();
    // Nothing renews it, and nothing on this thread drives a timer: the
    // client's runtime cancels the token at the validity deadline.
    let lost = g.ownership().lost_token();
    assert!(eventually(5 * S, || lost.is_cancelled()));
    assert!(!g.is_valid());
}

#[test]
fn calls_inside_a_runtime_are_refused_with_a_clear_error() {
    let outside = memory();
    let locks = outside.locks().unwrap();
    let mut held = locks.try_acquire("blk-in-rt", 60 * S).unwrap().unwrap();
    for multi_thread in [false, true] {
        let rt = if multi_thread {
            tokio::runtime::Builder::new_multi_thread()
        } else {
            tokio::runtime::Builder::new_current_thread()
        }
        .enable_all()
        .build()
        .unwrap();
        rt.block_on(async {
            let e = connect("memory://").unwrap_err();
            assert!(is_runtime_refusal(&e), "{e}");
            let e = locks.try_acquire("blk-in-rt-2", 60 * S).unwrap_err();
            assert!(is_runtime_refusal(&e), "{e}");
            let e = held.extend(60 * S).unwrap_err();
            assert!(is_runtime_refusal(&e), "{e}");
            let e = outside.queues().unwrap().stats("blk-in-rt").unwrap_err();
            assert!(is_runtime_refusal(&e), "{e}");
            let mut changes = outside.elections().unwrap().observe("blk-in-rt").unwrap();
            assert!(is_runtime_refusal(&changes.next().unwrap().unwrap_err()));
            // What does not wait works anywhere.
            held.keep_alive();
            assert!(held.has_watchdog() && held.is_valid());
        });
    }
    // Nothing was done: the lock stayed free, the guard held.
    assert!(locks.try_acquire("blk-in-rt-2", 60 * S).unwrap().is_some());
    held.extend(60 * S).unwrap();
    held.release().unwrap();
}

#[test]
fn a_guard_dropped_inside_a_runtime_is_released_in_the_background() {
    let (a, b) = (memory(), memory());
    let g = a
        .locks()
        .unwrap()
        .try_acquire("blk-drop-in-rt", 60 * S)
        .unwrap()
        .unwrap();
    let g2 = a
        .locks()
        .unwrap()
        .try_acquire("blk-release-in-rt", 60 * S)
        .unwrap()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        drop(g);
        let e = g2.release().unwrap_err();
        assert!(is_runtime_refusal(&e), "{e}");
    });
    let other = b.locks().unwrap();
    for name in ["blk-drop-in-rt", "blk-release-in-rt"] {
        assert!(
            eventually(5 * S, || other.try_acquire(name, 60 * S).unwrap().is_some()),
            "{name} stayed held"
        );
    }
    // The client's last handle, dropped inside a runtime: its runtime
    // stops without waiting for its thread, and without a panic.
    rt.block_on(async move { drop(a) });
}

#[cfg(feature = "redis")]
#[test]
fn a_dropped_guard_on_redis_is_free_at_once_for_another_client() {
    let server = conformance::testkit::redis::RedisServer::start();
    let (a, b) = (
        connect(&server.url()).unwrap(),
        connect(&server.url()).unwrap(),
    );
    assert_eq!(a.capabilities().backend, "redis");
    let (la, lb) = (a.locks().unwrap(), b.locks().unwrap());
    let held = la.acquire("blk-redis", 60 * S, S).unwrap();
    assert!(lb.try_acquire("blk-redis", 60 * S).unwrap().is_none());
    drop(held);
    let g = lb.try_acquire("blk-redis", 60 * S).unwrap();
    let g = g.expect("the dropped guard still holds the lock on Redis");
    assert!(la.try_acquire("blk-redis", 60 * S).unwrap().is_none());
    g.release().unwrap();
    assert!(la.try_acquire("blk-redis", 60 * S).unwrap().is_some());
}
