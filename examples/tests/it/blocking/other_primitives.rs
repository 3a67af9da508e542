//! Barriers, rate limiters, semaphores, read-write locks and queues from
//! plain threads.

use std::thread;
use std::time::Duration;

use coord::{Acquired, Error, Lane, PermitOptions, PopOptions, PushOptions, Quota, RwMode};

use super::{S, memory};

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
