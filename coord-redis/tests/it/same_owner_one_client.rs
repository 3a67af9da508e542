//! One owner's calls racing through ONE client (the raw traits), on the
//! client's record of owners with an unanswered attempt
//! (`coord_core::late::Unanswered`, the backend's `claims_unanswered` and
//! `unanswered`).
//!
//! The release of an owner with an unanswered attempt leaves a mark with
//! its stamp, so a late copy of that attempt (stamped before) takes
//! nothing; then it forgets the owner, but only the record the release
//! saw (`forget` takes `Unanswered::seen`). Were it to forget
//! unconditionally after its round trip, an attempt of the same owner
//! stamped AFTER the release (not covered by its mark) that went
//! unanswered DURING that round trip would lose its record; the owner's
//! next release (after it gave up on that attempt) would then leave no
//! mark, and the attempt's late copy would take the name for nobody until
//! its TTL.
//!
//! The window is forced, not swept: a proxy latency keeps release X in
//! flight (400 ms) while attempt A1, sent after X, is cancelled (its future
//! dropped after 10 ms, as `tokio::time::timeout` around it does; the
//! module docs of `coord_core::late` name a cancelled attempt); A1's
//! request is held by the proxy (`deliver_late`) past the owner's next
//! release Y and then applied. A control phase runs the same calls with X
//! answered before A1 is sent.

use crate::common;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{SEC, unique};
use conformance::claim_kind::ClaimKind as Kind;
use conformance::testkit::proxy::FaultProxy;
use conformance::testkit::redis::RedisServer;
use conformance::testkit::wait::{holds_within, until};
use coord_core::{Attempt, OwnerToken};
use coord_redis::{RedisBackend, RedisOptions};

/// Each way, per chunk: X's round trip is twice this, the window in which
/// A1 is sent and dropped (wide: a loaded machine may pause the test for
/// tens of milliseconds).
const LATENCY: Duration = Duration::from_millis(200);
/// The client's call timeout (far above X's round trip).
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// When A1's connection is cut (after X's reply passed, one LATENCY after
/// A1's match), from A1's match.
const CUT_AFTER: Duration = Duration::from_millis(1000);
/// When A1's held request is applied, from its match (after Y, which
/// starts just after the cut).
const DELAY: Duration = Duration::from_millis(3500);
const TTL: Duration = Duration::from_secs(30);

/// One round on a fresh name; `race`: X still in flight when A1 is
/// dropped (else X answered before A1 is sent). Returns (the holders after
/// A1's late copy landed, another owner's attempt then).
async fn round(
    server: &RedisServer,
    proxy: &FaultProxy,
    c: &Arc<RedisBackend>,
    kind: Kind,
    race: bool,
) -> (Vec<OwnerToken>, OwnerToken, Attempt) {
    let direct = common::backend(&server.url()).await;
    let n: &'static str = Box::leak(unique("rso-late").into_boxed_str());
    let o = OwnerToken::random();
    // A0: an attempt of O dropped before its reply: O is recorded.
    proxy.latency(LATENCY);
    let a0 = tokio::time::timeout(Duration::from_millis(5), kind.attempt(&**c, n, &o, TTL)).await;
    assert!(a0.is_err(), "A0 should be dropped unanswered: {a0:?}");
    // Whatever A0 did has landed (one connection, in order).
    let _ = kind.holders(&**c, n).await;
    // X: O's release, marking O (its record) at X's stamp.
    proxy.watch(n.as_bytes());
    let x = {
        let c = c.clone();
        tokio::spawn(async move { kind.release(&*c, n, &o).await })
    };
    until("X reaching the proxy", 5 * SEC, || async {
        proxy.seen() > 0
    })
    .await;
    if !race {
        x_answered(&x).await;
    }
    // X's request has been read by the proxy: the next request naming n
    // (A1) is held.
    proxy.deliver_late(
        move |b: &[u8]| b.windows(n.len()).any(|w| w == n.as_bytes()),
        DELAY,
        CUT_AFTER,
    );
    let held_at = Instant::now();
    // A1: stamped after X; dropped after 10 ms, unanswered.
    let a1 = tokio::time::timeout(Duration::from_millis(10), kind.attempt(&**c, n, &o, TTL)).await;
    assert!(a1.is_err(), "A1 should be dropped unanswered: {a1:?}");
    if race {
        assert!(
            !x.is_finished(),
            "X answered before A1 was dropped: window missed"
        );
    }
    let xr = x.await.unwrap();
    assert!(xr.is_ok(), "X should be answered: {xr:?}");
    proxy.latency(Duration::ZERO);
    // Y: O's next release, after it gave up on A1 (on a new connection,
    // once A1's is cut).
    // (A1 is matched when the proxy has forwarded X, LATENCY after X.)
    tokio::time::sleep_until((held_at + LATENCY + CUT_AFTER + Duration::from_millis(100)).into())
        .await;
    let deadline = Instant::now() + 3 * SEC;
    let y = loop {
        match kind.release(&**c, n, &o).await {
            Ok(y) => break y,
            Err(e) => {
                assert!(Instant::now() < deadline, "Y never answered: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert!(!y, "Y found nothing (A1 is still held by the proxy)");
    assert!(
        held_at.elapsed() < DELAY,
        "Y ended after A1's copy landed: the round proves nothing"
    );
    // A1's copy lands.
    let landing = held_at + LATENCY + DELAY + 5 * SEC;
    let landed = holds_within(
        landing.saturating_duration_since(Instant::now()),
        || async { proxy.delivered() >= proxy.held() },
    )
    .await;
    assert!(
        landed.is_some(),
        "the held request was not delivered: {:?}",
        proxy.undelivered()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let now = kind.holders(&direct, n).await;
    let other = kind
        .attempt(&direct, n, &OwnerToken::random(), TTL)
        .await
        .unwrap();
    (now, o, other)
}

async fn x_answered(x: &tokio::task::JoinHandle<coord_core::Result<bool>>) {
    let deadline = Instant::now() + 2 * SEC;
    while !x.is_finished() {
        assert!(Instant::now() < deadline, "X never answered");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn late_copy_after_release_race(kind: Kind) {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let c = Arc::new(
        RedisBackend::connect(
            RedisOptions::new(&format!("redis://127.0.0.1:{}", proxy.port())).timeout(CALL_TIMEOUT),
        )
        .await
        .unwrap(),
    );
    // Control: X answered before A1; Y marks O, A1's copy takes nothing.
    let (now, _, other) = round(&server, &proxy, &c, kind, false).await;
    assert!(
        now.is_empty() && matches!(other, Attempt::Granted(_)),
        "{kind:?} control: A1's late copy took the name (holders {now:?}, another owner: {other:?})"
    );
    let held = proxy.held();
    // The race: A1 dropped while X is in flight.
    let (now, o, other) = round(&server, &proxy, &c, kind, true).await;
    assert_eq!(proxy.held(), held + 1, "A1 was held by the proxy");
    println!("{kind:?} race: holders {now:?} (O: {o:?}), another owner: {other:?}");
    if !now.is_empty() {
        assert_eq!(now, vec![o], "the holder is A1's owner");
    }
    assert!(
        now.is_empty() && matches!(other, Attempt::Granted(_)),
        "{kind:?}: the owner released after giving up on its attempt, yet the attempt's late \
         copy holds the name for nobody (holders {now:?}; another owner: {other:?}): the \
         release in flight when the attempt was dropped forgot the owner's record"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_late_copy_of_an_attempt_dropped_during_a_release_takes_nothing() {
    late_copy_after_release_race(Kind::Lock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_late_copy_of_an_attempt_dropped_during_a_release_takes_nothing() {
    late_copy_after_release_race(Kind::Semaphore).await;
}

/// See `conformance::late_copy::late_copy_after_extend`.
async fn late_copy_after_extend(kind: Kind) {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let via = RedisBackend::connect(
        RedisOptions::new(&format!("redis://127.0.0.1:{}", proxy.port())).timeout(CALL_TIMEOUT),
    )
    .await
    .unwrap();
    let direct = common::backend(&server.url()).await;
    conformance::late_copy::late_copy_after_extend(
        kind,
        &via,
        &direct,
        &proxy,
        &unique("rso-extend"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_late_copy_of_a_holders_first_attempt_never_shortens_its_extend() {
    late_copy_after_extend(Kind::Lock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_late_copy_of_a_holders_first_attempt_never_shortens_its_extend() {
    late_copy_after_extend(Kind::Semaphore).await;
}

/// See `conformance::late_copy::late_copy_of_an_extend_after_a_later_one`.
async fn late_extend_after_a_later_one(kind: Kind) {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let via = RedisBackend::connect(
        RedisOptions::new(&format!("redis://127.0.0.1:{}", proxy.port())).timeout(CALL_TIMEOUT),
    )
    .await
    .unwrap();
    let direct = common::backend(&server.url()).await;
    conformance::late_copy::late_copy_of_an_extend_after_a_later_one(
        kind,
        &via,
        &direct,
        &proxy,
        &unique("rso-late-extend"),
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_late_copy_of_an_extend_never_undoes_a_later_one() {
    late_extend_after_a_later_one(Kind::Lock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_late_copy_of_an_extend_never_undoes_a_later_one() {
    late_extend_after_a_later_one(Kind::Semaphore).await;
}
