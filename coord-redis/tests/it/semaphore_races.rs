//! Redis semaphores under races: many clients with cancellations, lost
//! replies, cancelled queue heads, the total binding while only waiters
//! are queued, tokens across a restart without persistence, grant expiry
//! racing other attempts, names with braces, and a writer taking every
//! permit while readers stream in.

use crate::common;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use common::{SEC, eventually, granted};
use conformance::testkit::proxy::{FaultProxy, Mode};
use conformance::testkit::redis::RedisServer;
use conformance::testkit::wait::{holds_within, until};
use coord_core::{Attempt, Error, OwnerToken, PermitRequest, Semaphore};
use coord_redis::{RedisBackend, RedisOptions};
use tokio::time::{Instant, sleep, timeout};

const MS: Duration = Duration::from_millis(1);

fn req(permits: u32, total: u32, ttl: Duration, queue: bool) -> PermitRequest {
    PermitRequest {
        permits,
        total,
        ttl,
        queue,
    }
}

fn is_held(a: &Attempt) -> bool {
    matches!(a, Attempt::Held { .. })
}

/// `b.try_acquire` with everything owned or borrowed from outside (for
/// retry closures).
async fn att(
    b: &RedisBackend,
    name: &str,
    o: OwnerToken,
    r: PermitRequest,
) -> coord_core::Result<Attempt> {
    b.try_acquire(name, &o, &r).await
}

async fn backend(url: &str) -> RedisBackend {
    RedisBackend::connect(RedisOptions::new(url))
        .await
        .expect("connect")
}

fn hget(server: &RedisServer, key: &str, field: &str) -> Option<String> {
    server
        .command(&["HGET", key, field])
        .as_str()
        .map(str::to_string)
}

fn dbsize(server: &RedisServer) -> i64 {
    server.command(&["DBSIZE"]).as_int().unwrap()
}

/// A tiny deterministic PRNG (no `rand` among the dev-dependencies).
struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// 32 tasks on 4 clients take 1, 2 or 3 of 4 permits, some waiting long,
/// some cancelled mid-wait by a short `timeout` dropping the future. The
/// permits held (counted on the client side, between grant and release)
/// never exceed the total; every task finishes (no waiter is stranded);
/// afterwards the whole total is grantable at once, nothing is queued and
/// the keys are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_mixed_sizes_with_cancellations_stay_within_total() {
    const TOTAL: u32 = 4;
    const TASKS: u64 = 32;
    const ROUNDS: u64 = 12;
    let server = RedisServer::start();
    let mut coords = Vec::new();
    for _ in 0..4 {
        coords.push(backend(&server.url()).await.into_coord());
    }
    let inside = Arc::new(AtomicI64::new(0));
    let most = Arc::new(AtomicI64::new(0));
    let grants = Arc::new(AtomicU64::new(0));
    let cancels = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let sem = coords[i as usize % 4].semaphores().unwrap();
        let (inside, most, grants, cancels) = (
            inside.clone(),
            most.clone(),
            grants.clone(),
            cancels.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ ((i + 1) * 0x1234_5677));
            for _ in 0..ROUNDS {
                let n = 1 + rng.below(3) as u32;
                let cancel_after = Duration::from_millis(5 + rng.below(120));
                let cancel = rng.below(3) == 0;
                let fut = sem.acquire_many("mixed", n, TOTAL, 5 * SEC, 20 * SEC);
                let permit = if cancel {
                    match timeout(cancel_after, fut).await {
                        Ok(p) => p.expect("acquire"),
                        Err(_) => {
                            cancels.fetch_add(1, Ordering::SeqCst);
                            continue;
                        }
                    }
                } else {
                    fut.await.expect("a waiting acquire was stranded")
                };
                let now = inside.fetch_add(n as i64, Ordering::SeqCst) + n as i64;
                most.fetch_max(now, Ordering::SeqCst);
                assert!(now <= TOTAL as i64, "{now} permits held of {TOTAL}");
                grants.fetch_add(1, Ordering::SeqCst);
                sleep(Duration::from_millis(rng.below(15))).await;
                inside.fetch_sub(n as i64, Ordering::SeqCst);
                permit.release().await.expect("release");
            }
        }));
    }
    let started = Instant::now();
    for t in tasks {
        timeout(120 * SEC, t)
            .await
            .expect("a task never finished: a waiter is stranded")
            .unwrap();
    }
    let took = started.elapsed();
    assert!(most.load(Ordering::SeqCst) <= TOTAL as i64);
    assert!(cancels.load(Ordering::SeqCst) > 0, "nothing was cancelled");
    assert!(grants.load(Ordering::SeqCst) > TASKS * ROUNDS / 2);
    // The cancelled waiters' cleanups run in the background. A place left
    // behind stays in the ZSET (it lapses after QUEUE_ENTRY_TTL, 30 s, and
    // only a script on the name prunes it, not this read).
    let queue = "coord:semaphore:{mixed}:queue";
    let emptied = holds_within(10 * SEC, || async {
        server.command(&["ZCARD", queue]).as_int() == Some(0)
    })
    .await;
    assert!(
        emptied.is_some(),
        "cancelled waiters left their places behind: {:?} in the queue",
        server.command(&["ZCARD", queue]).as_int()
    );
    let sem = coords[0].semaphores().unwrap();
    let all = sem
        .try_acquire_many("mixed", TOTAL, TOTAL, 5 * SEC)
        .await
        .unwrap()
        .expect("all permits should be free once everyone finished");
    all.release().await.unwrap();
    // A cancelled acquire whose attempt was in flight leaves a marker (so
    // its late copy takes nothing) for 10 s, and the name's state hash with
    // it; nothing else, and nothing without a TTL. Under load many
    // cancellations land mid-call; on an idle machine few do.
    let left = server.command(&["KEYS", "*"]);
    let conformance::testkit::redis::Resp::Array(Some(keys)) = left else {
        panic!("KEYS: {left:?}")
    };
    for k in keys {
        let conformance::testkit::redis::Resp::Bulk(Some(k)) = k else {
            panic!("a key: {k:?}")
        };
        let k = String::from_utf8_lossy(&k).to_string();
        assert!(
            [
                "coord:semaphore:{mixed}",
                "coord:semaphore:{mixed}:left",
                "coord:semaphore:{mixed}:left-at"
            ]
            .contains(&k.as_str()),
            "key left behind: {k}"
        );
        let ttl = server.command(&["PTTL", &k]).as_int().unwrap();
        assert!(
            ttl > 0 && ttl <= 30_000,
            "{k} left behind with PTTL {ttl} ms (only late-attempt markers, for at most 30 s)"
        );
    }
    eprintln!(
        "mixed: {} grants, {} cancels in {took:?}",
        grants.load(Ordering::SeqCst),
        cancels.load(Ordering::SeqCst)
    );
}

/// A grant whose reply is lost: the same owner's retry gets the same
/// token, and the permits are counted once (the state hash says 2 held,
/// and another owner still gets the 1 remaining permit, not 0).
#[tokio::test]
async fn lost_grant_reply_then_retry_same_token_counted_once() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let via = RedisBackend::connect(
        RedisOptions::new(&format!("redis://127.0.0.1:{}", proxy.port())).timeout(300 * MS),
    )
    .await
    .expect("connect through the proxy");
    let direct = backend(&server.url()).await;
    let (o, other, third) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    proxy.set(Mode::DropReplies);
    let lost = via
        .try_acquire("lost", &o, &req(2, 3, 30 * SEC, true))
        .await;
    assert!(lost.is_err(), "the reply should be lost: {lost:?}");
    proxy.heal();
    let state = "coord:semaphore:{lost}";
    assert_eq!(hget(&server, state, "held").as_deref(), Some("2"));
    let first_token: u64 = hget(&server, &format!("{state}:holders"), &o.to_hex())
        .expect("the lost attempt was applied")
        .split(':')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let retry = eventually("retry", || att(&via, "lost", o, req(2, 3, 30 * SEC, true))).await;
    assert_eq!(granted(retry), first_token, "the retry got another token");
    assert_eq!(
        hget(&server, state, "held").as_deref(),
        Some("2"),
        "the retry counted its permits twice"
    );
    granted(
        direct
            .try_acquire("lost", &other, &req(1, 3, 30 * SEC, false))
            .await
            .unwrap(),
    );
    assert!(is_held(
        &direct
            .try_acquire("lost", &third, &req(1, 3, 30 * SEC, false))
            .await
            .unwrap()
    ));
    // A lost release reply: the retry says "not held", the permits came
    // back exactly once.
    proxy.set(Mode::DropReplies);
    assert!(via.release("lost", &o).await.is_err());
    proxy.heal();
    assert_eq!(hget(&server, state, "held").as_deref(), Some("1"));
    let again = eventually("release retry", || async { via.release("lost", &o).await }).await;
    assert!(!again, "released twice");
    assert_eq!(hget(&server, state, "held").as_deref(), Some("1"));
    assert!(direct.release("lost", &other).await.unwrap());
    // `o` had unanswered calls, so its release left a marker against late
    // copies of them (`coord_core::late`): only the marker and the state
    // hash remain, and only while the marker lives (30 s).
    let mut left: Vec<String> = match server.command(&["KEYS", "*"]) {
        conformance::testkit::redis::Resp::Array(Some(v)) => {
            v.iter().map(|k| k.as_str().unwrap().to_string()).collect()
        }
        v => panic!("KEYS answered {v:?}"),
    };
    left.sort();
    assert_eq!(
        left,
        [
            state.to_string(),
            format!("{state}:left"),
            format!("{state}:left-at")
        ]
    );
    for k in &left {
        let pttl = server.command(&["PTTL", k]).as_int().unwrap();
        assert!(
            (1..=30_000).contains(&pttl),
            "{k} lives {pttl} ms after the name went idle"
        );
    }
}

/// A lost reply of a refused, queued attempt: the retry keeps the same
/// place (no second arrival, `qsum` counted once), so the waiter behind
/// is not pushed back and a single attempt sees the right amount queued.
#[tokio::test]
async fn lost_reply_of_a_queued_attempt_keeps_one_place() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let via = RedisBackend::connect(
        RedisOptions::new(&format!("redis://127.0.0.1:{}", proxy.port())).timeout(300 * MS),
    )
    .await
    .unwrap();
    let direct = backend(&server.url()).await;
    let (h, w, behind) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    granted(
        direct
            .try_acquire("lostq", &h, &req(2, 3, 30 * SEC, false))
            .await
            .unwrap(),
    );
    proxy.set(Mode::DropReplies);
    assert!(
        via.try_acquire("lostq", &w, &req(2, 3, 30 * SEC, true))
            .await
            .is_err()
    );
    proxy.heal();
    assert!(is_held(
        &direct
            .try_acquire("lostq", &behind, &req(1, 3, 30 * SEC, true))
            .await
            .unwrap()
    ));
    let r = eventually("retry", || att(&via, "lostq", w, req(2, 3, 30 * SEC, true))).await;
    assert!(is_held(&r));
    let state = "coord:semaphore:{lostq}";
    assert_eq!(hget(&server, state, "qsum").as_deref(), Some("3"));
    assert_eq!(
        server
            .command(&["ZCARD", "coord:semaphore:{lostq}:queue"])
            .as_int(),
        Some(2)
    );
    // FIFO survives: after the holder leaves, w (first) is granted, and
    // `behind` (1 permit) fits beside it.
    assert!(direct.release("lostq", &h).await.unwrap());
    assert!(is_held(
        &direct
            .try_acquire("lostq", &OwnerToken::random(), &req(2, 3, SEC, false))
            .await
            .unwrap()
    ));
    granted(eventually("w", || att(&via, "lostq", w, req(2, 3, 30 * SEC, true))).await);
    granted(
        direct
            .try_acquire("lostq", &behind, &req(1, 3, 30 * SEC, true))
            .await
            .unwrap(),
    );
}

/// The head of the queue (asking for every permit) is cancelled by a
/// dropped future; the small request behind it must not wait for the
/// head's place to lapse (30 s): the core's cleanup removes the place and
/// the store wakes the one behind as soon as a permit comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_queue_head_does_not_block_the_queue() {
    let server = RedisServer::start();
    let (c1, c2, c3) = (
        backend(&server.url()).await.into_coord(),
        backend(&server.url()).await.into_coord(),
        backend(&server.url()).await.into_coord(),
    );
    let (s1, s2, s3) = (
        c1.semaphores().unwrap(),
        c2.semaphores().unwrap(),
        c3.semaphores().unwrap(),
    );
    let holder = s1.acquire("head", 3, 60 * SEC, SEC).await.unwrap();
    let head = tokio::spawn(async move {
        // Cancelled after 300 ms while queued.
        timeout(300 * MS, s2.acquire_many("head", 3, 3, 60 * SEC, 60 * SEC))
            .await
            .is_err()
    });
    sleep(100 * MS).await;
    let start = Instant::now();
    let behind = tokio::spawn(async move { s3.acquire("head", 3, 60 * SEC, 60 * SEC).await });
    assert!(head.await.unwrap(), "the head was granted?");
    // The one behind needs 1 of 3 with 2 free, but the head (3) was ahead.
    sleep(200 * MS).await;
    let p = timeout(3 * SEC, behind)
        .await
        .expect("the waiter behind a cancelled head is still blocked after 3 s")
        .unwrap()
        .unwrap();
    assert!(start.elapsed() < 3 * SEC);
    p.release().await.unwrap();
    holder.release().await.unwrap();
}

/// While only queued waiters exist (the holder expired), the total still
/// binds: another total is `InvalidArgument{permits_total}` and changes
/// nothing (the place, the total, the queued sum stay), for a single
/// attempt and a waiting one alike.
#[tokio::test]
async fn total_binds_while_only_waiters_are_queued() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let (h, w, x) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    granted(
        b.try_acquire("onlyq", &h, &req(2, 2, 200 * MS, false))
            .await
            .unwrap(),
    );
    assert!(is_held(
        &b.try_acquire("onlyq", &w, &req(2, 2, 30 * SEC, true))
            .await
            .unwrap()
    ));
    sleep(300 * MS).await;
    let state = "coord:semaphore:{onlyq}";
    let before = server.command(&["HGETALL", state]);
    for queue in [false, true] {
        match b
            .try_acquire("onlyq", &x, &req(1, 5, 30 * SEC, queue))
            .await
        {
            Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, "permits_total"),
            other => panic!("expected InvalidArgument(permits_total), got {other:?}"),
        }
    }
    assert_eq!(hget(&server, state, "total").as_deref(), Some("2"));
    assert_eq!(
        server
            .command(&["ZCARD", "coord:semaphore:{onlyq}:queue"])
            .as_int(),
        Some(1)
    );
    assert_eq!(
        hget(&server, &format!("{state}:queue-permits"), &x.to_hex()),
        None
    );
    let _ = before;
    // The queued one is granted with its own total; then idle again, a new
    // total is accepted.
    granted(
        b.try_acquire("onlyq", &w, &req(2, 2, 30 * SEC, true))
            .await
            .unwrap(),
    );
    assert!(b.release("onlyq", &w).await.unwrap());
    granted(
        b.try_acquire("onlyq", &x, &req(1, 5, 30 * SEC, false))
            .await
            .unwrap(),
    );
    assert!(b.release("onlyq", &x).await.unwrap());
}

/// Tokens keep rising across a restart that loses everything (no
/// persistence), across a restart from an older snapshot (`SAVE`, then
/// more grants, then restart), and across a `DEBUG SLEEP` that lets every
/// grant expire server-side.
#[tokio::test]
async fn tokens_rise_across_restart_snapshot_and_debug_sleep() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let o = OwnerToken::random();
    let mut last = 0u64;
    for _ in 0..50 {
        let t = granted(
            b.try_acquire("tok", &OwnerToken::random(), &req(1, 1000, 30 * SEC, false))
                .await
                .unwrap(),
        );
        assert!(t > last);
        last = t;
    }
    server.command(&["SAVE"]);
    for _ in 0..50 {
        let t = granted(
            b.try_acquire("tok", &OwnerToken::random(), &req(1, 1000, 30 * SEC, false))
                .await
                .unwrap(),
        );
        assert!(t > last);
        last = t;
    }
    server.restart(); // loads the older snapshot
    let t = granted(
        eventually("after snapshot restart", || {
            att(&b, "tok", o, req(1, 1000, 30 * SEC, false))
        })
        .await,
    );
    assert!(t > last, "token {t} after restart is not above {last}");
    last = t;
    // Now a restart that loses everything (an empty snapshot, then kill).
    server.command(&["FLUSHALL"]);
    server.command(&["SAVE"]);
    server.kill();
    server.start_again();
    let t = granted(
        eventually("after empty restart", || {
            att(
                &b,
                "tok",
                OwnerToken::random(),
                req(1, 1000, 30 * SEC, false),
            )
        })
        .await,
    );
    assert!(t > last, "token {t} after restart is not above {last}");
    last = t;
    // Every permit taken by a short grant that expires while the server is
    // frozen (SIGSTOP; DEBUG SLEEP is disabled on this build).
    granted(
        b.try_acquire(
            "tok",
            &OwnerToken::random(),
            &req(999, 1000, 100 * MS, false),
        )
        .await
        .unwrap(),
    );
    server.pause();
    std::thread::sleep(Duration::from_millis(300));
    server.resume();
    let t = granted(
        eventually("after pause", || {
            att(
                &b,
                "tok",
                OwnerToken::random(),
                req(999, 1000, 30 * SEC, false),
            )
        })
        .await,
    );
    assert!(t > last, "token {t} after the pause is not above {last}");
    let _ = o;
}

/// A grant's TTL ends while other owners keep attempting: whenever another
/// owner is granted the single permit, the first one's extend and release
/// fail (never two live holders of one permit), and the new token is above
/// the old.
#[tokio::test]
async fn grant_expiry_racing_other_attempts_never_double_grants() {
    let server = RedisServer::start();
    let (a, b) = (backend(&server.url()).await, backend(&server.url()).await);
    let mut double = Vec::new();
    for round in 0..60u64 {
        let name = format!("race{round}");
        let x = OwnerToken::random();
        let t1 = granted(
            a.try_acquire(&name, &x, &req(1, 1, 20 * MS, false))
                .await
                .unwrap(),
        );
        let y = OwnerToken::random();
        let started = Instant::now();
        // x extends with a tiny TTL for a varying while, then stops; y
        // attempts all along: both race the expiry.
        let extend_for = Duration::from_millis(round % 40);
        loop {
            let long = req(1, 1, 30 * SEC, false);
            let (ext, att) = if started.elapsed() < extend_for {
                let (e, a2) =
                    tokio::join!(a.extend(&name, &x, 3 * MS), b.try_acquire(&name, &y, &long));
                (Some(e.unwrap()), a2.unwrap())
            } else {
                (None, b.try_acquire(&name, &y, &long).await.unwrap())
            };
            if let Attempt::Granted(t2) = att {
                assert!(t2.get() > t1, "token did not rise");
                // x must be gone now.
                if a.extend(&name, &x, 30 * SEC).await.unwrap() {
                    double.push(round);
                }
                break;
            }
            if ext == Some(false) {
                // x's grant ended; y must get it at once.
                granted(
                    b.try_acquire(&name, &y, &req(1, 1, 30 * SEC, false))
                        .await
                        .unwrap(),
                );
                assert!(!a.extend(&name, &x, 30 * SEC).await.unwrap(), "resurrected");
                break;
            }
            assert!(
                started.elapsed() < 5 * SEC,
                "y never got the expired permit"
            );
        }
        assert!(b.release(&name, &y).await.unwrap());
        assert!(!a.release(&name, &x).await.unwrap());
    }
    assert!(
        double.is_empty(),
        "two holders of one permit in rounds {double:?}"
    );
    assert_eq!(dbsize(&server), 0);
}

/// Names with braces, colons and a name that is a prefix of another are
/// distinct semaphores with their keys in one slot each, and a waiter on
/// such a name is woken (not just polled): with a 60 s poll interval it
/// is granted within a second of the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_with_braces_are_distinct_and_woken() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let names = ["{a}", "a", "{a", "a}", "}{", "x{y}z", "a:b", "a:b:c", "{}"];
    let mut owners = Vec::new();
    for n in names {
        let o = OwnerToken::random();
        granted(
            b.try_acquire(n, &o, &req(1, 1, 30 * SEC, false))
                .await
                .unwrap(),
        );
        owners.push(o);
    }
    // Each is full now, independently of the others.
    for n in names {
        assert!(is_held(
            &b.try_acquire(n, &OwnerToken::random(), &req(1, 1, 30 * SEC, false))
                .await
                .unwrap()
        ));
    }
    // All keys of one name in one slot.
    let keys = match server.command(&["KEYS", "coord:semaphore:*"]) {
        conformance::testkit::redis::Resp::Array(Some(items)) => items
            .into_iter()
            .map(|k| k.as_str().unwrap().to_string())
            .collect::<Vec<_>>(),
        other => panic!("KEYS: {other:?}"),
    };
    // Redis Cluster's hash tag: between the first `{` and the first `}`
    // after it, if not empty.
    let tag = |k: &str| -> String {
        let open = k.find('{').expect("a hash tag");
        let close = k[open + 1..].find('}').expect("a closed hash tag") + open + 1;
        assert!(close > open + 1, "empty hash tag in {k}");
        k[open + 1..close].to_string()
    };
    let mut groups = std::collections::HashMap::<String, usize>::new();
    for k in &keys {
        *groups.entry(tag(k)).or_default() += 1;
    }
    assert_eq!(
        groups.len(),
        names.len(),
        "names share a slot tag: {keys:?}"
    );
    assert!(
        groups.values().all(|&n| n == 3),
        "a held name's state, grants and holders keys do not share one tag: {keys:?}"
    );
    for (n, o) in names.iter().zip(&owners) {
        let slow = backend(&server.url())
            .await
            .into_coord()
            .with_poll_interval(60 * SEC);
        let sem = slow.semaphores().unwrap();
        let name = n.to_string();
        let w = tokio::spawn(async move {
            let start = Instant::now();
            let p = sem.acquire(&name, 1, 30 * SEC, 20 * SEC).await.unwrap();
            let took = start.elapsed();
            p.release().await.unwrap();
            took
        });
        sleep(300 * MS).await;
        let released = Instant::now();
        assert!(b.release(n, o).await.unwrap());
        let took = w.await.unwrap();
        assert!(
            released.elapsed() < 2 * SEC && took < 3 * SEC,
            "waiter on {n:?} not woken (took {took:?})"
        );
    }
    assert_eq!(dbsize(&server), 0);
}

/// A writer asking for all MAX_PERMITS permits while 1-permit readers
/// stream in continuously (8 tasks, each re-acquiring at once): FIFO means
/// the writer is granted once the readers ahead of it release (well within
/// a second or two), readers that came later wait behind it, and while the
/// writer holds, no reader holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_taking_every_permit_is_not_starved_by_readers() {
    const TOTAL: u32 = coord_core::validate::MAX_PERMITS;
    let server = RedisServer::start();
    let readers_in = Arc::new(AtomicI64::new(0));
    let writer_in = Arc::new(AtomicI64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut readers = Vec::new();
    for _ in 0..8 {
        let sem = backend(&server.url())
            .await
            .into_coord()
            .semaphores()
            .unwrap();
        let (readers_in, writer_in, stop) = (readers_in.clone(), writer_in.clone(), stop.clone());
        readers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let p = sem.acquire("rw", TOTAL, 10 * SEC, 30 * SEC).await.unwrap();
                readers_in.fetch_add(1, Ordering::SeqCst);
                assert_eq!(
                    writer_in.load(Ordering::SeqCst),
                    0,
                    "reader beside the writer"
                );
                sleep(30 * MS).await;
                readers_in.fetch_sub(1, Ordering::SeqCst);
                p.release().await.unwrap();
                n += 1;
            }
            n
        }));
    }
    sleep(500 * MS).await;
    let wsem = backend(&server.url())
        .await
        .into_coord()
        .semaphores()
        .unwrap();
    for _ in 0..3 {
        let start = Instant::now();
        let w = wsem
            .acquire_many("rw", TOTAL, TOTAL, 10 * SEC, 10 * SEC)
            .await
            .expect("the writer was starved");
        let took = start.elapsed();
        writer_in.fetch_add(1, Ordering::SeqCst);
        assert_eq!(
            readers_in.load(Ordering::SeqCst),
            0,
            "writer beside readers"
        );
        sleep(100 * MS).await;
        writer_in.fetch_sub(1, Ordering::SeqCst);
        w.release().await.unwrap();
        assert!(took < 5 * SEC, "the writer waited {took:?}");
        sleep(200 * MS).await;
    }
    stop.store(true, Ordering::SeqCst);
    let mut total = 0;
    for r in readers {
        total += timeout(30 * SEC, r).await.expect("reader stuck").unwrap();
    }
    assert!(total > 20, "readers made little progress: {total}");
}

/// How many times the server ran `cmd` (scripts' calls included).
fn calls(server: &RedisServer, cmd: &str) -> i64 {
    server
        .info("commandstats", &format!("cmdstat_{cmd}"))
        .split(',')
        .find_map(|f| f.strip_prefix("calls="))
        .map_or(0, |n| n.parse().unwrap())
}

/// Redis commands the scripts ran so far that walk the queue entry by
/// entry (HGET of a waiter's permits, ZSCORE of its place's expiry).
fn walk_calls(server: &RedisServer) -> i64 {
    calls(server, "hget") + calls(server, "zscore")
}

/// `n` one-permit waiters queue behind a holder of every permit. Returns
/// the per-entry commands (HGET + ZSCORE) the server ran for (one renewal
/// by the waiter at the back, the release of the big grant, the mean per
/// grant while the queue drains in order).
async fn queue_costs(
    server: &RedisServer,
    b: &RedisBackend,
    name: &str,
    n: usize,
) -> (i64, i64, f64) {
    const TOTAL: u32 = coord_core::validate::MAX_PERMITS;
    let big = OwnerToken::random();
    granted(
        b.try_acquire(name, &big, &req(TOTAL, TOTAL, 600 * SEC, false))
            .await
            .unwrap(),
    );
    let owners: Vec<OwnerToken> = (0..n).map(|_| OwnerToken::random()).collect();
    for o in &owners {
        assert!(is_held(
            &b.try_acquire(name, o, &req(1, TOTAL, 600 * SEC, true))
                .await
                .unwrap()
        ));
    }
    let w0 = walk_calls(server);
    let last = owners.last().unwrap();
    assert!(is_held(
        &b.try_acquire(name, last, &req(1, TOTAL, 600 * SEC, true))
            .await
            .unwrap()
    ));
    let w1 = walk_calls(server);
    let started = Instant::now();
    assert!(b.release(name, &big).await.unwrap());
    let release_took = started.elapsed();
    let w2 = walk_calls(server);
    let started = Instant::now();
    for o in &owners {
        granted(
            b.try_acquire(name, o, &req(1, TOTAL, 600 * SEC, true))
                .await
                .unwrap(),
        );
    }
    let drain_took = started.elapsed();
    let w3 = walk_calls(server);
    for o in &owners {
        assert!(b.release(name, o).await.unwrap());
    }
    let per_grant = (w3 - w2) as f64 / n as f64;
    eprintln!(
        "n={n}: renewal at the back {} calls; release of the big grant {} calls ({release_took:?}); \
         {per_grant:.1} calls per grant (draining took {drain_took:?})",
        w1 - w0,
        w2 - w1
    );
    (w1 - w0, w2 - w1, per_grant)
}

/// A step's cost on the server must not grow with the queue length for
/// a waiter near the head. Were each grant's `wake()` to walk the whole
/// grantable prefix from the head again (one HGET per entry, a ZRANGE per
/// 16), although every entry in it was woken already, draining a queue of
/// n waiters that all fit would cost O(n²) commands inside Redis (which
/// serves nobody else meanwhile); and were a waiter at rank r to renew its
/// place with O(r) commands (HGET + ZSCORE of every place ahead), n
/// polling waiters would cost O(n²) per poll round.
#[tokio::test]
async fn per_step_cost_does_not_grow_with_the_queue() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let (renew_s, _, grant_s) = queue_costs(&server, &b, "cost-small", 100).await;
    let (renew_l, _, grant_l) = queue_costs(&server, &b, "cost-large", 1600).await;
    assert!(
        grant_l < grant_s * 4.0 + 8.0,
        "a grant runs {grant_s:.1} per-entry commands with 100 queued, {grant_l:.1} with 1600"
    );
    assert!(
        renew_l < renew_s * 4 + 8,
        "a renewal at the back runs {renew_s} per-entry commands with 100 queued, {renew_l} with 1600"
    );
}

/// A waiting acquire times out while one of its attempts is still in
/// flight on a connection the client gave up on (the request is delayed
/// past the call timeout, as by a TCP retransmission). The core removes
/// the place (a release) before reporting the timeout, and the late
/// attempt lands after that release. It must not queue the owner again:
/// that would be a ghost place nobody renews or removes, which blocks
/// every request on the name (even a single attempt with every permit
/// free) for QUEUE_ENTRY_TTL (30 s), whatever the grants' TTLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_attempt_after_a_timed_out_acquire_leaves_no_place() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let via = RedisBackend::connect(
        RedisOptions::new(&format!("redis://127.0.0.1:{}", proxy.port())).timeout(200 * MS),
    )
    .await
    .unwrap()
    .into_coord();
    let direct = backend(&server.url()).await;
    let sems = backend(&server.url())
        .await
        .into_coord()
        .semaphores()
        .unwrap();
    let holder = OwnerToken::random();
    granted(
        direct
            .try_acquire("ghost", &holder, &req(1, 1, 60 * SEC, false))
            .await
            .unwrap(),
    );
    // The first attempt is delayed 1.5 s in the network; later traffic is not.
    proxy.latency(1500 * MS);
    let waiter = tokio::spawn({
        let s = via.semaphores().unwrap();
        async move { s.acquire("ghost", 1, 60 * SEC, 600 * MS).await }
    });
    sleep(50 * MS).await;
    proxy.latency(Duration::ZERO);
    let r = waiter.await.unwrap();
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "expected a timeout: {r:?}"
    );
    let queue = "coord:semaphore:{ghost}:queue";
    assert_eq!(
        server.command(&["ZCARD", queue]).as_int(),
        Some(0),
        "the timed-out acquire's release did not remove its place"
    );
    // Let the delayed attempt land.
    sleep(1500 * MS).await;
    assert!(direct.release("ghost", &holder).await.unwrap());
    let zcard = server.command(&["ZCARD", queue]).as_int();
    let p = sems.try_acquire("ghost", 1, 10 * SEC).await.unwrap();
    assert!(
        p.is_some(),
        "every permit is free and nobody waits, yet a single attempt is refused \
         (queue entries: {zcard:?}: the timed-out waiter's place came back)"
    );
}

/// The state hash of a busy name is lost, then the first script to run is
/// an extend that finds nothing to extend: the hash it rebuilds must still
/// get the name's lifetime, or it outlives every grant (a key with no TTL
/// is never evicted under `volatile-*` either).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_hash_rebuilt_by_a_refused_extend_expires_with_the_name() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let h = OwnerToken::random();
    granted(
        b.try_acquire("rebuilt", &h, &req(1, 2, 10 * SEC, false))
            .await
            .unwrap(),
    );
    server.command(&["DEL", "coord:semaphore:{rebuilt}"]);
    let stranger = OwnerToken::random();
    assert!(!b.extend("rebuilt", &stranger, 10 * SEC).await.unwrap());
    let pttl = server
        .command(&["PTTL", "coord:semaphore:{rebuilt}"])
        .as_int()
        .unwrap();
    assert!(
        pttl > 0,
        "the rebuilt state hash has PTTL {pttl} (-1: it never expires)"
    );
}

/// An acquire's first attempt is delayed in the network past the call
/// timeout; its retry is granted at once and the permit released right
/// away; then the delayed attempt lands. It must not take the permit again
/// for nobody (until its TTL, 60 s): its owner had an unanswered attempt,
/// so its release leaves a mark that refuses attempts sent before it
/// (`coord_core::late`), even though it finds the owner holding (a
/// release that leaves no mark when the owner holds lets the late copy be
/// granted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_attempt_after_a_release_takes_no_permit() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let via = RedisBackend::connect(
        RedisOptions::new(&format!("redis://127.0.0.1:{}", proxy.port())).timeout(200 * MS),
    )
    .await
    .unwrap();
    let sems = backend(&server.url())
        .await
        .into_coord()
        .semaphores()
        .unwrap();
    // Warm the connection, so the delayed attempt is one message. One
    // owner: its retry of an unanswered warm-up attempt is that attempt.
    let warm = OwnerToken::random();
    let r = req(1, 1, 10 * SEC, false);
    let (a, _) =
        common::until_answered("the warm-up attempt", || via.try_acquire("warm", &warm, &r)).await;
    granted(a);
    let (released, tries) =
        common::until_answered("the warm-up release", || via.release("warm", &warm)).await;
    assert!(
        released || tries > 1,
        "the warm-up grant was not held at its release"
    );
    let via = via.into_coord();
    proxy.latency(1500 * MS);
    let acquire = tokio::spawn({
        let s = via.semaphores().unwrap();
        async move { s.acquire("late-grant", 1, 60 * SEC, 3 * SEC).await }
    });
    sleep(50 * MS).await;
    proxy.latency(Duration::ZERO);
    let permit = acquire.await.unwrap().expect("the retry was not granted");
    permit.release().await.unwrap();
    // Let the delayed attempt land.
    sleep(1700 * MS).await;
    let grants = server
        .command(&["ZCARD", "coord:semaphore:{late-grant}:grants"])
        .as_int();
    let p = sems.try_acquire("late-grant", 1, 10 * SEC).await.unwrap();
    assert!(
        p.is_some(),
        "the only permit is free and nobody waits, yet a single attempt is refused \
         (grants: {grants:?}: the released owner's late attempt took it)"
    );
}

/// A reference model of the contract (no expiry: every TTL is long): a
/// FIFO semaphore with `total` binding while anybody holds or waits.
#[derive(Default)]
struct Model {
    total: u32,
    holders: Vec<(usize, u32, u64)>,
    queue: Vec<(usize, u32)>,
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Granted,
    Held,
    BadTotal,
}

impl Model {
    fn attempt(&mut self, o: usize, p: u32, total: u32, queue: bool) -> (Outcome, Option<u64>) {
        if self.holders.is_empty() && self.queue.is_empty() {
            self.total = total;
        } else if self.total != total {
            return (Outcome::BadTotal, None);
        }
        if let Some(h) = self.holders.iter().find(|h| h.0 == o) {
            return (Outcome::Granted, Some(h.2));
        }
        let pos = self.queue.iter().position(|w| w.0 == o);
        let ahead: u32 = self.queue[..pos.unwrap_or(self.queue.len())]
            .iter()
            .map(|w| w.1)
            .sum();
        let held: u32 = self.holders.iter().map(|h| h.1).sum();
        if ahead + p <= self.total - held {
            if let Some(i) = pos {
                self.queue.remove(i);
            }
            self.holders.push((o, p, 0));
            (Outcome::Granted, None)
        } else {
            if queue && pos.is_none() {
                self.queue.push((o, p));
            }
            (Outcome::Held, None)
        }
    }
    fn release(&mut self, o: usize) -> bool {
        let had = self.holders.iter().any(|h| h.0 == o);
        self.holders.retain(|h| h.0 != o);
        self.queue.retain(|w| w.0 != o);
        had
    }
    fn force(&mut self) -> bool {
        let had = !self.holders.is_empty();
        self.holders.clear();
        had
    }
}

/// Thousands of random steps (attempts of 1-3 permits, queueing or not,
/// sometimes with another total; releases; extends; force releases) on
/// Redis and on the reference model agree step by step, and Redis's
/// tokens behave: a fresh grant's token is above every earlier one, a
/// holder's retry gets its own token back.
#[tokio::test]
async fn random_steps_agree_with_a_reference_model() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let owners: Vec<OwnerToken> = (0..10).map(|_| OwnerToken::random()).collect();
    let mut rng = XorShift(0xDEAD_BEEF_1234_5678);
    let mut model = Model::default();
    let mut top = 0u64;
    for step in 0..3000 {
        let o = rng.below(owners.len() as u64) as usize;
        let who = &owners[o];
        match rng.below(20) {
            0..=11 => {
                let p = 1 + rng.below(3) as u32;
                let total = if rng.below(25) == 0 { 4 } else { 5 };
                let queue = rng.below(3) != 0;
                let (want, tok) = model.attempt(o, p, total, queue);
                let got = b
                    .try_acquire("model", who, &req(p, total, 600 * SEC, queue))
                    .await;
                let got_kind = match &got {
                    Ok(Attempt::Granted(_)) => Outcome::Granted,
                    Ok(Attempt::Held { .. }) => Outcome::Held,
                    Err(Error::InvalidArgument { field, .. }) if *field == "permits_total" => {
                        Outcome::BadTotal
                    }
                    Err(e) => panic!("step {step}: {e}"),
                };
                assert_eq!(
                    got_kind, want,
                    "step {step}: owner {o} asks {p} of {total} (queue {queue}); model holders {:?} queue {:?}",
                    model.holders, model.queue
                );
                if let Ok(Attempt::Granted(t)) = got {
                    match tok {
                        Some(prev) => {
                            assert_eq!(t.get(), prev, "step {step}: retry changed the token")
                        }
                        None => {
                            assert!(t.get() > top, "step {step}: token did not rise");
                            top = t.get();
                            model.holders.last_mut().unwrap().2 = t.get();
                        }
                    }
                }
            }
            12..=16 => {
                let want = model.release(o);
                assert_eq!(
                    b.release("model", who).await.unwrap(),
                    want,
                    "step {step}: release"
                );
            }
            17..=18 => {
                let want = model.holders.iter().any(|h| h.0 == o);
                assert_eq!(
                    b.extend("model", who, 600 * SEC).await.unwrap(),
                    want,
                    "step {step}: extend"
                );
            }
            _ => {
                if rng.below(4) == 0 {
                    let want = model.force();
                    assert_eq!(
                        b.force_release("model").await.unwrap(),
                        want,
                        "step {step}: force"
                    );
                }
            }
        }
        if step % 100 == 0 {
            let held: u32 = model.holders.iter().map(|h| h.1).sum();
            let qsum: u32 = model.queue.iter().map(|w| w.1).sum();
            let st = "coord:semaphore:{model}";
            if !(model.holders.is_empty() && model.queue.is_empty()) {
                assert_eq!(
                    hget(&server, st, "held"),
                    Some(held.to_string()),
                    "step {step}: held"
                );
                assert_eq!(
                    hget(&server, st, "qsum"),
                    Some(qsum.to_string()),
                    "step {step}: qsum"
                );
            }
        }
    }
}

/// The server restarts (all data lost) while two permits are held and
/// three waiters queue: the waiters are granted promptly afterwards (the
/// state is gone, so two of them at once), with tokens above the old
/// holders', and the old holders' extends fail (nothing resurrected).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_after_a_restart_that_loses_the_state() {
    let server = RedisServer::start();
    let coord = backend(&server.url()).await.into_coord();
    let sem = coord.semaphores().unwrap();
    let a = sem.acquire("rs", 2, 60 * SEC, SEC).await.unwrap();
    let b2 = sem.acquire("rs", 2, 60 * SEC, SEC).await.unwrap();
    let top = a.fencing_token().get().max(b2.fencing_token().get());
    let inside = Arc::new(AtomicI64::new(0));
    let mut ws = Vec::new();
    for _ in 0..3 {
        let s = backend(&server.url())
            .await
            .into_coord()
            .semaphores()
            .unwrap();
        let inside = inside.clone();
        ws.push(tokio::spawn(async move {
            let p = s.acquire("rs", 2, 60 * SEC, 30 * SEC).await.unwrap();
            let start = Instant::now();
            assert!(inside.fetch_add(1, Ordering::SeqCst) < 2);
            sleep(300 * MS).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            let t = p.fencing_token().get();
            p.release().await.unwrap();
            (t, start)
        }));
    }
    // Each waiter connected and queued (on a loaded machine that takes a
    // while).
    until("the three waiters queued", 10 * SEC, || async {
        server
            .command(&["ZCARD", "coord:semaphore:{rs}:queue"])
            .as_int()
            == Some(3)
    })
    .await;
    server.kill();
    server.start_again();
    let restarted = Instant::now();
    for w in ws {
        let (t, _) = timeout(10 * SEC, w)
            .await
            .expect("a waiter stuck after the restart")
            .unwrap();
        assert!(t > top, "token {t} after the restart is not above {top}");
    }
    assert!(
        restarted.elapsed() < 5 * SEC,
        "waiters took {:?} after the restart",
        restarted.elapsed()
    );
    assert!(
        a.extend(60 * SEC).await.is_err(),
        "an old grant was resurrected"
    );
    drop(b2);
}

/// One of the keys of a busy name is lost (evicted under a `volatile-*`
/// or `allkeys-*` maxmemory policy, every key here having a TTL; simulated
/// with `DEL`). A lock (one key) just ends; a semaphore should at worst
/// lose the grants recorded there, and never wedge. Each key in turn: a
/// holder has 2 of 2 permits (500 ms TTL), a waiter waits for 1, the key
/// goes; the waiter must be granted within its wait, and then the name
/// still admits no more than its total (2 more permits are refused).
///
/// The `holders` hash is the hard case: the cached `held` sum is only
/// decremented through it, so without a repair it stays at `total`, and
/// since a waiting acquire renews its place (which extends every key's
/// TTL), the name would stay full of nothing for as long as anybody
/// waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_key_does_not_wedge_the_semaphore() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let sem = backend(&server.url())
        .await
        .into_coord()
        .semaphores()
        .unwrap();
    for lost in [
        ":holders",
        ":grants",
        "",
        ":queue",
        ":queue-expiry",
        ":queue-permits",
    ] {
        let name = format!("evict{}", lost.replace(':', "-"));
        let base = format!("coord:semaphore:{{{name}}}");
        let h = OwnerToken::random();
        granted(
            b.try_acquire(&name, &h, &req(2, 2, 500 * MS, false))
                .await
                .unwrap(),
        );
        let w = {
            let (sem, name) = (sem.clone(), name.clone());
            tokio::spawn(async move { sem.acquire(&name, 2, 10 * SEC, 5 * SEC).await })
        };
        sleep(100 * MS).await;
        server.command(&["DEL", &format!("{base}{lost}")]);
        let r = w.await.unwrap();
        assert!(
            r.is_ok(),
            "losing `{base}{lost}` wedged the name: {r:?}; held = {:?}, grants {:?}",
            hget(&server, &base, "held"),
            server
                .command(&["ZCARD", &format!("{base}:grants")])
                .as_int()
        );
        let other = OwnerToken::random();
        let again = b
            .try_acquire(&name, &other, &req(2, 2, 10 * SEC, false))
            .await
            .unwrap();
        assert!(
            !matches!(again, Attempt::Granted(_)),
            "after losing `{base}{lost}`, 2 permits of 2 were granted beside the waiter's"
        );
        drop(r);
    }
}
