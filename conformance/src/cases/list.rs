//! Listing cases (`coord ls`).

use std::time::Duration;

use coord_core::{Coord, Error, Listed, Result};

use crate::{Factory, unique};

/// How long the claims of the case live: far longer than the case.
const LONG: Duration = Duration::from_secs(60);

/// `list`, with the kinds this handle or store cannot list as `None`.
async fn listed(c: &Coord, kind: Listed, prefix: &str, limit: usize) -> Option<Vec<String>> {
    match c.list(kind, prefix, limit).await {
        Ok(names) => Some(names),
        Err(Error::Unsupported { .. }) => None,
        Err(e) => panic!("{}: listing {kind:?}: {e}", c.capabilities().backend),
    }
}

/// `Coord::list` names, for each kind, what is held under a prefix, seen
/// from another client: a lock, a lease, a leader, a semaphore permit, a
/// read-write lock and a queue with a message each under the prefix are
/// listed, each under its own kind only; a name beside the prefix is not;
/// `limit` caps the answer; a released lock and a purged queue leave the
/// listing. Bad input is refused.
pub async fn list_names_what_is_held_under_a_prefix(f: &Factory) {
    let c = f.client().await;
    let viewer = f.client().await;
    let store = c.capabilities().backend;
    let base = unique("list");
    let p = format!("{base}/");
    for kind in Listed::ALL {
        if let Some(names) = listed(&viewer, kind, &p, 100).await {
            assert!(
                names.is_empty(),
                "{store}: {kind:?} under a fresh prefix: {names:?}"
            );
        }
    }
    let name = |k: &str| format!("{p}{k}");
    let lock = c
        .locks()
        .unwrap()
        .try_acquire(&name("lock"), LONG)
        .await
        .unwrap();
    let lock = lock.expect("a fresh lock is free");
    let second = c
        .locks()
        .unwrap()
        .try_acquire(&name("lock2"), LONG)
        .await
        .unwrap();
    let second = second.expect("a fresh lock is free");
    let beside = c
        .locks()
        .unwrap()
        .try_acquire(&format!("{base}-beside"), LONG)
        .await
        .unwrap();
    let beside = beside.expect("a fresh lock is free");
    let mut held: Vec<(Listed, String)> =
        vec![(Listed::Lock, name("lock")), (Listed::Lock, name("lock2"))];
    let lease = match c.leases() {
        Ok(l) => {
            held.push((Listed::Lease, name("lease")));
            Some(
                l.grant(&name("lease"), LONG)
                    .await
                    .unwrap()
                    .expect("free lease"),
            )
        }
        Err(_) => None,
    };
    let leader = match c.elections() {
        Ok(e) => {
            held.push((Listed::Election, name("election")));
            let l = e.try_campaign(&name("election"), "me", LONG).await.unwrap();
            Some(l.expect("a fresh election is won"))
        }
        Err(_) => None,
    };
    let permit = match c.semaphores() {
        Ok(s) => {
            held.push((Listed::Semaphore, name("semaphore")));
            Some(
                s.try_acquire(&name("semaphore"), 2, LONG)
                    .await
                    .unwrap()
                    .expect("free permit"),
            )
        }
        Err(_) => None,
    };
    let reader = match c.rw_locks() {
        Ok(r) => {
            held.push((Listed::RwLock, name("rwlock")));
            Some(r.read(&name("rwlock"), LONG, Duration::ZERO).await.unwrap())
        }
        Err(_) => None,
    };
    let queues = c.queues().ok();
    if let Some(q) = &queues {
        held.push((Listed::Queue, name("queue")));
        q.push(&name("queue"), b"m").await.unwrap();
    }
    for kind in Listed::ALL {
        let Some(names) = listed(&viewer, kind, &p, 100).await else {
            continue;
        };
        let want: Vec<String> = held
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, n)| n.clone())
            .collect();
        assert_eq!(names, want, "{store}: {kind:?} under {p:?}");
    }
    if let Some(all) = listed(&viewer, Listed::Lock, &base, 100).await {
        let mut want = vec![format!("{base}-beside"), name("lock"), name("lock2")];
        want.sort();
        assert_eq!(all, want, "{store}: locks under {base:?}");
        let one = listed(&viewer, Listed::Lock, &p, 1).await.unwrap();
        assert_eq!(one.len(), 1, "{store}: a limit of 1 gave {one:?}");
    }
    lock.release().await.unwrap();
    if let Some(names) = listed(&viewer, Listed::Lock, &p, 100).await {
        assert_eq!(names, [name("lock2")], "{store}: after a release");
    }
    if let Some(q) = &queues {
        // Emptied by an ack, a queue holds nothing a listing shows.
        let d = q.pop(&name("queue"), LONG, Duration::ZERO).await.unwrap();
        d.expect("the message pushed").ack().await.unwrap();
        let names = listed(&viewer, Listed::Queue, &p, 100)
            .await
            .unwrap_or_default();
        assert!(names.is_empty(), "{store}: queues after an ack: {names:?}");
        q.push(&name("queue"), b"m").await.unwrap();
        q.purge(&name("queue")).await.unwrap();
        let names = listed(&viewer, Listed::Queue, &p, 100)
            .await
            .unwrap_or_default();
        assert!(names.is_empty(), "{store}: queues after a purge: {names:?}");
    }
    let bad: [Result<Vec<String>>; 3] = [
        viewer.list(Listed::Lock, &p, 0).await,
        viewer
            .list(Listed::Lock, &p, coord_core::MAX_LIST + 1)
            .await,
        viewer.list(Listed::Lock, "a\u{1}b", 10).await,
    ];
    for r in bad {
        assert!(
            matches!(r, Err(Error::InvalidArgument { .. })),
            "{store}: bad input gave {r:?}"
        );
    }
    second.release().await.unwrap();
    beside.release().await.unwrap();
    if let Some(l) = lease {
        l.release().await.unwrap();
    }
    if let Some(l) = leader {
        l.resign().await.unwrap();
    }
    if let Some(p) = permit {
        p.release().await.unwrap();
    }
    if let Some(r) = reader {
        r.release().await.unwrap();
    }
}
