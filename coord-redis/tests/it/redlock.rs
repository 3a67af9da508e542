//! Redlock over three independent masters, under real faults: a master
//! stopped (works), two stopped (refused, with a clear error), and clients
//! each cut off from a different master through their own fault proxies
//! while they contend (never two holders; the fenced resource accepts
//! every holder's writes, so tokens rose in grant order).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use conformance::faults::history::FencedResource;
use conformance::faults::history::{Grant, check_lock_history};
use conformance::testkit::proxy::FaultProxy;
use conformance::testkit::redis::RedlockMasters;
use coord_core::{Coord, Error};
use tokio::time::{Instant, sleep};

const TTL: Duration = Duration::from_secs(5);

/// The contended lock's TTL: a release that cannot reach a master leaves
/// the claim there until its TTL (Redlock's price for a partition), so a
/// short TTL keeps the lock moving while masters come and go.
const SHORT: Duration = Duration::from_secs(1);

async fn client(url: &str) -> Coord {
    coord_redis::connect(url)
        .await
        .expect("connect to the Redlock masters")
}

/// With one of three masters stopped (before connecting, and another
/// one after), locks, leases and fencing tokens work, and a waiter is
/// still woken by a release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_master_down_still_works() {
    let set = RedlockMasters::start(3);
    set.masters()[2].stop();
    let (a, b) = (client(&set.url()).await, client(&set.url()).await);
    let caps = a.capabilities();
    assert_eq!(caps.deployment, coord_core::Deployment::Redlock);
    assert_eq!(caps.fencing, coord_core::FencingDurability::BestEffort);

    let locks = a.locks().unwrap();
    let g = locks
        .acquire("one-down", TTL, Duration::from_secs(2))
        .await
        .unwrap();
    assert!(
        b.locks()
            .unwrap()
            .try_acquire("one-down", TTL)
            .await
            .unwrap()
            .is_none()
    );
    let first = g.fencing_token();
    // A waiter on the other client is woken by the release, not its poll.
    let b2 = b.clone().with_poll_interval(Duration::from_secs(10));
    let waiter = tokio::spawn(async move {
        let t = Instant::now();
        let g = b2
            .locks()
            .unwrap()
            .acquire("one-down", TTL, Duration::from_secs(8))
            .await;
        (g, t.elapsed())
    });
    sleep(Duration::from_millis(200)).await;
    g.release().await.unwrap();
    let (g2, waited) = waiter.await.unwrap();
    let g2 = g2.expect("the waiter got the lock after the release");
    assert!(waited < Duration::from_secs(3), "woken after {waited:?}");
    assert!(g2.fencing_token() > first);
    g2.release().await.unwrap();

    let lease = a
        .leases()
        .unwrap()
        .grant("one-down-lease", TTL)
        .await
        .unwrap()
        .unwrap();
    assert!(
        a.leases()
            .unwrap()
            .is_alive("one-down-lease")
            .await
            .unwrap()
    );
    lease.revoke().await.unwrap();
    let f = a.fencing().unwrap();
    let (t1, t2) = (
        f.next("one-down-fence").await.unwrap(),
        f.next("one-down-fence").await.unwrap(),
    );
    assert!(t2 > t1);

    // The stopped master comes back empty; now a second one stops: the
    // client reconnects to the first in the background and goes on.
    set.masters()[2].start_again();
    sleep(Duration::from_millis(1500)).await;
    let _ = a.locks().unwrap().try_acquire("warm", TTL).await;
    sleep(Duration::from_millis(500)).await;
    set.masters()[0].stop();
    let g = tokio::time::timeout(
        Duration::from_secs(10),
        a.locks()
            .unwrap()
            .acquire("one-down-2", TTL, Duration::from_secs(5)),
    )
    .await
    .expect("acquire within 10 s")
    .expect("a quorum of the restarted and the third master grants");
    g.release().await.unwrap();
}

/// With two of three masters stopped, `connect` is refused saying so, and
/// a client connected before gets `Unavailable` (retryable) from every
/// attempt: never a grant, never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_down_is_refused() {
    let set = RedlockMasters::start(3);
    let a = client(&format!("{}?timeout=500ms", set.url())).await;
    set.masters()[0].stop();
    set.masters()[1].stop();
    for _ in 0..3 {
        match a.locks().unwrap().try_acquire("majority-down", TTL).await {
            Err(e @ Error::Unavailable { .. }) => {
                assert!(e.to_string().contains("quorum of 2"), "{e}");
            }
            other => panic!("expected Unavailable with a majority down, got {other:?}"),
        }
    }
    match a.fencing().unwrap().next("majority-down").await {
        Err(e) => assert!(e.is_retryable(), "{e}"),
        Ok(t) => panic!("a fencing token {t} with a majority down"),
    }
    let e = coord_redis::connect(&format!("{}?connect_timeout=1s", set.url()))
        .await
        .expect_err("connect with a majority down");
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    assert!(e.to_string().contains("only 1 of 3"), "{e}");
}

/// Bad Redlock URLs are configuration errors naming the problem, without
/// the password.
#[tokio::test]
async fn bad_redlock_urls_are_config_errors() {
    for (url, says) in [
        ("redlock://:hunter2@127.0.0.1:1,127.0.0.1:2", "at least 3"),
        (
            "redlock://:hunter2@127.0.0.1:1,127.0.0.1:1,127.0.0.1:2",
            "listed twice",
        ),
        ("redlock://:hunter2@127.0.0.1:1,,127.0.0.1:2", "empty host"),
        (
            "redlock://:hunter2@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?prefx=a",
            "prefx",
        ),
        (
            "redlock://:hunter2@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?layout=php",
            "Layout::Php",
        ),
    ] {
        let e = coord_redis::connect(url).await.expect_err(url);
        assert!(matches!(e, Error::Config(_)), "{url}: {e:?}");
        let m = e.to_string();
        assert!(m.contains(says), "{url}: {m}");
        assert!(!m.contains("hunter2"), "{url}: {m}");
    }
    // Every primitive Redlock does not offer says why.
    let set = conformance::testkit::redis::redlock();
    let c = client(&set.url()).await;
    for e in [
        c.elections().err().unwrap(),
        c.barriers().err().unwrap(),
        c.limiter().err().unwrap(),
        c.semaphores().err().unwrap(),
        c.rw_locks().err().unwrap(),
        c.queues().err().unwrap(),
    ] {
        let m = e.to_string();
        assert!(
            matches!(e, Error::Unsupported { reason, .. } if !reason.is_empty()),
            "{m}"
        );
        assert!(m.contains("use "), "{m}");
    }
}

/// Four clients contend for one lock, each through proxies of its own, and
/// each is cut off from a different master in turn (so two clients can
/// each reach a quorum-sized set of masters at once, the sets overlapping
/// in one master). Never two valid holders at once; every holder's fenced
/// writes are accepted (tokens rose in grant order); work goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_two_holders_while_clients_are_cut_off_from_different_masters() {
    let set = RedlockMasters::start(3);
    const CLIENTS: usize = 4;
    let mut proxies: Vec<Vec<FaultProxy>> = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let p: Vec<FaultProxy> = set
            .masters()
            .iter()
            .map(|m| {
                let p = FaultProxy::start(m.port());
                // A partition as TCP sees it: no stream with a hole in it.
                p.close_after_loss(true);
                p
            })
            .collect();
        let hosts: Vec<String> = p
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.port()))
            .collect();
        let url = format!(
            "redlock://{}?timeout=300ms&connect_timeout=1s",
            hosts.join(",")
        );
        clients.push(client(&url).await);
        proxies.push(p);
    }
    let proxies = Arc::new(proxies);
    let resource = Arc::new(FencedResource::new());
    let grants = Arc::new(std::sync::Mutex::new(Vec::<Grant>::new()));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let end = Instant::now() + Duration::from_secs(10);

    // The fault schedule: every 2 s, client k is cut off from master
    // (k + round) % 3 and the others are healed.
    let faults = {
        let proxies = proxies.clone();
        tokio::spawn(async move {
            let mut round = 0;
            while Instant::now() < end {
                for (k, p) in proxies.iter().enumerate() {
                    for (m, proxy) in p.iter().enumerate() {
                        if m == (k + round) % 3 {
                            proxy.blackhole();
                        } else {
                            proxy.heal();
                        }
                    }
                }
                round += 1;
                sleep(Duration::from_millis(2000)).await;
            }
            for p in proxies.iter() {
                for proxy in p {
                    proxy.heal();
                }
            }
        })
    };
    let mut tasks = Vec::new();
    for (k, c) in clients.iter().enumerate() {
        let (c, resource, grants) = (c.clone(), resource.clone(), grants.clone());
        let (inside, overlaps) = (inside.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            let locks = c.locks().unwrap();
            let mut held = 0;
            while Instant::now() < end {
                let asked = Instant::now();
                let g = match locks
                    .acquire("contended", SHORT, Duration::from_secs(3))
                    .await
                {
                    Ok(g) => g,
                    Err(e) if e.is_retryable() => continue,
                    Err(e) => panic!("client {k}: {e}"),
                };
                let token = g.fencing_token().get();
                let granted = Instant::now();
                let valid_until = granted + g.remaining();
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                let read = resource.read(k, token).unwrap_or(0);
                sleep(Duration::from_millis(3)).await;
                let ok = g.is_valid();
                inside.fetch_sub(1, Ordering::SeqCst);
                if ok {
                    resource.write(k, token, read, read + 1);
                }
                held += 1;
                // Valid until the release is sent (or the deadline).
                grants.lock().unwrap().push(Grant {
                    client: k,
                    token,
                    asked,
                    granted,
                    valid_until: valid_until.min(Instant::now()),
                });
                let _ = g.release().await;
            }
            held
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    faults.await.unwrap();
    let grants = grants.lock().unwrap().clone();
    let violations = check_lock_history(&grants, &resource.log());
    assert!(violations.is_empty(), "{violations:#?}");
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    // Safety is the point here; liveness is poor while every client is
    // cut off from some master (a release that cannot reach a master
    // leaves the claim there for its TTL, and split votes wait out the
    // unreachable master's call timeout): 7 to 9 grants in 10 s were seen.
    assert!(total >= 3, "only {total} grants in 10 s");
    let accepted = resource
        .log()
        .iter()
        .filter(|a| {
            matches!(
                a,
                conformance::faults::history::Access::Write {
                    accepted: false,
                    ..
                }
            )
        })
        .count();
    assert_eq!(
        accepted, 0,
        "a holder's fenced write was refused: tokens did not rise in grant order"
    );
    eprintln!("{total} grants, {} accesses", resource.log().len());
}

/// A release (and a revoke) returns once a quorum of masters released:
/// a master that does not answer (blackholed) costs the caller nothing,
/// not its call timeout, and the lock is free for the next client at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_does_not_wait_for_an_unreachable_master() {
    let set = RedlockMasters::start_behind_proxies(3);
    let url = format!("{}?timeout=2s", set.url());
    let (a, b) = (client(&url).await, client(&url).await);
    let g = a
        .locks()
        .unwrap()
        .try_acquire("unreachable", TTL)
        .await
        .unwrap();
    let g = g.expect("a free lock");
    let l = a.leases().unwrap().grant("unreachable", TTL).await.unwrap();
    let l = l.expect("a free lease");
    set.proxy(2).blackhole();
    let t = Instant::now();
    g.release().await.unwrap();
    l.revoke().await.unwrap();
    let took = t.elapsed();
    assert!(
        took < Duration::from_millis(1500),
        "release + revoke took {took:?}"
    );
    set.proxy(2).heal();
    // Masters 0 and 1 are free: a quorum for the next client.
    let next = b
        .locks()
        .unwrap()
        .acquire("unreachable", TTL, Duration::from_secs(5))
        .await;
    next.expect("the next client gets the lock")
        .release()
        .await
        .unwrap();
}
