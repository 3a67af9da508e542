//! One owner's calls racing through one client (the raw traits, as a
//! caller that shares an owner token between tasks uses them): whatever
//! the calls answer, the store must agree with the last answer.

use std::time::Duration;

use coord_core::{Attempt, OwnerToken};
use tokio::time::{Instant, sleep};

use crate::{Factory, spin, ttl, unique};

/// Rounds per case: each is a few round trips.
const ROUNDS: u64 = 100;

/// The grants' TTL: a round takes milliseconds, so the grants outlive
/// the case by far, even on a stalled machine.
const HOLD: Duration = Duration::from_secs(120);

/// Room left for a check's own calls before its grant's TTL.
const CHECK_ROOM: Duration = Duration::from_secs(10);

/// Whether a grant asked for at `since` with TTL `t` surely still lives
/// through a check begun now. A grant past that may have ended by itself,
/// as it should: its check then judges only what an expiry cannot
/// explain, and the case counts it as not judged.
fn surely_live(since: Instant, t: Duration) -> bool {
    since.elapsed() + CHECK_ROOM < t
}

/// The check of a case must have judged some of its rounds.
fn assert_judged(judged: usize, rounds: usize) {
    assert!(
        judged > 0,
        "none of {rounds} rounds was checked within its grant's TTL ({HOLD:?}): \
         the machine is too slow for this case"
    );
}

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
    let (t, t2) = (ttl(&c, HOLD), ttl(&c, HOLD + HOLD / 2));
    let base = unique("same-owner-race");
    let mut held = Vec::new();
    for i in 0..ROUNDS {
        let name = format!("{base}-{i}");
        let o = OwnerToken::random();
        let since = Instant::now();
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
        held.push((name, o, since));
    }
    // Whatever a client still does in the background (etcd revokes
    // leases after the call) has landed.
    sleep(Duration::from_secs(2)).await;
    let intruder = OwnerToken::random();
    let mut judged = 0;
    for (name, o, since) in &held {
        let live = surely_live(*since, t);
        let a = other_raw
            .try_acquire(name, intruder.step(), t)
            .await
            .unwrap();
        if !live {
            // Past its TTL: whoever holds it now, release what is there.
            if matches!(a, Attempt::Granted(_)) {
                other_raw.release(name, intruder.step()).await.unwrap();
            }
            raw.release(name, o.step()).await.unwrap();
            continue;
        }
        assert!(
            matches!(a, Attempt::Held { .. }),
            "{name}: granted to another owner while its owner holds it \
             (answered Granted {:?} ago with TTL {t:?}, never released): {a:?}",
            since.elapsed()
        );
        assert!(
            raw.release(name, o.step()).await.unwrap(),
            "{name}: the grant answered to its owner {:?} ago with TTL {t:?} was gone",
            since.elapsed()
        );
        judged += 1;
    }
    assert_judged(judged, held.len());
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
    let t = ttl(&c, HOLD);
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
        let since = Instant::now();
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
        held.push((name, o, a, since));
    }
    // Whatever a client still does in the background (etcd revokes
    // leases after the call) has landed.
    sleep(Duration::from_secs(2)).await;
    let mut judged = 0;
    for (name, o, token, since) in &held {
        let live = surely_live(*since, t);
        let seen = other_raw.inspect(name).await.unwrap();
        let age = since.elapsed();
        let ok = if live {
            seen.holders.len() == 1
        } else {
            // Past its TTL it may be gone, but never two grants of O, nor
            // another token.
            seen.holders.len() <= 1
        };
        assert!(
            ok && seen
                .holders
                .iter()
                .all(|h| h.owner == *o && h.token == *token),
            "{name}: one owner answered Granted({token:?}) twice ({age:?} ago, TTL {t:?}), \
             the store shows {:?}",
            seen.holders
        );
        let released = raw.release(name, o.step()).await.unwrap();
        assert!(
            released || !live,
            "{name}: the grant answered to its owner {age:?} ago with TTL {t:?} was gone"
        );
        judged += usize::from(live);
        let after = other_raw.inspect(name).await.unwrap();
        assert!(
            after.holders.is_empty(),
            "{name}: the owner's release left {:?}",
            after.holders
        );
    }
    assert_judged(judged, held.len());
}
