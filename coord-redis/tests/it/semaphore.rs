//! Redis semaphores beyond the shared cases: what stays in Redis (nothing
//! for an idle name), a killed waiter's place lapsing, wake-ups published
//! only to the waiters a release can grant, the request count of an
//! uncontended cycle, and the ten semaphore cases in the PHP layout.

use crate::common;
use std::time::Duration;

use common::{SEC, granted, unique};
use conformance::testkit::redis::{self as kit, RedisServer};
use coord_core::{Attempt, OwnerToken, PermitRequest, Semaphore};
use coord_redis::{Layout, QUEUE_ENTRY_TTL, RedisBackend, RedisOptions};
use tokio::time::{Instant, sleep, timeout};

const MS: Duration = Duration::from_millis(1);

/// The keys `server` holds, without those whose TTL ran out but that
/// active expiry has not reaped yet (`DBSIZE` counts them for a while,
/// longer on a loaded machine; `KEYS` leaves them out).
fn live_keys(server: &RedisServer) -> i64 {
    match server.command(&["KEYS", "*"]) {
        kit::Resp::Array(Some(items)) => items.len() as i64,
        other => panic!("KEYS: {other:?}"),
    }
}

/// How many times the server ran `cmd` (scripts' calls included).
fn calls(server: &RedisServer, cmd: &str) -> i64 {
    server
        .info("commandstats", &format!("cmdstat_{cmd}"))
        .split(',')
        .find_map(|f| f.strip_prefix("calls="))
        .map_or(0, |n| n.parse().unwrap())
}

fn req(permits: u32, total: u32, ttl: Duration, queue: bool) -> PermitRequest {
    PermitRequest {
        permits,
        total,
        ttl,
        queue,
    }
}

fn held(a: Attempt) -> Duration {
    match a {
        Attempt::Held { expires_in } => expires_in.expect("a refused attempt says how long"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

async fn backend(server: &RedisServer) -> RedisBackend {
    RedisBackend::connect(RedisOptions::new(&server.url()))
        .await
        .expect("connect")
}

#[tokio::test]
async fn an_idle_semaphore_leaves_nothing_in_redis() {
    let server = RedisServer::start();
    let b = backend(&server).await;
    let base = live_keys(&server);
    let (x, y, z) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let short = 300 * MS;

    // Released by hand: nothing left at once.
    granted(
        b.try_acquire("idle", x.step(), &req(1, 2, 10 * SEC, false))
            .await
            .unwrap(),
    );
    assert!(live_keys(&server) > base);
    assert!(b.release("idle", x.step()).await.unwrap());
    assert_eq!(
        live_keys(&server),
        base,
        "a release of the last grant leaves keys"
    );

    // A refused single attempt leaves no queue place; a waiting one does,
    // and its release (the core's cleanup after a timeout) removes it.
    granted(
        b.try_acquire("idle", x.step(), &req(2, 2, short, false))
            .await
            .unwrap(),
    );
    held(
        b.try_acquire("idle", y.step(), &req(1, 2, short, false))
            .await
            .unwrap(),
    );
    let queue = "coord:semaphore:{idle}:queue";
    assert_eq!(server.command(&["ZCARD", queue]).as_int(), Some(0));
    held(
        b.try_acquire("idle", z.step(), &req(1, 2, short, true))
            .await
            .unwrap(),
    );
    assert_eq!(server.command(&["ZCARD", queue]).as_int(), Some(1));
    assert!(
        !b.release("idle", z.step()).await.unwrap(),
        "z held no grant"
    );
    assert_eq!(server.command(&["ZCARD", queue]).as_int(), Some(0));

    // Left to expire: every key goes with the grant's TTL.
    sleep(short + 100 * MS).await;
    assert_eq!(
        live_keys(&server),
        base,
        "an expired grant left keys behind"
    );
    assert!(
        !b.extend("idle", x.step(), 10 * SEC).await.unwrap(),
        "resurrected"
    );

    // A token ahead of the server clock outlives the grant on the rest of
    // its lead only, and the next grant still rises above it.
    let t = granted(
        b.try_acquire("idle", x.step(), &req(1, 2, short, false))
            .await
            .unwrap(),
    );
    let ahead = t + 400_000;
    server.command(&["HSET", "coord:semaphore:{idle}", "last", &ahead.to_string()]);
    let t2 = granted(
        b.try_acquire("idle", y.step(), &req(1, 2, short, false))
            .await
            .unwrap(),
    );
    assert_eq!(t2, ahead + 1);
    assert!(b.release("idle", x.step()).await.unwrap());
    assert!(b.release("idle", y.step()).await.unwrap());
    assert_eq!(
        live_keys(&server),
        base + 1,
        "the last token is kept while ahead"
    );
    let t3 = granted(
        b.try_acquire("idle", x.step(), &req(1, 2, short, false))
            .await
            .unwrap(),
    );
    assert_eq!(t3, t2 + 1);
    assert!(b.release("idle", x.step()).await.unwrap());
    sleep(500 * MS).await;
    assert_eq!(live_keys(&server), base, "the kept token outlived its lead");
}

/// A waiter killed while queued (it never attempts again, and nobody
/// removes its place) holds up the requests behind it for
/// [`QUEUE_ENTRY_TTL`], then its place lapses and they are granted.
#[tokio::test]
async fn a_killed_waiters_place_lapses_after_the_queue_ttl() {
    let server = RedisServer::start();
    let b = backend(&server).await;
    let coord = backend(&server).await.into_coord();
    let sems = coord.semaphores().unwrap();
    let (holder, killed) = (OwnerToken::random(), OwnerToken::random());
    granted(
        b.try_acquire("lapse", holder.step(), &req(1, 2, 120 * SEC, false))
            .await
            .unwrap(),
    );
    // The killed waiter asked for 2, so the 1 free permit does not serve it.
    let queued_at = Instant::now();
    let hint = held(
        b.try_acquire("lapse", killed.step(), &req(2, 2, 120 * SEC, true))
            .await
            .unwrap(),
    );
    assert!(hint <= coord_redis::QUEUE_REFRESH, "hint {hint:?}");
    assert!(
        sems.try_acquire("lapse", 2, 10 * SEC)
            .await
            .unwrap()
            .is_none(),
        "a later request overtook the queued one"
    );
    let p = sems
        .acquire("lapse", 2, 10 * SEC, QUEUE_ENTRY_TTL + 10 * SEC)
        .await
        .expect("granted once the killed waiter's place lapsed");
    let waited = queued_at.elapsed();
    assert!(
        waited + 100 * MS >= QUEUE_ENTRY_TTL,
        "the killed waiter's place lapsed after {waited:?}"
    );
    assert!(
        waited <= QUEUE_ENTRY_TTL + 2 * SEC,
        "granted only {waited:?} after the place was taken"
    );
    p.release().await.unwrap();
    assert!(b.release("lapse", holder.step()).await.unwrap());
    assert_eq!(live_keys(&server), 0, "keys left after the last release");
}

/// A release publishes one wake-up per queued waiter it makes grantable
/// (here the head, not the one behind it, which would not fit beside it),
/// never one without waiters, and never the same waiter twice; an
/// uncontended acquire + release is 2 requests.
#[tokio::test]
async fn wake_ups_go_only_to_waiters_that_can_be_granted() {
    let server = RedisServer::start();
    let (b, w) = (backend(&server).await, backend(&server).await);
    let (holder, first, second) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let name = unique("wake");
    let pubs = calls(&server, "publish");
    let evals = calls(&server, "evalsha");
    let coord = backend(&server).await.into_coord();
    let sems = coord.semaphores().unwrap();
    for _ in 0..5 {
        let p = sems.try_acquire(&name, 3, 10 * SEC).await.unwrap().unwrap();
        p.release().await.unwrap();
    }
    assert_eq!(
        calls(&server, "evalsha"),
        evals + 10,
        "2 requests per cycle"
    );
    assert_eq!(
        calls(&server, "publish"),
        pubs,
        "nobody waited, yet published"
    );

    granted(
        b.try_acquire(&name, holder.step(), &req(3, 3, 10 * SEC, false))
            .await
            .unwrap(),
    );
    let (wf, ws) = (
        Semaphore::subscribe(&w, &name, &first).await.unwrap(),
        Semaphore::subscribe(&w, &name, &second).await.unwrap(),
    );
    let (nf, ns) = (wf.notified(), ws.notified());
    tokio::pin!(nf, ns);
    nf.as_mut().enable();
    ns.as_mut().enable();
    held(
        w.try_acquire(&name, first.step(), &req(2, 3, 10 * SEC, true))
            .await
            .unwrap(),
    );
    held(
        w.try_acquire(&name, second.step(), &req(2, 3, 10 * SEC, true))
            .await
            .unwrap(),
    );
    assert_eq!(calls(&server, "publish"), pubs);

    assert!(b.release(&name, holder.step()).await.unwrap());
    timeout(SEC, &mut nf).await.expect("the head is woken");
    assert!(
        timeout(300 * MS, &mut ns).await.is_err(),
        "woke a waiter that does not fit beside the head"
    );
    assert_eq!(calls(&server, "publish"), pubs + 1);
    // The one behind refreshes its place: the head is not woken again.
    held(
        w.try_acquire(&name, second.step(), &req(2, 3, 10 * SEC, true))
            .await
            .unwrap(),
    );
    assert_eq!(calls(&server, "publish"), pubs + 1, "woke the head twice");
    granted(
        w.try_acquire(&name, first.step(), &req(2, 3, 10 * SEC, true))
            .await
            .unwrap(),
    );
    assert!(w.release(&name, first.step()).await.unwrap());
    timeout(SEC, &mut ns)
        .await
        .expect("the next in line is woken");
    assert_eq!(calls(&server, "publish"), pubs + 2);
    granted(
        w.try_acquire(&name, second.step(), &req(2, 3, 10 * SEC, true))
            .await
            .unwrap(),
    );
    assert!(w.release(&name, second.step()).await.unwrap());
    assert_eq!(live_keys(&server), 0);
}

async fn php_coord() -> coord_core::Coord {
    RedisBackend::connect(RedisOptions::new(&kit::url()).layout(Layout::Php))
        .await
        .expect("connect")
        .into_coord()
}

/// Semaphores are offered in [`Layout::Php`] too (the PHP key names
/// include no semaphore keys; they live under the prefix, as leases do):
/// the shared semaphore cases run there as well.
macro_rules! php_layout_cases {
    ($($case:ident),* $(,)?) => {
        mod php_layout {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let f = conformance::Factory::new(super::php_coord);
                    conformance::cases::$case(&f).await;
                }
            )*
        }
    };
}

php_layout_cases!(
    semaphore_never_more_than_total_holders_under_load,
    semaphore_crashed_holders_permit_returns_after_ttl,
    semaphore_multi_permit_acquire_is_all_or_none,
    semaphore_fencing_tokens_rise,
    semaphore_stale_permit_cannot_release_or_extend,
    semaphore_waiter_is_woken_by_notification,
    semaphore_bad_input_is_rejected_and_writes_nothing,
    semaphore_permits_total_mismatch_is_an_error,
    semaphore_fifo_head_is_not_overtaken_by_smaller_requests,
    semaphore_watchdog_keeps_permit_and_stops_at_release,
);
