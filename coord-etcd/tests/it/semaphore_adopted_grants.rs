//! Semaphore grant and place keys named by their lease
//! (`<prefix>sem/<name>/h/<lease hex>` and `w/<lease hex>`, the owner
//! first in the value, keys reused through the spare pool).
//!
//! Each test drives a real etcd (the binary's shared server, a prefix of
//! its own per test) and checks the contract (docs/guarantees.md):
//! never more permits granted than the total (read from etcd and from the
//! clients' view), FIFO for the head of the queue, tokens rising per name,
//! release and extend acting only for the owner that holds, cancelled and
//! timed-out waits leaving nothing, read-write exclusion.

//!
//! This file: one owner token through two clients of the raw trait, so
//! that one client adopts the grant or place the other wrote (on the
//! other's lease). See `semaphore_keys_by_lease.rs`.

use std::time::Duration;

use coord_core::{Attempt, OwnerToken};
use tokio::time::{Instant, sleep, timeout};

use crate::semaphore_support;
use semaphore_support::*;

/// One owner token used through two clients (a retry through another
/// client finds the grant and adopts it, as the trait allows): client A
/// adopts B's grant and releases it; A's next grant for another owner may
/// then be written on B's old lease, under B's old key. B's stale release
/// (and extend) of the first owner must report not held and leave the
/// new owner's grant and slots exactly as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopted_grant_released_elsewhere_then_stale_release_by_first_client() {
    let p = unique("adopt");
    let (ca, cb) = (coord(&p).await, coord(&p).await);
    let (a, b) = (raw(&ca), raw(&cb));
    let n = "d";
    let (o1, o2, o3) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let t1 = granted(b.try_acquire(n, o1.step(), &req(2, 4, LONG, false)).await);
    let k1 = state(&p, n).await.0[0].clone();
    // A retry through A: the same grant.
    let t1a = granted(a.try_acquire(n, o1.step(), &req(2, 4, LONG, false)).await);
    assert_eq!(t1, t1a, "a retry of the same owner got another token");
    assert!(a.release(n, o1.step()).await.unwrap());
    // A's next grants (o2 for 2, o3 for 2): all 4 permits.
    granted(a.try_acquire(n, o2.step(), &req(2, 4, LONG, false)).await);
    granted(a.try_acquire(n, o3.step(), &req(2, 4, LONG, false)).await);
    let before = state(&p, n).await;
    let reused = before.0.iter().any(|r| r.key == k1.key);
    // B still believes o1 holds: its release and extend must find nothing.
    let ext = b.extend(n, o1.step(), LONG).await.unwrap();
    let rel = b.release(n, o1.step()).await.unwrap();
    let after = state(&p, n).await;
    assert!(
        !rel && !ext && after == before,
        "stale release {rel} / extend {ext} through B (B's old key reused by A: {reused}); \
         before {before:#?}, after {after:#?}"
    );
    // Nothing over-granted: 4 permits are held, a 1-permit request is refused.
    held(
        b.try_acquire(n, OwnerToken::random().step(), &req(1, 4, LONG, false))
            .await,
        "over-granted",
    );
    assert!(a.release(n, o2.step()).await.unwrap());
    assert!(a.release(n, o3.step()).await.unwrap());
}

/// The mirror image: A adopts B's grant by a retry of the same owner, B
/// releases it (B's lease goes back to B's spares) and B grants the next
/// owner on it, under the same key; A's stale release of the first owner
/// must leave that grant alone; otherwise the next owner's permits are
/// free in etcd while its holder still believes it holds them, and a
/// third client is granted them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopted_grant_stale_release_deletes_next_owner_of_other_client() {
    let p = unique("adopt2");
    let (ca, cb, cc) = (coord(&p).await, coord(&p).await, coord(&p).await);
    let (a, b, c) = (raw(&ca), raw(&cb), raw(&cc));
    let n = "e";
    let (o1, o2, o3) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let t1 = granted(b.try_acquire(n, o1.step(), &req(3, 4, LONG, false)).await);
    let k1 = state(&p, n).await.0[0].key.clone();
    assert_eq!(
        granted(a.try_acquire(n, o1.step(), &req(3, 4, LONG, false)).await),
        t1
    );
    assert!(b.release(n, o1.step()).await.unwrap());
    let t2 = granted(b.try_acquire(n, o2.step(), &req(3, 4, LONG, false)).await);
    assert!(t2 > t1);
    let before = state(&p, n).await;
    let reused = before.0[0].key == k1;
    let rel = a.release(n, o1.step()).await.unwrap();
    let ext = a.extend(n, o1.step(), LONG).await.unwrap();
    // o2 still holds 3 of 4: a third client may not take 2.
    let third = c.try_acquire(n, o3.step(), &req(2, 4, LONG, false)).await;
    let after = state(&p, n).await;
    assert!(
        !rel && !ext && matches!(third, Ok(Attempt::Held { .. })) && after == before,
        "A's stale release {rel} / extend {ext} of o1 (B's key reused for o2: {reused}); \
         a third client asking 2 while o2 holds 3 of 4: {third:?}; \
         before {before:#?}, after {after:#?}"
    );
    assert!(
        b.extend(n, o2.step(), LONG).await.unwrap(),
        "o2 lost its grant"
    );
    assert!(b.release(n, o2.step()).await.unwrap());
}

/// The same owner's place through two clients: o1 queues through B, its
/// retry through A keeps that place (and its lease) and is granted there,
/// and A's next waiter may queue on that lease, under B's old place key.
/// A release of o1 through B (o1 holds: it must say so) must leave the
/// other owner's place in line alone. (An attempt right after a release
/// may be answered "again soon"; it is sent again, as the core's loop
/// does.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopted_place_release_through_first_client_keeps_other_waiter() {
    let p = unique("aplace");
    let (ca, cb, cc) = (coord(&p).await, coord(&p).await, coord(&p).await);
    let (a, b, c) = (raw(&ca), raw(&cb), raw(&cc));
    let n = "pl";
    let (h, h2, o1, o2) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    granted(c.try_acquire(n, h.step(), &req(2, 2, LONG, false)).await);
    held(
        b.try_acquire(n, o1.step(), &req(1, 2, LONG, true)).await,
        "o1 via B",
    );
    let w1 = state(&p, n).await.1[0].key.clone();
    held(
        a.try_acquire(n, o1.step(), &req(1, 2, LONG, true)).await,
        "o1 via A",
    );
    assert!(c.release(n, h.step()).await.unwrap());
    let (waiting, plain) = (req(1, 2, LONG, true), req(1, 2, LONG, false));
    granted_soon(|| a.try_acquire(n, o1.step(), &waiting)).await;
    granted_soon(|| c.try_acquire(n, h2.step(), &plain)).await;
    held(
        a.try_acquire(n, o2.step(), &req(1, 2, LONG, true)).await,
        "o2 via A",
    );
    let (_, ws, _) = state(&p, n).await;
    assert_eq!(ws.len(), 1, "{ws:#?}");
    assert_eq!(ws[0].owner, o2.to_hex());
    let reused = ws[0].key == w1;
    assert!(
        b.release(n, o1.step()).await.unwrap(),
        "o1 held, B said not"
    );
    let (_, ws2, _) = state(&p, n).await;
    assert_eq!(
        ws2, ws,
        "releasing o1 through B removed o2's place (B's old place key reused for o2: {reused})"
    );
    assert!(c.release(n, h2.step()).await.unwrap());
    granted_soon(|| a.try_acquire(n, o2.step(), &waiting)).await;
    assert!(a.release(n, o2.step()).await.unwrap());
}

/// A adopts B's grant of o1 and keeps its record; B releases o1 (its lease
/// back to B's spares) and grants o2 on that lease, under the same key.
/// A's stale extend of o1 (the same TTL: a keepalive of the lease would
/// find a key on it; another TTL: a move) and release must report not
/// held, leave o2's grant as it is and not end its lease: o2 still holds
/// 3 of 4 a second later, extends, and a third client gets no 2 permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopter_stale_extend_keeps_the_creators_next_grant() {
    let p = unique("adopt3");
    let (ca, cb, cc) = (coord(&p).await, coord(&p).await, coord(&p).await);
    let (a, b, c) = (raw(&ca), raw(&cb), raw(&cc));
    let n = "x";
    let (o1, o2, o3) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let t1 = granted(b.try_acquire(n, o1.step(), &req(3, 4, LONG, false)).await);
    let k1 = state(&p, n).await.0[0].clone();
    assert_eq!(
        granted(a.try_acquire(n, o1.step(), &req(3, 4, LONG, false)).await),
        t1
    );
    assert!(b.release(n, o1.step()).await.unwrap());
    let t2 = granted(b.try_acquire(n, o2.step(), &req(3, 4, LONG, false)).await);
    assert!(t2 > t1);
    // A's retry moved the adopted grant onto A's own lease (the adopted
    // lease's TTL is unknown), so B's lease went with the moved grant's
    // release and o2 is on another lease. Were the grant left on B's
    // lease, B's next grant would reuse B's spare and key here. A's stale
    // calls must leave o2 alone either way.
    let before = state(&p, n).await;
    let _ = &k1;
    assert!(
        !a.extend(n, o1.step(), LONG).await.unwrap(),
        "stale extend, same TTL"
    );
    assert!(
        !a.extend(n, o1.step(), Duration::from_secs(45))
            .await
            .unwrap()
    );
    assert!(!a.release(n, o1.step()).await.unwrap(), "stale release");
    sleep(Duration::from_secs(1)).await;
    assert_eq!(state(&p, n).await, before, "o2's grant changed");
    assert!(
        b.extend(n, o2.step(), LONG).await.unwrap(),
        "o2 lost its grant"
    );
    held(
        c.try_acquire(n, o3.step(), &req(2, 4, LONG, false)).await,
        "a third client while o2 holds 3 of 4",
    );
    assert!(b.release(n, o2.step()).await.unwrap());
    let (h, w, s) = state(&p, n).await;
    assert!(h.is_empty() && w.is_empty() && s == 0);
}

/// A adopts B's grant of o1; B releases it and its lease goes back to B's
/// spares while A still has its record of o1. A's next grant of o1 is a
/// new one and must go under a key of A's own: were it B's old key (named
/// by B's spare), B's next grant on that spare would find its key taken
/// and could never be made while o1 holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopter_regrant_leaves_the_creators_key_free() {
    let p = unique("adopt4");
    let (ca, cb) = (coord(&p).await, coord(&p).await);
    let (a, b) = (raw(&ca), raw(&cb));
    let n = "y";
    let (o1, o2) = (OwnerToken::random(), OwnerToken::random());
    let t1 = granted(b.try_acquire(n, o1.step(), &req(1, 4, LONG, false)).await);
    let k1 = state(&p, n).await.0[0].clone();
    assert_eq!(
        granted(a.try_acquire(n, o1.step(), &req(1, 4, LONG, false)).await),
        t1
    );
    assert!(b.release(n, o1.step()).await.unwrap());
    let t1b = granted(a.try_acquire(n, o1.step(), &req(1, 4, LONG, false)).await);
    assert!(t1b > t1);
    let mine = state(&p, n).await.0;
    assert_eq!(mine.len(), 1, "{mine:#?}");
    assert_ne!(mine[0].key, k1.key, "A wrote o1's new grant under B's key");
    let start = Instant::now();
    let t2 = timeout(
        Duration::from_secs(10),
        b.try_acquire(n, o2.step(), &req(1, 4, LONG, false)),
    )
    .await
    .expect("B's grant on its spare hung");
    let t2 = granted(t2);
    // A grant finding its spare's key taken could never be made while o1
    // holds: it hangs. The bound and the timeout, scaled together, tell
    // that from one call on a loaded machine.
    let took = start.elapsed();
    assert!(t2 > t1b && took < Duration::from_secs(5), "{took:?}");
    let (h, _, s) = state(&p, n).await;
    assert_eq!((h.len(), s), (2, 2), "{h:#?}");
    assert!(a.release(n, o1.step()).await.unwrap());
    assert!(b.release(n, o2.step()).await.unwrap());
    let (h, w, s) = state(&p, n).await;
    assert!(h.is_empty() && w.is_empty() && s == 0);
}

/// A adopts B's grant of o1 and extends it (moving it to a lease of A's:
/// the key and token stay); B's extend still finds it (on A's lease), and
/// B, which wrote it, releases o1: the grant goes (it is o1's, at its
/// token) and A's stale release says not held.
/// Both clients' next grants work, tokens rise, and the name empties.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopted_grant_extended_then_released_by_its_writer() {
    let p = unique("adopt5");
    let (ca, cb) = (coord(&p).await, coord(&p).await);
    let (a, b) = (raw(&ca), raw(&cb));
    let n = "z";
    let o1 = OwnerToken::random();
    let t1 = granted(b.try_acquire(n, o1.step(), &req(2, 4, LONG, false)).await);
    let k1 = state(&p, n).await.0[0].clone();
    assert_eq!(
        granted(a.try_acquire(n, o1.step(), &req(2, 4, LONG, false)).await),
        t1
    );
    assert!(a.extend(n, o1.step(), LONG).await.unwrap());
    let k2 = state(&p, n).await.0[0].clone();
    assert_eq!((k2.key.as_str(), k2.create), (k1.key.as_str(), k1.create));
    assert_ne!(k2.lease, k1.lease, "A's extend left the grant on B's lease");
    // B's extend (its TTL) finds the grant on A's lease: still o1's.
    assert!(
        b.extend(n, o1.step(), LONG).await.unwrap(),
        "o1 held, B said not"
    );
    let k3 = state(&p, n).await.0[0].clone();
    assert_eq!((k3.key.as_str(), k3.create), (k1.key.as_str(), k1.create));
    assert!(
        b.release(n, o1.step()).await.unwrap(),
        "o1 held, its writer said not"
    );
    assert!(!a.release(n, o1.step()).await.unwrap(), "stale release");
    assert!(!a.extend(n, o1.step(), LONG).await.unwrap(), "stale extend");
    let mut last = t1;
    for _ in 0..3 {
        for s in [&a, &b] {
            let o = OwnerToken::random();
            let t = granted(s.try_acquire(n, o.step(), &req(2, 4, LONG, false)).await);
            assert!(t > last);
            last = t;
            assert!(s.release(n, o.step()).await.unwrap());
        }
    }
    let (h, w, s) = state(&p, n).await;
    assert!(h.is_empty() && w.is_empty() && s == 0);
}

/// o1 queues through B; its retry through A keeps that place (adopted);
/// o1 then gives up through A (a release of a waiter: not held). A's next
/// waiter o3 queues under a key of A's own lease, and a stale release of
/// o1 through B leaves o3's place alone; o3 is granted once the holder
/// releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopted_place_given_up_then_stale_release_by_its_writer() {
    let p = unique("aplace2");
    let (ca, cb, cc) = (coord(&p).await, coord(&p).await, coord(&p).await);
    let (a, b, c) = (raw(&ca), raw(&cb), raw(&cc));
    let n = "q";
    let (h, o1, o3) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    granted(c.try_acquire(n, h.step(), &req(2, 2, LONG, false)).await);
    held(
        b.try_acquire(n, o1.step(), &req(1, 2, LONG, true)).await,
        "o1 via B",
    );
    let w1 = state(&p, n).await.1[0].clone();
    held(
        a.try_acquire(n, o1.step(), &req(1, 2, LONG, true)).await,
        "o1 via A",
    );
    assert_eq!(state(&p, n).await.1, vec![w1.clone()], "A kept B's place");
    assert!(!a.release(n, o1.step()).await.unwrap(), "o1 only waited");
    assert!(state(&p, n).await.1.is_empty(), "o1's place is left");
    held(
        a.try_acquire(n, o3.step(), &req(1, 2, LONG, true)).await,
        "o3 via A",
    );
    let ws = state(&p, n).await.1;
    assert_eq!(ws.len(), 1, "{ws:#?}");
    assert_eq!(ws[0].owner, o3.to_hex());
    assert_ne!(ws[0].lease, w1.lease, "A queued o3 on B's lease");
    assert!(!b.release(n, o1.step()).await.unwrap(), "o1 held nothing");
    sleep(Duration::from_secs(1)).await;
    assert_eq!(state(&p, n).await.1, ws, "o3's place changed");
    assert!(c.release(n, h.step()).await.unwrap());
    granted(a.try_acquire(n, o3.step(), &req(1, 2, LONG, true)).await);
    assert!(a.release(n, o3.step()).await.unwrap());
    let (h, w, s) = state(&p, n).await;
    assert!(h.is_empty() && w.is_empty() && s == 0);
}
