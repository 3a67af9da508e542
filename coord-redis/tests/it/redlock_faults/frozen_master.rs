//! Masters frozen (SIGSTOP) or stopped while clients contend: never two
//! holders, grants still made by the others, fencing tokens still ordered,
//! and reads that do not wait for a frozen master.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use conformance::faults::history::{Access, FencedResource, Grant, check_lock_history};
use conformance::testkit::redis::RedlockMasters;
use conformance::testkit::wait::holds_within;
use tokio::time::{Instant, sleep};

use super::{Frozen, client, live_claims, ready};

/// A frozen master's window: from, to (ms after the start), which master.
type Window = (u64, u64, usize);

/// Four clients contend for one lock (TTL 1 s, waiting up to 2 s, call
/// timeout 300 ms) while masters are frozen with SIGSTOP in `windows`
/// (connections stay open, nothing is answered: every call to a frozen
/// master hangs to the call timeout), until `tail` after the last window.
/// Checks safety (never two valid holders, every fenced write accepted)
/// and returns the grants, their start time and the retryable errors.
async fn contend_with_frozen(windows: &[Window], tail: Duration) -> (Vec<Grant>, Instant, usize) {
    let set = RedlockMasters::start(3);
    let url = format!("{}?timeout=300ms&connect_timeout=5s", set.url());
    const CLIENTS: usize = 4;
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(client(&url).await);
    }
    ready(&set, &clients.iter().collect::<Vec<_>>()).await;
    let resource = Arc::new(FencedResource::new());
    let grants = Arc::new(std::sync::Mutex::new(Vec::<Grant>::new()));
    // The holders between grant and release, with their guards' local
    // deadlines: a holder stalled past its deadline (a loaded machine) is
    // no longer a holder, and a grant then is no overlap.
    let inside = Arc::new(std::sync::Mutex::new(Vec::<(usize, Instant)>::new()));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let end = t0 + Duration::from_millis(windows.last().map_or(0, |w| w.1)) + tail;
    let mut tasks = Vec::new();
    for (k, c) in clients.iter().enumerate() {
        let (c, resource, grants) = (c.clone(), resource.clone(), grants.clone());
        let (inside, overlaps) = (inside.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            let locks = c.locks().unwrap();
            let mut errors = 0;
            while Instant::now() < end {
                let asked = Instant::now();
                let g = match locks
                    .acquire("frozen", Duration::from_secs(1), Duration::from_secs(2))
                    .await
                {
                    Ok(g) => g,
                    Err(e) if e.is_retryable() => {
                        errors += 1;
                        continue;
                    }
                    Err(e) => panic!("client {k}: {e}"),
                };
                let token = g.fencing_token().get();
                let granted = Instant::now();
                let valid_until = granted + g.remaining();
                {
                    let mut inside = inside.lock().unwrap();
                    if inside.iter().any(|&(_, until)| until > granted) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    inside.push((k, valid_until));
                }
                let read = resource.read(k, token).unwrap_or(0);
                sleep(Duration::from_millis(5)).await;
                let ok = g.is_valid();
                inside.lock().unwrap().retain(|&(who, _)| who != k);
                if ok {
                    resource.write(k, token, read, read + 1);
                }
                grants.lock().unwrap().push(Grant {
                    client: k,
                    token,
                    asked,
                    granted,
                    valid_until: valid_until.min(Instant::now()),
                });
                let _ = g.release().await;
            }
            errors
        }));
    }
    for &(from, to, m) in windows {
        tokio::time::sleep_until(t0 + Duration::from_millis(from)).await;
        let frozen = Frozen::pause(&set.masters()[m]);
        tokio::time::sleep_until(t0 + Duration::from_millis(to)).await;
        drop(frozen);
    }
    let mut errors = 0;
    for t in tasks {
        errors += t.await.unwrap();
    }
    let grants = grants.lock().unwrap().clone();
    let violations = check_lock_history(&grants, &resource.log());
    assert!(violations.is_empty(), "{violations:#?}");
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two valid holders at once"
    );
    let refused = resource
        .log()
        .iter()
        .filter(|a| {
            matches!(
                a,
                Access::Write {
                    accepted: false,
                    ..
                }
            )
        })
        .count();
    assert_eq!(refused, 0, "a holder's fenced write was refused");
    eprintln!("{} grants, {errors} retryable errors", grants.len());
    (grants, t0, errors)
}

/// The grants in `from..to` ms after `t0`.
fn grants_between(grants: &[Grant], t0: Instant, from: u64, to: u64) -> usize {
    let (a, b) = (
        t0 + Duration::from_millis(from),
        t0 + Duration::from_millis(to),
    );
    grants
        .iter()
        .filter(|g| g.granted >= a && g.granted < b)
        .count()
}

/// Four clients contend while master 1 is frozen for 2.5 s: never two
/// valid holders, every fenced write accepted (the resumed master runs the
/// calls queued while it was frozen: late grants for attempts long
/// decided), and the lock moves again at once after it resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_master_while_clients_contend_is_safe() {
    let (grants, t0, _) = contend_with_frozen(&[(1000, 3500, 1)], Duration::from_secs(4)).await;
    // The third grant after the resume within 2 s: twice the second this
    // allowed before, room for a loaded machine's handovers; a lock that
    // no longer moves after the resume still fails it (the clients go on
    // for 4 s).
    let resumed = t0 + Duration::from_millis(3500);
    let mut after: Vec<Instant> = grants
        .iter()
        .map(|g| g.granted)
        .filter(|&g| g >= resumed)
        .collect();
    after.sort();
    let third = after.get(2).map(|&g| g - resumed);
    assert!(
        third.is_some_and(|t| t <= Duration::from_secs(2)),
        "the third grant after the master resumed came {third:?} after it ({} grants after it)",
        after.len()
    );
}

/// Liveness while a master is frozen: "a master that does not answer
/// costs a call at most its call timeout", so with two of three masters
/// answering, four contending clients should still take turns (several
/// grants a second). A master that ran into the timeout is skipped for a
/// second: otherwise the clients split the two live masters' votes, each
/// waits out the frozen master's timeout, undoes and retries, and hardly
/// anyone is granted while the master stays frozen.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_master_while_clients_contend_still_grants() {
    let windows = [(1000, 3500, 1), (4000, 6500, 2)];
    let (grants, t0, _) = contend_with_frozen(&windows, Duration::from_secs(1)).await;
    let counts: Vec<usize> = windows
        .iter()
        .map(|&(from, to, _)| grants_between(&grants, t0, from + 300, to))
        .collect();
    eprintln!("grants while frozen (after the first 300 ms): {counts:?}");
    assert!(
        counts.iter().all(|&n| n >= 3),
        "grants in each 2.2 s with a master frozen: {counts:?}; before the first freeze: {}",
        grants_between(&grants, t0, 0, 1000)
    );
}

/// Four callers take fencing tokens for one resource at once, with one
/// master stopped: every token is unique and each caller's rise. A call
/// may fail with a retryable error (a call timeout of 300 ms on a loaded
/// machine): the caller asks again, as a caller would; what was issued is
/// judged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fencing_tokens_under_contention_with_a_master_stopped() {
    let set = RedlockMasters::start(3);
    let url = format!("{}?timeout=300ms&connect_timeout=5s", set.url());
    set.masters()[0].stop();
    let mut tasks = Vec::new();
    for k in 0..4 {
        let c = client(&url).await;
        tasks.push(tokio::spawn(async move {
            let f = c.fencing().unwrap();
            let (mut got, mut failed) = (Vec::new(), 0);
            for _ in 0..25 {
                let deadline = Instant::now() + Duration::from_secs(10);
                let t = loop {
                    match f.next("fenced-res").await {
                        Ok(t) => break t.get(),
                        Err(e) if e.is_retryable() && Instant::now() < deadline => failed += 1,
                        Err(e) => panic!("caller {k}: {e}"),
                    }
                };
                got.push(t);
            }
            (k, got, failed)
        }));
    }
    let mut all = HashSet::new();
    let mut total = 0;
    for t in tasks {
        let (k, got, failed) = t.await.unwrap();
        if failed > 0 {
            eprintln!("caller {k}: {failed} retryable failures, asked again");
        }
        for w in got.windows(2) {
            assert!(w[1] > w[0], "caller {k}: {} then {}", w[0], w[1]);
        }
        for t in got {
            total += 1;
            assert!(all.insert(t), "token {t} issued twice");
        }
    }
    assert_eq!(total, 100);
}

/// The same with one master frozen (SIGSTOP): each call that meets a
/// split vote waits for the frozen master's timeout. Tokens that are
/// issued are unique and rise per caller; a call that fails says so with
/// a retryable error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fencing_tokens_under_contention_with_a_master_frozen() {
    let set = RedlockMasters::start(3);
    let url = format!("{}?timeout=300ms&connect_timeout=5s", set.url());
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(client(&url).await);
    }
    ready(&set, &clients.iter().collect::<Vec<_>>()).await;
    let frozen = Frozen::pause(&set.masters()[1]);
    let mut tasks = Vec::new();
    for (k, c) in clients.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let f = c.fencing().unwrap();
            let mut got = Vec::new();
            for _ in 0..10 {
                got.push(f.next("frozen-fence").await.map(|t| t.get()));
            }
            (k, got)
        }));
    }
    let started = Instant::now();
    let mut all = HashSet::new();
    let (mut ok, mut failed) = (0, Vec::new());
    for t in tasks {
        let (k, got) = t.await.unwrap();
        let mut last = 0;
        for r in got {
            match r {
                Ok(t) => {
                    assert!(t > last, "caller {k}: {last} then {t}");
                    last = t;
                    assert!(all.insert(t), "token {t} issued twice");
                    ok += 1;
                }
                Err(e) => {
                    assert!(e.is_retryable(), "{e}");
                    failed.push(e.to_string());
                }
            }
        }
    }
    drop(frozen);
    eprintln!(
        "{ok} tokens, {} failed in {:?}: {:?}",
        failed.len(),
        started.elapsed(),
        failed.first()
    );
    // How many succeed varies (split votes wait out the frozen master's
    // timeout, see `a_frozen_master_while_clients_contend_still_grants`):
    // 27 to 30 in most runs, far fewer in some; only safety is asserted
    // here.
    assert!(ok + failed.len() == 30);
}

/// Reads with one master frozen: the module docs say a master that does
/// not answer costs a call its call timeout "only when the masters that
/// did answer could not decide the attempt alone"; so `Leases::remaining`
/// and `Locks::inspect` return once a quorum agrees, rather than waiting
/// for every master (which would cost each the frozen master's whole call
/// timeout although two masters answered at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_with_a_frozen_master_do_not_wait_for_it() {
    let set = RedlockMasters::start(3);
    // Waiting for the frozen master costs a read its call timeout (4 s);
    // half of it leaves room for a loaded machine.
    let call_timeout = Duration::from_secs(4);
    let url = format!(
        "{}?timeout={}ms&connect_timeout=5s",
        set.url(),
        call_timeout.as_millis()
    );
    let c = client(&url).await;
    let lease = c
        .leases()
        .unwrap()
        .grant("frozen-read", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    // The grant returned once a quorum answered; on a loaded machine the
    // third master's write may come later, or never (its call timed out).
    // The two masters left unfrozen must both hold the lease, or they need
    // not agree: freeze one that lacks it if one still does, else any.
    let on_every_master = holds_within(Duration::from_secs(10), || async {
        set.masters()
            .iter()
            .all(|m| !live_claims(m, "frozen-read").is_empty())
    })
    .await;
    let frozen = match on_every_master {
        Some(_) => 1,
        None => set
            .masters()
            .iter()
            .position(|m| live_claims(m, "frozen-read").is_empty())
            .expect("a master without the lease"),
    };
    let _frozen = Frozen::pause(&set.masters()[frozen]);
    let mut took = Vec::new();
    for _ in 0..2 {
        let t = Instant::now();
        let r = c.leases().unwrap().remaining("frozen-read").await.unwrap();
        assert!(r.is_some());
        took.push(t.elapsed());
        let t = Instant::now();
        let i = c.locks().unwrap().inspect("frozen-read").await.unwrap();
        assert!(i.holders.is_empty());
        took.push(t.elapsed());
    }
    drop(lease);
    assert!(
        took.iter().all(|t| *t < call_timeout / 2),
        "remaining, inspect, remaining, inspect took {took:?} (call timeout {call_timeout:?})"
    );
}
