//! Replies lost and attempts delayed in the network: a retry after a lost
//! grant is counted once, a retry after a lost queued reply keeps one
//! place, and a late attempt after a timed-out acquire or a release takes
//! no place and no permit.

use crate::common;
use std::time::Duration;

use common::{SEC, eventually, granted};
use conformance::testkit::proxy::{FaultProxy, Mode};
use conformance::testkit::redis::RedisServer;
use coord_core::{Error, OwnerToken, Semaphore};
use coord_redis::{RedisBackend, RedisOptions};
use tokio::time::sleep;

use super::{MS, att, backend, hget, is_held, req};

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
        .try_acquire("lost", o.step(), &req(2, 3, 30 * SEC, true))
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
            .try_acquire("lost", other.step(), &req(1, 3, 30 * SEC, false))
            .await
            .unwrap(),
    );
    assert!(is_held(
        &direct
            .try_acquire("lost", third.step(), &req(1, 3, 30 * SEC, false))
            .await
            .unwrap()
    ));
    // A lost release reply: the retry says "not held", the permits came
    // back exactly once.
    // `o` had unanswered calls, so the caller's book has its releases
    // mark (`coord_core::late`).
    let marking = || coord_core::Step {
        mark: true,
        ..o.step()
    };
    proxy.set(Mode::DropReplies);
    assert!(via.release("lost", marking()).await.is_err());
    proxy.heal();
    assert_eq!(hget(&server, state, "held").as_deref(), Some("1"));
    let again = eventually("release retry", || async {
        via.release("lost", marking()).await
    })
    .await;
    assert!(!again, "released twice");
    assert_eq!(hget(&server, state, "held").as_deref(), Some("1"));
    assert!(direct.release("lost", other.step()).await.unwrap());
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
            .try_acquire("lostq", h.step(), &req(2, 3, 30 * SEC, false))
            .await
            .unwrap(),
    );
    proxy.set(Mode::DropReplies);
    assert!(
        via.try_acquire("lostq", w.step(), &req(2, 3, 30 * SEC, true))
            .await
            .is_err()
    );
    proxy.heal();
    assert!(is_held(
        &direct
            .try_acquire("lostq", behind.step(), &req(1, 3, 30 * SEC, true))
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
    assert!(direct.release("lostq", h.step()).await.unwrap());
    assert!(is_held(
        &direct
            .try_acquire("lostq", OwnerToken::random().step(), &req(2, 3, SEC, false))
            .await
            .unwrap()
    ));
    granted(eventually("w", || att(&via, "lostq", w, req(2, 3, 30 * SEC, true))).await);
    granted(
        direct
            .try_acquire("lostq", behind.step(), &req(1, 3, 30 * SEC, true))
            .await
            .unwrap(),
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
            .try_acquire("ghost", holder.step(), &req(1, 1, 60 * SEC, false))
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
    assert!(direct.release("ghost", holder.step()).await.unwrap());
    let zcard = server.command(&["ZCARD", queue]).as_int();
    let p = sems.try_acquire("ghost", 1, 10 * SEC).await.unwrap();
    assert!(
        p.is_some(),
        "every permit is free and nobody waits, yet a single attempt is refused \
         (queue entries: {zcard:?}: the timed-out waiter's place came back)"
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
    let (a, _) = common::until_answered("the warm-up attempt", || {
        via.try_acquire("warm", warm.step(), &r)
    })
    .await;
    granted(a);
    let (released, tries) =
        common::until_answered("the warm-up release", || via.release("warm", warm.step())).await;
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
