//! Masters restarted during a hold: without their data (the other two
//! keep the lock exclusive), and persistent masters (`appendonly`) killed
//! and restarted.

use std::time::Duration;

use conformance::testkit::redis::RedlockMasters;
use tokio::time::{Instant, sleep};

use super::{client, ready};

/// One master restarted without its data during a hold: the other two
/// still hold the claim, so nobody else gets it (the docs: exclusion holds
/// while fewer than a quorum lose their data). Two restarted: another
/// client gets it while the first guard is still valid, as the docs warn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_restarted_without_their_data_during_a_hold() {
    let set = RedlockMasters::start(3);
    let url = format!("{}?timeout=300ms&connect_timeout=5s", set.url());
    let (a, b) = (client(&url).await, client(&url).await);
    ready(&set, &[&a, &b]).await;
    let ttl = Duration::from_secs(20);
    let g = a
        .locks()
        .unwrap()
        .try_acquire("restarted", ttl)
        .await
        .unwrap()
        .unwrap();
    set.masters()[0].restart();
    sleep(Duration::from_millis(1200)).await;
    // Calls on the connections the restart broke may fail once.
    let mut refused = 0;
    while refused < 3 {
        // A short TTL: a refused attempt can leave a late grant of its own
        // on the restarted master (see
        // `a_refused_try_acquire_leaves_no_late_grant`); let it end soon.
        let short = Duration::from_millis(300);
        match b.locks().unwrap().try_acquire("restarted", short).await {
            Ok(None) => refused += 1,
            Ok(Some(_)) => panic!("granted to another client with one master restarted"),
            Err(e) if e.is_retryable() => {}
            Err(e) => panic!("{e}"),
        }
        sleep(Duration::from_millis(300)).await;
    }
    set.masters()[1].restart();
    sleep(Duration::from_millis(1200)).await;
    let mut g2 = None;
    let mut seen = Vec::new();
    let t = Instant::now();
    while g2.is_none() && t.elapsed() < Duration::from_secs(6) {
        match b.locks().unwrap().try_acquire("restarted", ttl).await {
            Ok(g) => g2 = g,
            Err(e) if e.is_retryable() => seen.push(format!("{:?}: {e}", t.elapsed())),
            Err(e) => panic!("{e}"),
        }
        sleep(Duration::from_millis(200)).await;
    }
    eprintln!("granted after {:?}; errors before: {seen:?}", t.elapsed());
    let g2 = g2.expect("with a majority restarted empty, the lock is granted again");
    // The documented price: both guards valid at once.
    assert!(g.is_valid() && g2.is_valid());
    // And the fencing token does not tell them apart the wrong way round.
    assert!(g2.fencing_token() > g.fencing_token());
}

/// With `appendonly yes` / `appendfsync always` (as the docs advise), a
/// majority of masters killed with SIGKILL and started again during a
/// hold keep the claim: nobody else gets the lock, the holder still
/// releases it, and later tokens (locks and fencing) are higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_masters_killed_during_a_hold_keep_exclusion() {
    let set = RedlockMasters::start_behind_proxies(3);
    let url = format!("{}?timeout=500ms&connect_timeout=5s", set.url());
    let (a, b) = (client(&url).await, client(&url).await);
    ready(&set, &[&a, &b]).await;
    let ttl = Duration::from_secs(20);
    let fence = a.fencing().unwrap().next("aof-fence").await.unwrap();
    let g = a
        .locks()
        .unwrap()
        .try_acquire("aof", ttl)
        .await
        .unwrap()
        .unwrap();
    for m in &set.masters()[..2] {
        m.kill();
    }
    for m in &set.masters()[..2] {
        m.start_again();
    }
    // Calls on the connections the kill broke may fail once; then every
    // answer is "held".
    let mut refused = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while refused < 3 {
        assert!(Instant::now() < deadline, "never refused after the restart");
        match b.locks().unwrap().try_acquire("aof", ttl).await {
            Ok(None) => refused += 1,
            Ok(Some(g2)) => panic!(
                "granted to another client ({}) after a majority of persistent masters \
                 restarted; the holder's guard valid: {}",
                g2.fencing_token(),
                g.is_valid()
            ),
            Err(e) if e.is_retryable() => sleep(Duration::from_millis(200)).await,
            Err(e) => panic!("{e}"),
        }
    }
    let first = g.fencing_token();
    // The holder's own connections to the killed masters broke too: let
    // it notice (its first calls on them fail) before it releases, see
    // `release_after_a_connection_blip_frees_the_lock` for what happens
    // otherwise.
    for _ in 0..2 {
        let _ = a.locks().unwrap().inspect("aof").await;
    }
    g.release().await.unwrap();
    let g2 = b
        .locks()
        .unwrap()
        .acquire("aof", ttl, Duration::from_secs(3))
        .await
        .unwrap();
    assert!(g2.fencing_token() > first);
    g2.release().await.unwrap();
    let after = b.fencing().unwrap().next("aof-fence").await.unwrap();
    assert!(after > fence, "{fence} then {after}");
}
