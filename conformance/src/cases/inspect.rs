//! Holder metadata and inspection: a grant carries a small JSON value,
//! stored with it; `inspect` shows every live holder (fingerprint, fencing
//! token, remaining time, metadata, permits) to any client.
//!
//! A store without inspection (yet) skips these cases with the reason
//! [`INSPECT_GATE`] on stderr, never a silent pass.

use std::time::Duration;

use coord_core::{Acquired, ClaimInfo, Coord, Error, LockOptions, PermitOptions, Result};
use serde_json::json;

use crate::{Factory, unique};

const LONG: Duration = Duration::from_secs(30);

/// Why every inspection case skips on a store without it.
pub const INSPECT_GATE: &str =
    "the store does not offer holder metadata and inspect (its error says why)";

/// `Some(info)`, or `None` (the reason on stderr) when the store does not
/// inspect yet. Any other error fails the case.
fn gated<T>(r: Result<T>) -> Option<T> {
    match r {
        Ok(i) => Some(i),
        Err(e @ Error::Unsupported { .. }) => {
            eprintln!("skipped: {INSPECT_GATE}: {e}");
            None
        }
        Err(e) => panic!("inspect: expected information or Unsupported, got {e:?}"),
    }
}

fn metadata_field<T: std::fmt::Debug>(r: Result<T>, what: &str) {
    match r {
        Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, "metadata", "{what}"),
        other => panic!("{what}: expected InvalidArgument {{ metadata }}, got {other:?}"),
    }
}

/// A lock taken with metadata: another client's `inspect` shows exactly one
/// holder with the guard's owner id, fencing token, metadata and a
/// remaining time within the TTL; a lock taken without metadata shows none;
/// a free or released lock shows no holder.
pub async fn inspect_lock_shows_the_holder_and_its_metadata(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let (la, lb) = (a.locks().unwrap(), b.locks().unwrap());
    let name = unique("inspect-lock");
    let Some(free) = gated(lb.inspect(&name).await) else {
        return;
    };
    assert!(
        free.holders.is_empty(),
        "a free lock has a holder: {free:?}"
    );
    let who = json!({"host": "web-3", "pid": 4242, "why": "nightly report", "é": [1, 2.5, null]});
    let guard = la
        .acquire_with_metadata(&name, LockOptions::new(LONG), &who)
        .await
        .unwrap();
    let info = lb.inspect(&name).await.unwrap();
    assert_eq!(info.holders.len(), 1, "{info:?}");
    let h = &info.holders[0];
    assert_eq!(h.owner_id, guard.owner_id());
    assert_eq!(h.fencing_token, guard.fencing_token());
    assert_eq!(h.metadata.as_ref(), Some(&who));
    assert_eq!(h.permits, 1);
    if let Some(r) = h.remaining {
        assert!(
            r <= LONG && r > LONG / 2,
            "remaining {r:?} of a {LONG:?} lock"
        );
    }
    guard.release().await.unwrap();
    assert!(
        lb.inspect(&name).await.unwrap().holders.is_empty(),
        "released, still shown"
    );

    let plain = la.acquire(&name, LONG, Duration::ZERO).await.unwrap();
    let info = lb.inspect(&name).await.unwrap();
    assert_eq!(info.holders.len(), 1);
    assert_eq!(
        info.holders[0].metadata, None,
        "metadata of an earlier grant was kept"
    );
    assert_eq!(info.holders[0].fencing_token, plain.fencing_token());
    plain.release().await.unwrap();
}

/// Two grants of a semaphore, with metadata: `inspect` lists both with
/// their permits, tokens and metadata; after one is released, one is left.
pub async fn inspect_semaphore_lists_each_grant(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let (Ok(sa), Ok(sb)) = (a.semaphores(), b.semaphores()) else {
        eprintln!("skipped: no semaphores on this store");
        return;
    };
    let name = unique("inspect-sem");
    let Some(free) = gated(sb.inspect(&name).await) else {
        return;
    };
    assert!(free.holders.is_empty(), "{free:?}");
    let p1 = sa
        .acquire_with_metadata(
            &name,
            PermitOptions::new(5, LONG).permits(2),
            &json!({"n": 1}),
        )
        .await
        .unwrap();
    let p2 = sb
        .acquire_with_metadata(&name, PermitOptions::new(5, LONG), &json!("second"))
        .await
        .unwrap();
    let mut info = sa.inspect(&name).await.unwrap();
    info.holders.sort_by_key(|h| h.fencing_token);
    assert_eq!(info.holders.len(), 2, "{info:?}");
    assert_eq!(
        (info.holders[0].permits, &info.holders[0].owner_id),
        (2, &p1.owner_id())
    );
    assert_eq!(info.holders[0].metadata, Some(json!({"n": 1})));
    assert_eq!(
        (info.holders[1].permits, info.holders[1].fencing_token),
        (1, p2.fencing_token())
    );
    assert_eq!(info.holders[1].metadata, Some(json!("second")));
    p1.release().await.unwrap();
    let info = sb.inspect(&name).await.unwrap();
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].owner_id, p2.owner_id());
    p2.release().await.unwrap();
}

/// A lease with metadata is shown by `inspect` while live, and not after
/// it was revoked.
pub async fn inspect_lease_shows_the_holder(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let (la, lb) = (a.leases().unwrap(), b.leases().unwrap());
    let name = unique("inspect-lease");
    let Some(_) = gated(lb.inspect(&name).await) else {
        return;
    };
    let me = json!({"worker": 7, "version": "1.4.2"});
    let lease = la
        .grant_with_metadata(&name, LONG, &me)
        .await
        .unwrap()
        .expect("a free lease");
    let info = lb.inspect(&name).await.unwrap();
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert_eq!(info.holders[0].metadata.as_ref(), Some(&me));
    assert_eq!(info.holders[0].owner_id, lease.owner_id());
    assert_eq!(info.holders[0].fencing_token, lease.fencing_token());
    lease.revoke().await.unwrap();
    assert!(lb.inspect(&name).await.unwrap().holders.is_empty());
}

/// An election's leader as another client's `inspect` shows it: the
/// candidate, the term, the leadership's owner id (never its owner token)
/// and a remaining time within the TTL where the store can tell; renewing
/// moves the remaining time but not the term; a vacant office (never held,
/// or resigned) shows no leader. `leader()` agrees.
pub async fn inspect_election_shows_the_leader_and_its_grant(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let Some(ea) = crate::cases::offered(a.elections()) else {
        return;
    };
    let eb = b.elections().unwrap();
    let name = unique("inspect-elect");
    let Some(vacant) = gated(eb.inspect(&name).await) else {
        return;
    };
    assert_eq!(vacant, None, "a never-held election has a leader");
    let ttl = Duration::from_secs(20);
    let leadership = ea.campaign(&name, "node-a", ttl, LONG).await.unwrap();
    let l = eb.inspect(&name).await.unwrap().expect("a leader");
    assert_eq!(l.candidate, "node-a");
    assert_eq!(l.term, leadership.term());
    assert_eq!(l.owner_id, leadership.owner_id());
    assert_eq!(l.owner_id.len(), 16, "{l:?}");
    if let Some(r) = l.remaining {
        assert!(
            r <= ttl && r > ttl / 2,
            "remaining {r:?} of a {ttl:?} leadership"
        );
    }
    let seen = eb.leader(&name).await.unwrap().expect("a leader");
    assert_eq!((seen.candidate.as_str(), seen.term), ("node-a", l.term));

    // A renewal to a longer TTL: the same term and owner, more time left.
    let long = Duration::from_secs(60);
    leadership.extend(long).await.unwrap();
    let renewed = eb.inspect(&name).await.unwrap().expect("a leader");
    assert_eq!((renewed.term, &renewed.owner_id), (l.term, &l.owner_id));
    if let Some(r) = renewed.remaining {
        assert!(
            r <= long && r > ttl,
            "remaining {r:?} after a renewal to {long:?}"
        );
    }

    leadership.resign().await.unwrap();
    assert_eq!(
        eb.inspect(&name).await.unwrap(),
        None,
        "resigned, still shown"
    );
}

/// Metadata over 1 KiB as JSON is `InvalidArgument { metadata }` before
/// any I/O: nothing is held afterwards.
pub async fn inspect_oversized_metadata_is_rejected_and_writes_nothing(f: &Factory) {
    let c: Coord = f.client().await;
    let locks = c.locks().unwrap();
    let name = unique("inspect-big");
    let Some(_) = gated(locks.inspect(&name).await) else {
        return;
    };
    let big = json!({"blob": "x".repeat(2000)});
    metadata_field(
        locks
            .acquire_with_metadata(&name, LockOptions::new(LONG), &big)
            .await,
        "lock",
    );
    metadata_field(
        c.leases()
            .unwrap()
            .grant_with_metadata(&name, LONG, &big)
            .await,
        "lease",
    );
    if let Ok(sem) = c.semaphores() {
        metadata_field(
            sem.acquire_with_metadata(&name, PermitOptions::new(2, LONG), &big)
                .await,
            "semaphore",
        );
        assert!(sem.inspect(&name).await.unwrap().holders.is_empty());
    }
    assert!(locks.inspect(&name).await.unwrap().holders.is_empty());
    assert!(
        c.leases()
            .unwrap()
            .inspect(&name)
            .await
            .unwrap()
            .holders
            .is_empty()
    );
    // Exactly at the limit is fine.
    let s = "y".repeat(coord_core::inspect::MAX_METADATA_BYTES - 2);
    let at_limit = json!(s);
    let g = locks
        .acquire_with_metadata(&name, LockOptions::new(LONG), &at_limit)
        .await
        .expect("metadata of exactly 1 KiB");
    assert_eq!(
        locks.inspect(&name).await.unwrap().holders[0].metadata,
        Some(at_limit)
    );
    g.release().await.unwrap();
}

/// A refused attempt says who is in the way: a lock, a lease and a full
/// semaphore held by one client with metadata; another client's
/// `acquire_or_holders` / `grant_or_holders` (with its own metadata) is
/// `Held` with the holder's owner id, fencing token and metadata, writes
/// nothing (the holder is unchanged and its own metadata is not stored),
/// and once the holder is gone the same call is `Granted`.
pub async fn inspect_refused_attempt_names_the_holder(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let (la, lb) = (a.locks().unwrap(), b.locks().unwrap());
    let name = unique("held-by");
    if gated(lb.inspect(&name).await).is_none() {
        return;
    }
    let holder = json!({"host": "web-3", "job": "nightly"});
    let other = json!({"host": "web-4"});
    let opts = LockOptions::new(LONG).wait(Duration::from_millis(200));
    // A call that must be granted waits longer: on a queueing store the
    // refused attempt's place in line is withdrawn in the background, and
    // may stand before it a while on a loaded machine.
    let must_grant = opts.wait(Duration::from_secs(10));

    // A lock.
    let guard = la
        .acquire_with_metadata(&name, LockOptions::new(LONG), &holder)
        .await
        .unwrap();
    let info = match lb
        .acquire_or_holders(&name, opts, Some(&other))
        .await
        .unwrap()
    {
        Acquired::Held(Some(info)) => info,
        other => panic!("a held lock: expected Held with its holder, got {other:?}"),
    };
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert_eq!(info.holders[0].owner_id, guard.owner_id());
    assert_eq!(info.holders[0].fencing_token, guard.fencing_token());
    assert_eq!(info.holders[0].metadata.as_ref(), Some(&holder));
    // The holder is unchanged (waiters may still count the refused
    // attempt's own place in line, withdrawn in the background).
    let after = lb.inspect(&name).await.unwrap();
    assert_eq!(
        after.holders,
        holders_with_remaining(&info, &after),
        "the refusal changed the holder"
    );
    guard.release().await.unwrap();
    let g = lb
        .acquire_or_holders(&name, must_grant, Some(&other))
        .await
        .unwrap()
        .granted()
        .expect("a released lock: Granted");
    assert_eq!(
        la.inspect(&name).await.unwrap().holders[0]
            .metadata
            .as_ref(),
        Some(&other)
    );
    g.release().await.unwrap();

    // A lease.
    if let (Ok(ea), Ok(eb)) = (a.leases(), b.leases()) {
        let lname = unique("held-by-lease");
        let lease = ea
            .grant_with_metadata(&lname, LONG, &holder)
            .await
            .unwrap()
            .expect("a free lease");
        match eb.grant_or_holders(&lname, LONG, None).await.unwrap() {
            Acquired::Held(Some(info)) => {
                assert_eq!(info.holders.len(), 1, "{info:?}");
                assert_eq!(info.holders[0].owner_id, lease.owner_id());
                assert_eq!(info.holders[0].metadata.as_ref(), Some(&holder));
            }
            other => panic!("a live lease: expected Held with its holder, got {other:?}"),
        }
        lease.revoke().await.unwrap();
        let l = eb.grant_or_holders(&lname, LONG, None).await.unwrap();
        assert!(
            l.is_granted(),
            "a revoked lease: expected Granted, got {l:?}"
        );
        l.granted().unwrap().revoke().await.unwrap();
    }

    // A full semaphore: every grant is named.
    if let (Ok(sa), Ok(sb)) = (a.semaphores(), b.semaphores()) {
        let sname = unique("held-by-sem");
        let full = PermitOptions::new(2, LONG).permits(2);
        let p = sa
            .acquire_with_metadata(&sname, full, &holder)
            .await
            .unwrap();
        let one = PermitOptions::new(2, LONG).wait(Duration::from_millis(200));
        match sb
            .acquire_or_holders(&sname, one, Some(&other))
            .await
            .unwrap()
        {
            Acquired::Held(Some(info)) => {
                assert_eq!(info.holders.len(), 1, "{info:?}");
                assert_eq!(info.holders[0].owner_id, p.owner_id());
                assert_eq!(info.holders[0].permits, 2);
                assert_eq!(info.holders[0].metadata.as_ref(), Some(&holder));
            }
            other => panic!("a full semaphore: expected Held with its grants, got {other:?}"),
        }
        p.release().await.unwrap();
        // As for the lock: the refused attempt's place in line may stand
        // before this one until it is withdrawn in the background.
        let must_grant = one.wait(Duration::from_secs(10));
        let q = sb
            .acquire_or_holders(&sname, must_grant, None)
            .await
            .unwrap();
        assert!(
            q.is_granted(),
            "a free semaphore: expected Granted, got {q:?}"
        );
        q.granted().unwrap().release().await.unwrap();
    }
}

/// `info`'s holders with `after`'s remaining times (which move on between
/// reads): equal to `after`'s holders iff nothing else changed.
fn holders_with_remaining(info: &ClaimInfo, after: &ClaimInfo) -> Vec<coord_core::Holder> {
    let mut v = info.holders.clone();
    for (h, a) in v.iter_mut().zip(&after.holders) {
        h.remaining = a.remaining;
    }
    v
}
