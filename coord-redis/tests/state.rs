//! What the backend keeps in Redis: one key per claim, a wake-up published
//! only when somebody waits, and nothing left of a name once it has been
//! idle past its TTL, window or the idle grace (a 100,000-name soak).

#[path = "it/common/mod.rs"]
mod common;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{SEC, granted, unique};
use conformance::testkit::redis::RedisServer;
use coord_core::{Algorithm, Attempt, Coord, Lock, OwnerToken, Quota};
use coord_redis::{RedisBackend, RedisOptions};
use futures::StreamExt;

async fn backend_with(server: &RedisServer, grace: Duration) -> RedisBackend {
    RedisBackend::connect(RedisOptions::new(&server.url()).idle_grace(grace))
        .await
        .expect("connect")
}

/// How many times the server ran PUBLISH (scripts' calls included).
fn publishes(server: &RedisServer) -> i64 {
    server
        .info("commandstats", "cmdstat_publish")
        .split(',')
        .find_map(|f| f.strip_prefix("calls="))
        .map_or(0, |n| n.parse().unwrap())
}

fn dbsize(server: &RedisServer) -> i64 {
    server.command(&["DBSIZE"]).as_int().unwrap()
}

#[tokio::test]
async fn a_release_publishes_a_wake_up_only_when_somebody_waits() {
    let server = RedisServer::start();
    let (a, w) = (
        backend_with(&server, SEC).await,
        backend_with(&server, SEC).await,
    );
    let name = unique("pub");
    let (me, them) = (OwnerToken::random(), OwnerToken::random());

    // Nobody waits: acquire + release publish nothing.
    let before = publishes(&server);
    for _ in 0..5 {
        granted(a.try_acquire(&name, me.step(), 10 * SEC).await.unwrap());
        assert!(a.release(&name, me.step()).await.unwrap());
    }
    assert_eq!(publishes(&server), before, "uncontended releases published");

    // A refused attempt without local waiters marks nothing either.
    granted(a.try_acquire(&name, me.step(), 10 * SEC).await.unwrap());
    assert!(matches!(
        w.try_acquire(&name, them.step(), 10 * SEC).await.unwrap(),
        Attempt::Held { .. }
    ));
    assert!(a.release(&name, me.step()).await.unwrap());
    assert_eq!(publishes(&server), before);

    // A refused attempt from a client with a waiter on the name: the
    // release publishes once, and the waiter hears it.
    granted(a.try_acquire(&name, me.step(), 10 * SEC).await.unwrap());
    let waiter = Lock::subscribe(&w, &name, &them).await.unwrap();
    let notified = waiter.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    assert!(matches!(
        w.try_acquire(&name, them.step(), 10 * SEC).await.unwrap(),
        Attempt::Held { .. }
    ));
    // The mark survives a renewal.
    assert!(a.extend(&name, me.step(), 10 * SEC).await.unwrap());
    assert!(a.release(&name, me.step()).await.unwrap());
    assert_eq!(publishes(&server), before + 1);
    tokio::time::timeout(2 * SEC, notified)
        .await
        .expect("the waiter is woken");

    // The next grant starts unmarked.
    granted(a.try_acquire(&name, me.step(), 10 * SEC).await.unwrap());
    assert!(a.release(&name, me.step()).await.unwrap());
    assert_eq!(publishes(&server), before + 1);
}

#[tokio::test]
async fn a_claim_is_one_key_and_a_release_leaves_nothing_once_the_clock_passed_its_token() {
    let server = RedisServer::start();
    let b = backend_with(&server, SEC).await;
    let me = OwnerToken::random();
    let key = "coord:lock:{one-key}";
    let base = dbsize(&server);
    let t1 = granted(b.try_acquire("one-key", me.step(), 10 * SEC).await.unwrap());
    assert_eq!(dbsize(&server), base + 1, "a grant writes one key");
    let value = server.command(&["GET", key]);
    assert_eq!(
        value.as_str().unwrap(),
        format!("{}:{t1}", me.to_hex()),
        "owner and token in the claim's value"
    );
    assert!(b.release("one-key", me.step()).await.unwrap());
    assert_eq!(dbsize(&server), base, "a release deletes the claim");
    let t2 = granted(b.try_acquire("one-key", me.step(), 10 * SEC).await.unwrap());
    assert!(t2 > t1, "the clock keeps tokens rising: {t2} > {t1}");
    assert!(b.release("one-key", me.step()).await.unwrap());

    // A token ahead of the server clock (left by a burst, a clock that
    // stepped back, or a Redlock quorum's token from a master whose clock
    // is ahead): its release leaves `=<token>` until the server clock has
    // passed it (not only for the rest of the TTL, after which the next
    // grant would start again from the clock, below it), and the next
    // grant rises above it.
    let ahead = t2 + 60_000_000;
    server.command(&["SET", key, &format!("={ahead}"), "PX", "400"]);
    let t3 = granted(b.try_acquire("one-key", me.step(), 400 * MS).await.unwrap());
    assert_eq!(t3, ahead + 1);
    assert!(b.release("one-key", me.step()).await.unwrap());
    let value = server.command(&["GET", key]);
    assert_eq!(value.as_str().unwrap(), format!("={t3}"));
    // Released: extend and release see nothing.
    assert!(!b.extend("one-key", me.step(), 10 * SEC).await.unwrap());
    assert!(!b.release("one-key", me.step()).await.unwrap());
    let t4 = granted(b.try_acquire("one-key", me.step(), 400 * MS).await.unwrap());
    assert_eq!(t4, t3 + 1);
    assert!(b.release("one-key", me.step()).await.unwrap());
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Past the claim's 400 ms TTL, the marker is still there: its token
    // is a minute ahead of the clock, and it lasts until the clock is past.
    assert_eq!(dbsize(&server), base + 1, "the marker outlives the TTL");
    let value = server.command(&["GET", key]);
    assert_eq!(value.as_str().unwrap(), format!("={t4}"));
    let pttl = server.command(&["PTTL", key]).as_int().unwrap();
    assert!(
        (55_000..=61_000).contains(&pttl),
        "the marker lasts until the clock passes its token: PTTL {pttl} ms"
    );
    let t5 = granted(b.try_acquire("one-key", me.step(), 400 * MS).await.unwrap());
    assert_eq!(t5, t4 + 1, "tokens still rise after the TTL");
    assert!(b.release("one-key", me.step()).await.unwrap());
    server.command(&["DEL", key]);
    assert_eq!(dbsize(&server), base);

    // A lease reads as not held once revoked, marker or not.
    let lkey = "coord:lease:{w7}";
    granted(
        coord_core::Lease::grant(&b, "w7", me.step(), 10 * SEC)
            .await
            .unwrap(),
    );
    assert!(
        coord_core::Lease::remaining(&b, "w7")
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        coord_core::Lease::revoke(&b, "w7", me.step())
            .await
            .unwrap()
    );
    assert_eq!(coord_core::Lease::remaining(&b, "w7").await.unwrap(), None);
    server.command(&["SET", lkey, &format!("={ahead}"), "PX", "5000"]);
    assert_eq!(coord_core::Lease::remaining(&b, "w7").await.unwrap(), None);
}

/// A barrier whose state was lost (here: `FLUSHALL`, as a restart without
/// persistence does) while a participant waits must not tell that waiter
/// its generation completed when later arrivals complete new generations.
#[tokio::test]
async fn a_waiter_of_a_lost_barrier_generation_never_passes() {
    let server = RedisServer::start();
    let coord = backend_with(&server, 60 * SEC)
        .await
        .into_coord()
        .with_poll_interval(Duration::from_millis(50));
    let barriers = coord.barriers().unwrap();
    let waiting = {
        let barriers = barriers.clone();
        tokio::spawn(async move { barriers.wait("lost", 2, "old", 5 * SEC).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.command(&["FLUSHALL"]);
    // New participants complete three generations of the same barrier.
    for round in 0..3 {
        let (a, b) = (format!("a{round}"), format!("b{round}"));
        let (x, y) = tokio::join!(
            barriers.wait("lost", 2, &a, 5 * SEC),
            barriers.wait("lost", 2, &b, 5 * SEC)
        );
        x.unwrap();
        y.unwrap();
    }
    let r = waiting.await.unwrap();
    assert!(
        r.is_err(),
        "the old waiter was told its lost generation completed: {r:?}"
    );
}

#[tokio::test]
async fn barrier_state_expires_after_the_idle_grace() {
    let server = RedisServer::start();
    let grace = Duration::from_millis(300);
    let coord = backend_with(&server, grace).await.into_coord();
    let barriers = coord.barriers().unwrap();
    let base = dbsize(&server);
    let (x, y) = tokio::join!(
        barriers.wait("g", 2, "p1", 5 * SEC),
        barriers.wait("g", 2, "p2", 5 * SEC)
    );
    let g = x.unwrap();
    assert_eq!(y.unwrap(), g);
    assert!(dbsize(&server) > base);
    tokio::time::sleep(grace + Duration::from_millis(200)).await;
    assert_eq!(dbsize(&server), base, "a completed barrier's state expires");
    // A waiter keeps an open generation alive past the grace by checking.
    let coord = coord.with_poll_interval(Duration::from_millis(50));
    let barriers = coord.barriers().unwrap();
    let first = {
        let barriers = barriers.clone();
        tokio::spawn(async move { barriers.wait("g", 2, "p1", 5 * SEC).await })
    };
    tokio::time::sleep(3 * grace).await;
    let second = barriers.wait("g", 2, "p2", 5 * SEC).await.unwrap();
    let first = first.await.unwrap().unwrap();
    assert_eq!(first, second);
    assert!(first > g, "generations keep rising after the state expired");
}

/// 100,000 distinct names through locks, leases and the limiter (and
/// fewer through fencing sources, elections and barriers): once their TTL,
/// window and idle grace have passed, Redis is back at its key count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_100k_idle_names_leave_nothing_behind() {
    const N: usize = 100_000;
    const SMALL: usize = 5_000;
    let server = RedisServer::start();
    let grace = Duration::from_millis(500);
    let coord: Arc<Coord> = Arc::new(backend_with(&server, grace).await.into_coord());
    let base = dbsize(&server);
    let started = Instant::now();
    let each = |n: usize, f: fn(Arc<Coord>, usize) -> futures::future::BoxFuture<'static, ()>| {
        let coord = coord.clone();
        async move {
            futures::stream::iter(0..n)
                .map(|i| f(coord.clone(), i))
                .buffer_unordered(64)
                .collect::<Vec<()>>()
                .await
        }
    };
    each(N, |c, i| {
        Box::pin(async move {
            let locks = c.locks().unwrap();
            let sent = Instant::now();
            let g = locks.try_acquire(&format!("order:{i}"), 500 * MS).await;
            // Released at once; on a slow machine the release can come
            // after the TTL, when the lock is already free.
            match g.unwrap().expect("free").release().await {
                Ok(()) => {}
                Err(coord_core::Error::NotHeld { .. }) if sent.elapsed() >= 500 * MS => {}
                Err(e) => panic!(
                    "order:{i}: {e} {:?} after the grant was asked for",
                    sent.elapsed()
                ),
            }
        })
    })
    .await;
    each(N, |c, i| {
        Box::pin(async move {
            let leases = c.leases().unwrap();
            let g = leases
                .grant(&format!("worker:{i}"), 500 * MS)
                .await
                .unwrap();
            // Left to expire.
            std::mem::forget(g.expect("free"));
        })
    })
    .await;
    each(N, |c, i| {
        Box::pin(async move {
            let algo = [
                Algorithm::SlidingLog,
                Algorithm::SlidingWindow,
                Algorithm::FixedWindow,
                Algorithm::Gcra,
            ][i % 4];
            let q = Quota::new(10, 500 * MS, algo);
            c.limiter()
                .unwrap()
                .check(&format!("user:{i}"), q)
                .await
                .unwrap();
        })
    })
    .await;
    each(SMALL, |c, i| {
        Box::pin(async move {
            c.fencing().unwrap().next(&format!("db:{i}")).await.unwrap();
            let e = c.elections().unwrap();
            let l = e.try_campaign(&format!("shard:{i}"), "me", 500 * MS).await;
            l.unwrap().expect("free").resign().await.unwrap();
            let b = c.barriers().unwrap();
            b.wait(&format!("step:{i}"), 1, "me", 5 * SEC)
                .await
                .unwrap();
        })
    })
    .await;
    let touched = dbsize(&server) - base;
    eprintln!(
        "touched {} names in {:?}; {touched} keys right after",
        3 * N + 3 * SMALL,
        started.elapsed()
    );
    // Redis expires keys lazily and by sampling; allow it a few seconds
    // to get within 1 % of the names touched.
    let names = (3 * N + 3 * SMALL) as i64;
    let deadline = Instant::now() + 15 * SEC;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let left = dbsize(&server) - base;
        if left * 100 <= names {
            eprintln!("{left} keys left after {:?}", started.elapsed());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} keys are left of {names} idle names, 15 s after their TTL, window and grace"
        );
    }
}

const MS: Duration = Duration::from_millis(1);
