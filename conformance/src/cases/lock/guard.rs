//! Lock cases of a held guard: released on drop, kept by its watchdog, its lost signal.

use super::LONG;
use crate::{Factory, expiry_slack, ttl, unique};
use coord_core::{Error, FencingToken, LockOptions, WithLockError};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::time::{Instant, sleep, timeout};

/// A dropped guard is released (in the background) long before its TTL.
pub async fn lock_dropped_guard_is_released_before_ttl(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let name = unique("drop");
    let g = a
        .locks()
        .unwrap()
        .acquire(&name, Duration::from_secs(60), Duration::ZERO)
        .await
        .unwrap();
    drop(g);
    let g2 = b
        .locks()
        .unwrap()
        .acquire(&name, LONG, Duration::from_secs(5))
        .await
        .expect("a dropped guard must be released before its 60 s TTL");
    g2.release().await.unwrap();
}

/// The watchdog keeps a lock for three times its TTL and stops at release.
pub async fn lock_watchdog_keeps_lock_and_stops_at_release(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let name = unique("watchdog");
    // Renewing every third of a 2 s TTL leaves the watchdog over a second
    // for each renewal on a loaded machine (a 1 s TTL left it 600 ms).
    let t = ttl(&a, Duration::from_secs(2));
    // Connected before the release, so its connect is not timed below.
    let c = f.client().await;
    let g = a
        .locks()
        .unwrap()
        .acquire_with(&name, LockOptions::new(t).watchdog(true))
        .await
        .unwrap();
    let token = g.fencing_token();
    sleep(t * 3 + t / 2).await;
    assert!(g.is_valid(), "watchdog let the guard lapse");
    assert!(
        b.locks()
            .unwrap()
            .try_acquire(&name, LONG)
            .await
            .unwrap()
            .is_none(),
        "watchdog did not keep the lock"
    );
    assert_eq!(g.fencing_token(), token);
    g.release().await.unwrap();
    let g2 = b
        .locks()
        .unwrap()
        .try_acquire(&name, t)
        .await
        .unwrap()
        .expect("released lock must be free");
    // The released guard's watchdog must not touch the new holder's lock:
    // it lapses at its own TTL, which runs from before g2's reply (etcd
    // frees it up to `expiry_slack` later).
    let start = Instant::now();
    let slack = expiry_slack(&a);
    let g3 = c
        .locks()
        .unwrap()
        .acquire(&name, LONG, t * 3 + Duration::from_secs(3))
        .await
        .expect("lock kept alive after release");
    assert!(
        start.elapsed() <= t + slack + Duration::from_secs(2),
        "the new holder's lock lasted {:?} (TTL {t:?}, expiry slack {slack:?})",
        start.elapsed()
    );
    drop(g2);
    g3.release().await.unwrap();
}

/// Ownership removed behind a guard's back fires the lost signal, and
/// `with_lock` stops the closure.
pub async fn lock_lost_signal_fires_and_with_lock_stops(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let t = ttl(&a, Duration::from_secs(1));
    // A guard with a watchdog.
    let name = unique("lost");
    let g = a
        .locks()
        .unwrap()
        .acquire_with(&name, LockOptions::new(t).watchdog(true))
        .await
        .unwrap();
    let token = g.lost_token();
    assert!(
        b.locks().unwrap().force_release(&name).await.unwrap(),
        "force_release found nothing to remove"
    );
    timeout(t + Duration::from_secs(3), g.lost())
        .await
        .expect("lost signal did not fire");
    assert!(token.is_cancelled(), "lost token not cancelled");
    assert!(!g.is_valid());
    drop(g);

    // with_lock stops the critical section.
    let name = unique("with-lock");
    let stopped = Arc::new(AtomicBool::new(true));
    let started = Arc::new(tokio::sync::Notify::new());
    let (s2, st2) = (stopped.clone(), started.clone());
    let locks = a.locks().unwrap();
    let n2 = name.clone();
    let run = tokio::spawn(async move {
        locks
            .with_lock(&n2, LockOptions::new(t), |held| async move {
                assert!(held.fencing_token() > FencingToken(0));
                st2.notify_one();
                sleep(Duration::from_secs(60)).await;
                s2.store(false, Ordering::SeqCst); // reached only if not stopped
            })
            .await
    });
    timeout(Duration::from_secs(5), started.notified())
        .await
        .expect("with_lock never ran the closure");
    assert!(b.locks().unwrap().force_release(&name).await.unwrap());
    let r = timeout(t + Duration::from_secs(5), run)
        .await
        .expect("with_lock did not stop the closure")
        .unwrap();
    assert!(
        matches!(r, Err(WithLockError::Lock(Error::Lost { .. }))),
        "with_lock returned {r:?}"
    );
    assert!(stopped.load(Ordering::SeqCst));

    // And a with_lock that finishes returns the closure's value.
    let v = a
        .locks()
        .unwrap()
        .with_lock(&unique("with-lock-ok"), LockOptions::new(t), |_| async {
            42
        })
        .await
        .unwrap();
    assert_eq!(v, 42);
}
