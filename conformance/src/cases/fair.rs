//! Fair locks (`LockOptions::fair`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_core::{Error, LockOptions};
use tokio::sync::Barrier;

use crate::testkit::wait::holds_within;
use crate::{Factory, unique};

/// How long the saturating clients may take to make [`JUDGED`] grants.
const CONTEND: Duration = Duration::from_secs(30);
/// How many grants, with every client in the queue, are judged.
const JUDGED: usize = 40;
/// How long a holder keeps the lock.
const HOLD: Duration = Duration::from_millis(3);
/// Clients contending.
const CLIENTS: usize = 4;

/// Fair locks grant the clients that ask with `fair` in arrival order:
/// four clients, each taking the lock again as soon as it let it go,
/// never get more than two grants in a row, and each gets at least half
/// of the busiest one's grants. A fair holder excludes an unfair attempt
/// on the same name and the other way round (the ticket a refused fair
/// attempt took is given back: the next fair attempt is granted). A fair
/// holder that keeps its guard past its TTL holds up the next fair waiter
/// no longer than that. Stores without FIFO semaphores refuse `fair` as
/// unsupported.
pub async fn lock_fair_grants_waiters_in_arrival_order(f: &Factory) {
    let c = f.client().await;
    let store = c.capabilities().backend;
    let locks = c.locks().unwrap();
    let name = unique("fair");
    let ttl = Duration::from_secs(10);
    let fair = LockOptions::new(ttl).fair(true);
    let first = match locks.acquire_with(&name, fair).await {
        Ok(g) => g,
        Err(Error::Unsupported { .. }) => return,
        Err(e) => panic!("{store}: a fair lock on a free name: {e}"),
    };
    let unfair = locks.try_acquire(&name, ttl).await.unwrap();
    assert!(
        unfair.is_none(),
        "{store}: an unfair attempt got a fair holder's lock"
    );
    first.release().await.unwrap();
    let plain = locks.try_acquire(&name, ttl).await.unwrap();
    let plain = plain.expect("free after the fair release");
    let refused = locks.acquire_with(&name, fair).await;
    assert!(
        matches!(refused, Err(Error::Timeout { .. })),
        "{store}: a fair attempt beside an unfair holder: {refused:?}"
    );
    plain.release().await.unwrap();
    let again = locks.acquire_with(&name, fair).await;
    again
        .expect("the refused attempt's ticket was given back")
        .release()
        .await
        .unwrap();

    // A holder that keeps its guard past the TTL (no watchdog) holds up
    // the next fair waiter no longer than the TTL: its ticket goes with it.
    let short = crate::ttl(&c, Duration::from_millis(300));
    let kept = locks
        .acquire_with(&name, LockOptions::new(short).fair(true))
        .await;
    let kept = kept.expect("a free fair lock");
    let other = f.client().await;
    let wait = short * 4 + Duration::from_secs(3);
    let next = other
        .locks()
        .unwrap()
        .acquire_with(&name, fair.wait(wait))
        .await;
    let next = next.unwrap_or_else(|e| panic!("{store}: behind an expired fair holder: {e}"));
    drop(kept);
    next.release().await.unwrap();

    // Connect first and start every client on a barrier, so the clients'
    // connects and task start-ups are not counted as contention.
    let clients = f.clients(CLIENTS).await;
    let grants = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(CLIENTS));
    let mut tasks = Vec::new();
    for (i, client) in clients.into_iter().enumerate() {
        let (grants, name) = (grants.clone(), name.clone());
        let (stop, start) = (stop.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            let locks = client.locks().unwrap();
            let opts = LockOptions::new(ttl)
                .fair(true)
                .wait(Duration::from_secs(20));
            start.wait().await;
            while !stop.load(Ordering::SeqCst) {
                let g = locks.acquire_with(&name, opts).await.expect("fair acquire");
                grants.lock().unwrap().push(i);
                tokio::time::sleep(HOLD).await;
                g.release().await.expect("release");
            }
        }));
    }
    // A client is in the queue for certain only once it has been granted
    // (a first request may still be on its way when another client is
    // granted twice): judge from the last client's first grant on, until
    // the judged grants reach the count (the grants after that are the
    // clients leaving one by one, when runs are legitimate).
    let judged = |grants: &[usize]| -> Option<std::ops::Range<usize>> {
        let from = (0..CLIENTS)
            .map(|i| grants.iter().position(|g| *g == i))
            .collect::<Option<Vec<_>>>()?
            .into_iter()
            .max()?;
        (grants.len() - from >= JUDGED).then_some(from..from + JUDGED)
    };
    let within = holds_within(CONTEND, || {
        let grants = grants.clone();
        async move { judged(&grants.lock().unwrap()).is_some() }
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    let all = grants.lock().unwrap().clone();
    assert!(
        within.is_some(),
        "{store}: not {JUDGED} grants with every client in the queue within {CONTEND:?}: {all:?}"
    );
    let range = judged(&all).expect("reached before the stop");
    let grants = &all[range];
    let mut longest = 0;
    let mut run = 0;
    for (k, who) in grants.iter().enumerate() {
        run = if k > 0 && grants[k - 1] == *who {
            run + 1
        } else {
            1
        };
        longest = longest.max(run);
    }
    let per: Vec<usize> = (0..CLIENTS)
        .map(|i| grants.iter().filter(|g| **g == i).count())
        .collect();
    let most = per.iter().copied().max().unwrap_or(0);
    assert!(
        longest <= 2,
        "{store}: {longest} grants in a row to one client: {grants:?}"
    );
    assert!(
        per.iter().all(|n| 2 * n >= most),
        "{store}: grants per client {per:?}"
    );
}
