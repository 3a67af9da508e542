//! Bad and unusual input.

use std::time::Duration;

use coord_core::{Algorithm, Coord, Error, PushOptions, Quota};

use crate::cases::offered;
use crate::{Factory, unique};

const T: Duration = Duration::from_secs(30);

fn is_invalid<T: std::fmt::Debug>(r: coord_core::Result<T>, what: &str) {
    match r {
        Err(Error::InvalidArgument { .. }) => {}
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    }
}

async fn every_primitive_rejects(c: &Coord, name: &str, what: &str) {
    is_invalid(
        c.locks().unwrap().try_acquire(name, T).await,
        &format!("lock {what}"),
    );
    is_invalid(
        c.locks()
            .unwrap()
            .acquire(name, T, Duration::from_secs(1))
            .await,
        &format!("lock acquire {what}"),
    );
    is_invalid(
        c.locks()
            .unwrap()
            .acquire_all([name], coord_core::LockOptions::new(T))
            .await,
        &format!("acquire_all {what}"),
    );
    is_invalid(
        c.leases().unwrap().grant(name, T).await,
        &format!("lease {what}"),
    );
    is_invalid(
        c.leases().unwrap().remaining(name).await,
        &format!("lease remaining {what}"),
    );
    is_invalid(
        c.fencing().unwrap().next(name).await,
        &format!("fencing {what}"),
    );
    if let Some(e) = offered(c.elections()) {
        is_invalid(
            e.try_campaign(name, "x", T).await,
            &format!("election {what}"),
        );
        is_invalid(
            e.try_campaign("fine", name, T).await,
            &format!("candidate {what}"),
        );
        is_invalid(e.leader(name).await, &format!("leader {what}"));
        assert!(e.observe(name).is_err(), "observe {what}");
    }
    if let Some(b) = offered(c.barriers()) {
        is_invalid(b.wait(name, 1, "p", T).await, &format!("barrier {what}"));
        is_invalid(
            b.wait("fine", 1, name, T).await,
            &format!("participant {what}"),
        );
    }
    if let Some(l) = offered(c.limiter()) {
        is_invalid(
            l.check(name, Quota::per(1, T)).await,
            &format!("limiter {what}"),
        );
    }
}

/// Empty, 513-byte and control-character names are rejected by every
/// primitive with InvalidArgument, and nothing is written.
pub async fn input_bad_names_are_rejected_and_write_nothing(f: &Factory) {
    let c = f.client().await;
    let base = unique("bad");
    let long = format!("{base}{}", "x".repeat(513 - base.len()));
    assert_eq!(long.len(), 513);
    every_primitive_rejects(&c, "", "empty name").await;
    every_primitive_rejects(&c, &long, "513-byte name").await;
    every_primitive_rejects(&c, &format!("{base}\nnewline"), "newline").await;
    every_primitive_rejects(&c, &format!("{base}\0nul"), "NUL").await;
    // Nothing written: a backend that truncated or stripped the bad names
    // would now hold these.
    let prefix = &long[..512];
    for n in [
        prefix.to_string(),
        base.clone(),
        format!("{base}newline"),
        format!("{base}nul"),
    ] {
        let g = c.locks().unwrap().try_acquire(&n, T).await.unwrap();
        assert!(
            g.is_some(),
            "`{n}` is held: a rejected call wrote something"
        );
        g.unwrap().release().await.unwrap();
        assert!(c.leases().unwrap().remaining(&n).await.unwrap().is_none());
        if let Some(e) = offered(c.elections()) {
            assert!(e.leader(&n).await.unwrap().is_none());
        }
    }
    // A 512-byte name is fine.
    let g = c
        .locks()
        .unwrap()
        .try_acquire(prefix, T)
        .await
        .unwrap()
        .expect("512 bytes is allowed");
    g.release().await.unwrap();
}

/// TTL 0 and over a year, limit 0, window 0, cost 0 and parties 0 are
/// rejected with InvalidArgument naming the field, and change nothing.
pub async fn input_bad_ttls_and_quotas_are_rejected(f: &Factory) {
    let c = f.client().await;
    let name = unique("bad-ttl");
    let year = Duration::from_secs(366 * 24 * 3600);
    for (ttl, what) in [(Duration::ZERO, "ttl 0"), (year, "ttl over a year")] {
        let field = |r: coord_core::Result<()>| match r {
            Err(Error::InvalidArgument { field: "ttl", .. }) => {}
            other => panic!("{what}: expected InvalidArgument(ttl), got {other:?}"),
        };
        field(c.locks().unwrap().try_acquire(&name, ttl).await.map(|_| ()));
        field(
            c.locks()
                .unwrap()
                .acquire(&name, ttl, Duration::from_secs(1))
                .await
                .map(|_| ()),
        );
        field(c.leases().unwrap().grant(&name, ttl).await.map(|_| ()));
        if let Some(e) = offered(c.elections()) {
            field(e.try_campaign(&name, "x", ttl).await.map(|_| ()));
        }
    }
    let g = c
        .locks()
        .unwrap()
        .try_acquire(&name, T)
        .await
        .unwrap()
        .expect("nothing was written");
    // Extending with a bad TTL is rejected too and keeps the lock.
    assert!(matches!(
        g.extend(Duration::ZERO).await,
        Err(Error::InvalidArgument { field: "ttl", .. })
    ));
    assert!(matches!(
        g.extend(year).await,
        Err(Error::InvalidArgument { field: "ttl", .. })
    ));
    g.release()
        .await
        .expect("still held after rejected extends");

    let Some(lim) = offered(c.limiter()) else {
        return;
    };
    for alg in Algorithm::ALL {
        let r = lim.check(&name, Quota::new(0, T, alg)).await;
        assert!(
            matches!(r, Err(Error::InvalidArgument { field: "limit", .. })),
            "{alg:?} limit 0: {r:?}"
        );
        let r = lim.check(&name, Quota::new(5, Duration::ZERO, alg)).await;
        assert!(
            matches!(
                r,
                Err(Error::InvalidArgument {
                    field: "window",
                    ..
                })
            ),
            "{alg:?} window 0: {r:?}"
        );
        let r = lim.check_cost(&name, Quota::new(5, T, alg), 0).await;
        assert!(
            matches!(r, Err(Error::InvalidArgument { field: "cost", .. })),
            "{alg:?} cost 0: {r:?}"
        );
        let d = lim.check(&name, Quota::new(5, T, alg)).await.unwrap();
        assert_eq!(d.remaining, 4, "{alg:?}: a rejected check was recorded");
    }
    let Some(barriers) = offered(c.barriers()) else {
        return;
    };
    let r = barriers.wait(&name, 0, "p", T).await;
    assert!(
        matches!(
            r,
            Err(Error::InvalidArgument {
                field: "parties",
                ..
            })
        ),
        "parties 0: {r:?}"
    );
    // A one-party barrier passes at once.
    barriers.wait(&name, 1, "p", T).await.unwrap();
}

/// Names with spaces, quotes, braces, `*`, unicode and SQL are ordinary,
/// separate names.
pub async fn input_odd_names_are_ordinary_and_separate(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let base = unique("odd");
    let odd = [
        "with space",
        "quote's \"double\"",
        "{braces}",
        "{",
        "}",
        "*",
        "a*",
        "?[]",
        "ünïcødé 🦀 名前",
        "'; DROP TABLE x; --",
        "%_\\",
        "$1",
        "/slash/",
    ];
    let names: Vec<String> = odd.iter().map(|o| format!("{base}{o}")).collect();
    let mut guards = Vec::new();
    for n in &names {
        let g = a.locks().unwrap().try_acquire(n, T).await.unwrap();
        guards.push(g.unwrap_or_else(|| panic!("`{n}` collided with another odd name")));
    }
    for n in &names {
        assert!(
            b.locks()
                .unwrap()
                .try_acquire(n, T)
                .await
                .unwrap()
                .is_none(),
            "`{n}` not excluded"
        );
    }
    let bare = b
        .locks()
        .unwrap()
        .try_acquire(&base, T)
        .await
        .unwrap()
        .expect("the base name is separate");
    bare.release().await.unwrap();
    for g in guards {
        g.release().await.unwrap();
    }
    let limiter = offered(b.limiter());
    for n in &names {
        if let Some(l) = &limiter {
            let d = l.check(n, Quota::per(1, T)).await.unwrap();
            assert!(d.allowed, "`{n}` limiter collided");
        }
        let t = b.fencing().unwrap().next(n).await.unwrap();
        assert!(t.get() > 0);
    }
}

/// The handle `r` gives, or `None` (said on stderr) when the store does
/// not offer it, whether or not it says why: the case using it runs its
/// other checks.
fn if_offered<T>(r: coord_core::Result<T>, what: &str) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e @ Error::Unsupported { .. }) => {
            eprintln!("skipped {what}: {e}");
            None
        }
        Err(e) => panic!("{what}: expected a handle or Unsupported, got {e:?}"),
    }
}

/// Two names of `len` bytes (at most [`MAX_NAME_BYTES`](coord_core::validate::MAX_NAME_BYTES))
/// that differ only in their last byte.
fn long_pair(base: &str, len: usize) -> [String; 2] {
    let stem = format!("{base}{}", "x".repeat(len - 1 - base.len()));
    [format!("{stem}a"), format!("{stem}b")]
}

/// Names are compared whole: two names of 300 bytes, and two of 512 (the
/// longest allowed), that differ only in their last byte are separate
/// names for locks, leases, semaphores, read-write locks, elections,
/// limiters and queues (and their dedup ids). A store that cuts names
/// short (at 255 bytes, say) or keys them by a prefix makes each pair one
/// name, and fails here.
pub async fn input_long_names_sharing_a_prefix_are_separate(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let base = unique("long");
    for len in [300, coord_core::validate::MAX_NAME_BYTES] {
        let [one, two] = long_pair(&base, len);
        assert_eq!((one.len(), two.len()), (len, len));
        let what = format!("two {len}-byte names differing in the last byte");

        let held = a.locks().unwrap().try_acquire(&one, T).await.unwrap();
        let held = held.unwrap_or_else(|| panic!("{what}: the first lock is not free"));
        let other = b.locks().unwrap().try_acquire(&two, T).await.unwrap();
        let other = other.unwrap_or_else(|| panic!("{what}: a lock on one holds the other"));
        other.release().await.unwrap();
        held.release().await.unwrap();

        let held = a.leases().unwrap().grant(&one, T).await.unwrap();
        let held = held.unwrap_or_else(|| panic!("{what}: the first lease is not free"));
        let other = b.leases().unwrap().grant(&two, T).await.unwrap();
        let other = other.unwrap_or_else(|| panic!("{what}: a lease on one holds the other"));
        other.revoke().await.unwrap();
        assert!(
            b.leases().unwrap().is_alive(&one).await.unwrap(),
            "{what}: revoking the lease on one ended the other"
        );
        held.revoke().await.unwrap();

        if let Some(sa) = if_offered(a.semaphores(), "semaphores") {
            let sb = b.semaphores().unwrap();
            let held = sa.try_acquire(&one, 1, T).await.unwrap();
            let held = held.unwrap_or_else(|| panic!("{what}: the first semaphore is not free"));
            // Another total: one name in use with total 1 would refuse it.
            let other = match sb.try_acquire_many(&two, 2, 2, T).await {
                Ok(Some(p)) => p,
                other => {
                    panic!("{what}: 2 of 2 permits of one, while the other is held: {other:?}")
                }
            };
            other.release().await.unwrap();
            held.release().await.unwrap();
        }

        if let Some(ra) = if_offered(a.rw_locks(), "read-write locks") {
            let rb = b.rw_locks().unwrap();
            let held = ra.try_write(&one, T).await.unwrap();
            let held = held.unwrap_or_else(|| panic!("{what}: the first rwlock is not free"));
            let other = rb.try_write(&two, T).await.unwrap();
            let other = other
                .unwrap_or_else(|| panic!("{what}: writing one read-write lock holds the other"));
            other.release().await.unwrap();
            held.release().await.unwrap();
        }

        if let Some(ea) = offered(a.elections()) {
            let eb = b.elections().unwrap();
            let held = ea.try_campaign(&one, "a", T).await.unwrap();
            let held = held.unwrap_or_else(|| panic!("{what}: the first election has a leader"));
            let other = eb.try_campaign(&two, "b", T).await.unwrap();
            let other =
                other.unwrap_or_else(|| panic!("{what}: the leader of one leads the other"));
            other.resign().await.unwrap();
            held.resign().await.unwrap();
        }

        if let Some(la) = offered(a.limiter()) {
            let q = Quota::per(1, T);
            assert!(
                la.check(&one, q).await.unwrap().allowed,
                "{what}: first limiter key"
            );
            assert!(
                b.limiter().unwrap().check(&two, q).await.unwrap().allowed,
                "{what}: a request on one limiter key was counted on the other"
            );
        }

        if let Some(qa) = if_offered(a.queues(), "queues") {
            let qb = b.queues().unwrap();
            let dedup = PushOptions::new().dedup_id(&one);
            let first = qa.push_with(&one, b"one", &dedup).await.unwrap();
            assert!(!first.duplicate, "{what}: the first push");
            let again = qa
                .push_with(&one, b"one", &PushOptions::new().dedup_id(&two))
                .await;
            assert!(
                !again.unwrap().duplicate,
                "{what}: as dedup ids, a push with one was a duplicate of the other"
            );
            let popped = qb.pop(&two, T, Duration::ZERO).await.unwrap();
            assert!(
                popped.is_none(),
                "{what}: a message pushed to one queue was delivered from the other"
            );
            let pushed = qb.push_with(&two, b"two", &dedup).await.unwrap();
            assert!(
                !pushed.duplicate,
                "{what}: a dedup id of one queue made a push to the other a duplicate"
            );
            let got = qb.pop(&two, T, Duration::ZERO).await.unwrap();
            let got = got.unwrap_or_else(|| panic!("{what}: the second queue's message"));
            assert_eq!(
                got.payload(),
                &b"two"[..],
                "{what}: the second queue's message"
            );
            got.ack().await.unwrap();
            qa.purge(&one).await.unwrap();
            qb.purge(&two).await.unwrap();
        }
    }
}

/// A lock, a lease, an election, a barrier, a limiter and a fencing
/// resource of the same name do not collide.
pub async fn input_kinds_of_one_name_do_not_collide(f: &Factory) {
    let c = f.client().await;
    let name = unique("same-name");
    let g = c
        .locks()
        .unwrap()
        .try_acquire(&name, T)
        .await
        .unwrap()
        .expect("lock");
    let l = c
        .leases()
        .unwrap()
        .grant(&name, T)
        .await
        .unwrap()
        .expect("a lock must not block a lease");
    let mut e = None;
    if let Some(elections) = offered(c.elections()) {
        let leader = elections.try_campaign(&name, "me", T).await.unwrap();
        e = Some(leader.expect("a lock must not block an election"));
    }
    if let Some(l) = offered(c.limiter()) {
        let d = l.check(&name, Quota::per(1, T)).await.unwrap();
        assert!(d.allowed, "a lock must not affect a limiter");
    }
    c.fencing().unwrap().next(&name).await.unwrap();
    if let Some(b) = offered(c.barriers()) {
        b.wait(&name, 1, "me", T).await.unwrap();
    }
    if let Some(e) = e {
        e.resign().await.unwrap();
    }
    assert!(
        c.leases().unwrap().is_alive(&name).await.unwrap(),
        "resigning revoked the lease"
    );
    l.revoke().await.unwrap();
    g.extend(T).await.expect("the lock survived the others");
    g.release().await.unwrap();
}
