//! Guards dropped and kept: every kind of dropped guard frees its claim at
//! once for another client (also on Redis), the watchdog keeps a claim
//! alive while the thread sleeps, and without one the lost token fires at
//! the deadline.

use std::thread;
use std::time::Duration;

use coord::LockOptions;
use coord::blocking::*;

use super::{S, eventually, memory};

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
