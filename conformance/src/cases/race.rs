//! One owner's calls racing through one client (the raw traits, as a
//! caller that shares an owner token between tasks uses them): whatever
//! the calls answer, the store must agree with the last answer.

use std::time::Duration;

use coord_core::{Attempt, OwnerToken};
use tokio::time::sleep;

use crate::{Factory, spin, ttl, unique};

/// Rounds per case: each is a few round trips.
const ROUNDS: u64 = 100;

/// Through one client, owner O's extend (to the same TTL, or every other
/// round to another one) races O's release followed by O's re-acquire,
/// on a fresh name per round, the release started 0 to 750 µs after the
/// extend. Each round ends with O answered `Granted` by the re-acquire and
/// not released since, so whatever the extend answered, O still holds
/// the name once the client's background work settled: another owner is
/// refused, and O's release reports `true`. (Without running one call
/// per claim at a time, etcd's client lost such grants, and once handed
/// the name to another owner: `coord-etcd/tests/it/same_owner_one_client.rs`.)
pub async fn lock_same_owner_calls_racing_in_one_client_keep_the_grant(f: &Factory) {
    let (c, other_client) = (f.client().await, f.client().await);
    let raw = c.raw_lock().unwrap();
    let other_raw = other_client.raw_lock().unwrap();
    let (t, t2) = (
        ttl(&c, Duration::from_secs(30)),
        ttl(&c, Duration::from_secs(45)),
    );
    let base = unique("same-owner-race");
    let mut held = Vec::new();
    for i in 0..ROUNDS {
        let name = format!("{base}-{i}");
        let o = OwnerToken::random();
        let a = raw.try_acquire(&name, o.step(), t).await.unwrap();
        assert!(matches!(a, Attempt::Granted(_)), "round {i}: {a:?}");
        let ext = {
            let (raw, name) = (raw.clone(), name.clone());
            let et = if i % 2 == 0 { t } else { t2 };
            tokio::spawn(async move { raw.extend(&name, o.step(), et).await })
        };
        tokio::task::yield_now().await;
        spin(Duration::from_micros((i / 2 % 16) * 50));
        assert!(
            raw.release(&name, o.step()).await.unwrap(),
            "round {i}: the release of a live claim reported false"
        );
        let again = raw.try_acquire(&name, o.step(), t).await.unwrap();
        assert!(
            matches!(again, Attempt::Granted(_)),
            "round {i}: the released name was refused to its last owner: {again:?}"
        );
        ext.await.unwrap().unwrap();
        held.push((name, o));
    }
    // Whatever a client still does in the background (etcd revokes
    // leases after the call) has landed.
    sleep(Duration::from_secs(2)).await;
    let intruder = OwnerToken::random();
    for (name, o) in &held {
        let a = other_raw
            .try_acquire(name, intruder.step(), t)
            .await
            .unwrap();
        assert!(
            matches!(a, Attempt::Held { .. }),
            "{name}: granted to another owner while its owner holds it \
             (answered Granted, never released): {a:?}"
        );
        assert!(
            raw.release(name, o.step()).await.unwrap(),
            "{name}: the grant answered to its owner was gone"
        );
    }
}

/// Through one client, two attempts of owner O on a semaphore with room
/// for both (1 permit of 4 each, or 1 and 2 in odd rounds),
/// the second started 0 to 750 µs after the first, on a fresh name per
/// round. The trait's rule for an owner asking again ("the attempt
/// succeeds again with the same token") makes them one grant: both are
/// answered `Granted` with one token, and once the client's background
/// work settled the store shows O once, with that token, and nobody
/// else; O's release reports `true` and leaves nothing. (Without running
/// one call per semaphore owner at a time, etcd's client made two grants
/// of O, with two tokens and their permits added, then revoked one of
/// them: `coord-etcd/tests/it/semaphore_same_owner_one_client/`.)
pub async fn semaphore_same_owner_attempts_racing_in_one_client_make_one_grant(f: &Factory) {
    let (c, other_client) = (f.client().await, f.client().await);
    let (raw, other_raw) = match (c.raw_semaphore(), other_client.raw_semaphore()) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e @ coord_core::Error::Unsupported { .. }), _) => {
            eprintln!("skipped: {}: {e}", crate::cases::SEMAPHORE_GATE);
            return;
        }
        (a, b) => panic!("raw_semaphore(): {:?} / {:?}", a.err(), b.err()),
    };
    let t = ttl(&c, Duration::from_secs(30));
    let base = unique("sem-same-owner-race");
    let mut held = Vec::new();
    for i in 0..ROUNDS / 2 {
        let name = format!("{base}-{i}");
        let o = OwnerToken::random();
        let req = |permits| coord_core::PermitRequest {
            permits,
            total: 4,
            ttl: t,
            queue: false,
        };
        let (r1, r2) = (req(1), req(if i % 2 == 0 { 1 } else { 2 }));
        let first = {
            let (raw, name) = (raw.clone(), name.clone());
            tokio::spawn(async move { raw.try_acquire(&name, o.step(), &r1).await })
        };
        tokio::task::yield_now().await;
        spin(Duration::from_micros(i % 16 * 50));
        let second = raw.try_acquire(&name, o.step(), &r2).await.unwrap();
        let first = first.await.unwrap().unwrap();
        let (Attempt::Granted(a), Attempt::Granted(b)) = (first, second) else {
            panic!("round {i}: an owner's attempts with room for both: {first:?}, {second:?}");
        };
        assert_eq!(
            a, b,
            "round {i}: one owner's two attempts were answered two tokens (two grants)"
        );
        held.push((name, o, a));
    }
    // Whatever a client still does in the background (etcd revokes
    // leases after the call) has landed.
    sleep(Duration::from_secs(2)).await;
    for (name, o, token) in &held {
        let seen = other_raw.inspect(name).await.unwrap();
        assert!(
            seen.holders.len() == 1
                && seen.holders[0].owner == *o
                && seen.holders[0].token == *token,
            "{name}: one owner answered Granted({token:?}) twice, the store shows {:?}",
            seen.holders
        );
        assert!(
            raw.release(name, o.step()).await.unwrap(),
            "{name}: the grant answered to its owner was gone"
        );
        let after = other_raw.inspect(name).await.unwrap();
        assert!(
            after.holders.is_empty(),
            "{name}: the owner's release left {:?}",
            after.holders
        );
    }
}
