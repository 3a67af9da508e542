//! A lock's own life: a grant is idempotent, exclusive and releasable, it
//! expires at its TTL without an extend and is not resurrected, and an
//! extend keeps the token and can change the TTL.

use std::time::Duration;

use coord_core::{Attempt, Lock, OwnerToken};
use tokio::time::{Instant, sleep};

use super::{backend, granted, ttl};

#[tokio::test]
async fn lock_grant_is_idempotent_exclusive_and_releasable() {
    let a = backend().await;
    let b = backend().await;
    let (o1, o2) = (OwnerToken::random(), OwnerToken::random());
    let name = "basic/with slash";
    let t1 = granted(a.try_acquire(name, o1.step(), ttl(&a)).await.unwrap());
    assert_eq!(
        granted(a.try_acquire(name, o1.step(), ttl(&a)).await.unwrap()),
        t1
    );
    assert!(matches!(
        b.try_acquire(name, o2.step(), ttl(&b)).await.unwrap(),
        Attempt::Held { .. }
    ));
    // A lock named like the queue's parent never collides.
    granted(b.try_acquire("basic", o2.step(), ttl(&b)).await.unwrap());
    assert!(!b.release(name, o2.step()).await.unwrap());
    assert!(a.extend(name, o1.step(), ttl(&a)).await.unwrap());
    assert!(a.release(name, o1.step()).await.unwrap());
    assert!(!a.release(name, o1.step()).await.unwrap());
    assert!(!a.extend(name, o1.step(), ttl(&a)).await.unwrap());
    let t2 = granted(b.try_acquire(name, o2.step(), ttl(&b)).await.unwrap());
    assert!(t2 > t1);
    assert!(b.force_release(name).await.unwrap());
    assert!(!b.extend(name, o2.step(), ttl(&b)).await.unwrap());
    assert!(!b.force_release(name).await.unwrap());
    assert!(b.release("basic", o2.step()).await.unwrap());
}

#[tokio::test]
async fn lock_expires_at_its_ttl_without_extend_and_is_not_resurrected() {
    let a = backend().await;
    let b = backend().await;
    let (o1, o2) = (OwnerToken::random(), OwnerToken::random());
    let name = "expiry";
    let t = ttl(&a);
    let start = Instant::now();
    granted(a.try_acquire(name, o1.step(), t).await.unwrap());
    // Still held just before the TTL ...
    sleep(t.saturating_sub(Duration::from_millis(300))).await;
    assert!(matches!(
        b.try_acquire(name, o2.step(), t).await.unwrap(),
        Attempt::Held { .. }
    ));
    // ... free soon after it: the server expires the claim's own lease
    // (etcd looks for expired leases every 500 ms).
    sleep((start + t).saturating_duration_since(Instant::now())).await;
    loop {
        if let Attempt::Granted(_) = b.try_acquire(name, o2.step(), t).await.unwrap() {
            break;
        }
        assert!(
            start.elapsed() < t + Duration::from_millis(1500),
            "still held {:?} after a grant with TTL {t:?}",
            start.elapsed()
        );
        sleep(Duration::from_millis(50)).await;
    }
    eprintln!("free {:?} after a grant with TTL {t:?}", start.elapsed());
    assert!(!a.extend(name, o1.step(), t).await.unwrap());
    assert!(!a.release(name, o1.step()).await.unwrap());
    assert!(b.release(name, o2.step()).await.unwrap());
}

#[tokio::test]
async fn extend_keeps_the_token_and_can_change_the_ttl() {
    let a = backend().await;
    let o = OwnerToken::random();
    let name = "extend";
    let t = ttl(&a);
    let tok = granted(a.try_acquire(name, o.step(), t).await.unwrap());
    assert!(a.extend(name, o.step(), t * 3).await.unwrap());
    sleep(t + Duration::from_millis(300)).await;
    // Extended to 3x: still ours, same token.
    assert_eq!(
        granted(a.try_acquire(name, o.step(), t * 3).await.unwrap()),
        tok
    );
    assert!(a.extend(name, o.step(), t).await.unwrap());
    assert!(a.release(name, o.step()).await.unwrap());
}
