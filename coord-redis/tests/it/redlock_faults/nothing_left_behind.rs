//! Cancelled and refused acquires leave no claim on any master: acquire
//! futures dropped mid-flight, refused `try_acquire`s (also one whose call
//! to a master timed out), and no late grant after a refusal.

use std::time::Duration;

use conformance::testkit::redis::{RedisServer, RedlockMasters};
use conformance::testkit::wait::{holds_within, until};
use tokio::time::{Instant, sleep, timeout};

use super::{Frozen, client, coord_keys, live_claims, ready};

/// Acquire futures dropped mid-flight, again and again (tiny time limits):
/// `Locks::acquire` promises that what a dropped attempt was granted is
/// released in the background, so right after, another client takes the
/// lock (its TTL, 30 s, is far away); and no live claim is left on any
/// master.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_acquires_leave_nothing_behind() {
    let set = RedlockMasters::start(3);
    let url = set.url();
    let (a, b) = (client(&url).await, client(&url).await);
    ready(&set, &[&a, &b]).await;
    let locks = a.locks().unwrap();
    let (mut granted, mut dropped) = (0, 0);
    let mut left = Vec::new();
    // Rounds of 100 dropped attempts, until a claim is left (or 1000).
    for round in 0..10u64 {
        for i in 0..100u64 {
            let limit = Duration::from_micros((i * 37 + round * 11) % 2500);
            match timeout(
                limit,
                locks.acquire("cancelled", Duration::from_secs(30), Duration::ZERO),
            )
            .await
            {
                Ok(Ok(g)) => {
                    granted += 1;
                    g.release().await.unwrap();
                }
                Ok(Err(_)) => {}
                Err(_) => dropped += 1,
            }
        }
        // What the dropped attempts were granted is released in the
        // background: give it 5 s, well within the claims' 30 s TTL (a
        // claim never released is still there to be seen).
        let live = || {
            set.masters()
                .iter()
                .enumerate()
                .map(|(i, m)| (i, live_claims(m, "cancelled")))
                .filter(|(_, v)| !v.is_empty())
                .collect::<Vec<_>>()
        };
        holds_within(Duration::from_secs(5), || async { live().is_empty() }).await;
        left = live();
        if !left.is_empty() {
            break;
        }
    }
    let g = b
        .locks()
        .unwrap()
        .try_acquire("cancelled", Duration::from_secs(1))
        .await
        .unwrap();
    assert!(
        left.is_empty() && g.is_some(),
        "after {dropped} dropped acquires ({granted} completed): another client got the \
         lock: {}; live claims left (master, [(key, value, TTL ms)]): {left:?}",
        g.is_some()
    );
}

/// A `try_acquire` refused (the lock held by another client) leaves no
/// claim of its own on any master; after the holder releases, no live
/// claim is left at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_try_acquire_leaves_nothing_behind() {
    let set = RedlockMasters::start(3);
    let (a, b) = (client(&set.url()).await, client(&set.url()).await);
    ready(&set, &[&a, &b]).await;
    let g = a
        .locks()
        .unwrap()
        .try_acquire("refused", Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    for _ in 0..20 {
        assert!(
            b.locks()
                .unwrap()
                .try_acquire("refused", Duration::from_secs(10))
                .await
                .unwrap()
                .is_none()
        );
    }
    // One claim on each master, the same (the holder's, with its token):
    // the refused attempts added none and changed none.
    let claims: Vec<Vec<(String, String, i64)>> = set
        .masters()
        .iter()
        .map(|m| live_claims(m, "refused"))
        .collect();
    for c in &claims {
        // Key and owner (a master that answered late may show its own
        // token for a moment, until it is set to the grant's).
        let kv = |c: &Vec<(String, String, i64)>| -> Vec<(String, String)> {
            c.iter()
                .map(|(k, v, _)| (k.clone(), v.split(':').next().unwrap().to_string()))
                .collect()
        };
        assert_eq!(kv(c), kv(&claims[0]), "{claims:?}");
        assert_eq!(c.len(), 1, "{claims:?}");
    }
    g.release().await.unwrap();
    // The release returns once a quorum answered: the last master's may
    // still be on its way. Well within the 10 s TTL, so a claim the
    // release missed is still there to be seen.
    for (i, m) in set.masters().iter().enumerate() {
        let gone = holds_within(Duration::from_secs(3), || async {
            live_claims(m, "refused").is_empty()
        })
        .await;
        assert!(
            gone.is_some(),
            "master {i}: {:?}",
            live_claims(m, "refused")
        );
    }
}

/// How many scripts `m` has run (`EVALSHA`).
fn script_calls(m: &RedisServer) -> i64 {
    m.info("commandstats", "cmdstat_evalsha")
        .split(',')
        .find_map(|f| f.strip_prefix("calls="))
        .map_or(0, |n| n.parse().unwrap())
}

/// A `try_acquire` refused by two masters that hold the lock, while the
/// third master (which lost the claim: as after a restart without data,
/// or a freeze past its TTL) is slower than the decision: its late grant
/// for the refused attempt's owner must be undone. Kept ("it counts for
/// this owner's next attempt"), it would be a ghost claim living its
/// whole TTL (20 s here), since a `try_acquire`'s owner never attempts
/// again, and after the holder released and one other master stopped
/// (one of three: tolerated), nobody could take the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_try_acquire_leaves_no_late_grant() {
    let set = RedlockMasters::start_behind_proxies(3);
    let url = format!("{}?timeout=1s&connect_timeout=5s", set.url());
    let (a, b, c) = (client(&url).await, client(&url).await, client(&url).await);
    ready(&set, &[&a, &b, &c]).await;
    let ttl = Duration::from_secs(20);
    let g = a
        .locks()
        .unwrap()
        .try_acquire("ghost", ttl)
        .await
        .unwrap()
        .unwrap();
    // Master 0 loses the claim, and is slower than the other two.
    for k in coord_keys(&set.masters()[0]) {
        set.masters()[0].command(&["DEL", &k]);
    }
    set.proxy(0).latency(Duration::from_millis(100));
    let before = script_calls(&set.masters()[0]);
    assert!(
        b.locks()
            .unwrap()
            .try_acquire("ghost", ttl)
            .await
            .unwrap()
            .is_none()
    );
    // The refused attempt reached master 0 (its script ran there); a late
    // grant there must then be undone, well within the claim's 20 s TTL.
    until(
        "the refused attempt reached master 0",
        Duration::from_secs(10),
        || async { script_calls(&set.masters()[0]) > before },
    )
    .await;
    holds_within(Duration::from_secs(5), || async {
        live_claims(&set.masters()[0], "ghost").is_empty()
    })
    .await;
    let ghosts = live_claims(&set.masters()[0], "ghost");
    set.proxy(0).heal();
    g.release().await.unwrap();
    set.masters()[1].stop();
    let t = Instant::now();
    let got = c
        .locks()
        .unwrap()
        .acquire("ghost", Duration::from_secs(5), Duration::from_secs(2))
        .await;
    assert!(
        got.is_ok() && ghosts.is_empty(),
        "the lock released, one master of three stopped: another client got {:?} after \
         {:?}; master 0 held, after the refused try_acquire: {ghosts:?}",
        got.map(|g| g.fencing_token()),
        t.elapsed()
    );
}

/// A `try_acquire` refused while its call to one master is held in the
/// network past the call timeout: the held copy lands after the holder
/// released. It must not leave a claim there (for its whole TTL): with
/// another master then down, nobody could take the free lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_try_acquire_whose_call_timed_out_leaves_nothing_behind() {
    use conformance::testkit::proxy::FaultProxy;
    let set = RedlockMasters::start(3);
    let ms = set.masters();
    let proxy = FaultProxy::start(ms[0].port());
    let slow_url = format!(
        "redlock://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}?timeout=200ms",
        proxy.port(),
        ms[1].port(),
        ms[2].port()
    );
    let (a, b) = (client(&set.url()).await, client(&slow_url).await);
    // b's connection to master 0 up and answering within its 200 ms: a
    // master still connecting, or slow a moment ago (a warm-up answered
    // late on a loaded machine), is skipped by the next attempt, whose call
    // to it would then never be sent. So warm up until one probe reached
    // master 0 and was answered quickly (after a slow one, past the skip).
    let mut warm = false;
    for _ in 0..20 {
        proxy.watch(b"warm-up-probe");
        let t = std::time::Instant::now();
        let _ = b.locks().unwrap().inspect("warm-up-probe").await;
        if proxy.seen() >= 1 && t.elapsed() < Duration::from_millis(100) {
            warm = true;
            break;
        }
        sleep(Duration::from_millis(1100)).await;
    }
    assert!(warm, "b never reached master 0 quickly through the proxy");
    let g = a
        .locks()
        .unwrap()
        .try_acquire("timed-out-refused", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    proxy.deliver_late(
        |chunk| chunk.windows(17).any(|w| w == b"timed-out-refused"),
        Duration::from_millis(1500),
        Duration::from_millis(300),
    );
    let refused = b
        .locks()
        .unwrap()
        .try_acquire("timed-out-refused", Duration::from_secs(30))
        .await
        .unwrap();
    assert!(refused.is_none(), "granted beside the holder");
    // Masters 1 and 2 refused: the attempt may be answered before its call
    // to master 0 reaches the proxy (later still on a loaded machine).
    until(
        "b's call to master 0 held",
        Duration::from_secs(5),
        || async { proxy.held() == 1 },
    )
    .await;
    g.release().await.unwrap();
    until(
        "the held call delivered",
        Duration::from_secs(5),
        || async { proxy.delivered() >= 1 },
    )
    .await;
    sleep(Duration::from_millis(500)).await;
    // (The owner's mark, which refused the copy, is not a claim.)
    let left: Vec<_> = live_claims(&ms[0], "timed-out-refused")
        .into_iter()
        .filter(|(k, _, _)| !k.contains(":left:"))
        .collect();
    assert!(
        left.is_empty(),
        "the refused attempt's late copy left a claim on master 0: {left:?}"
    );
    // With master 2 frozen, the free lock can still be taken.
    let frozen = Frozen::pause(&ms[2]);
    let got = a
        .locks()
        .unwrap()
        .acquire(
            "timed-out-refused",
            Duration::from_secs(5),
            Duration::from_secs(3),
        )
        .await;
    drop(frozen);
    assert!(got.is_ok(), "the free lock could not be taken: {got:?}");
}
