//! Late semaphore attempts on a slow network: an attempt whose reply is
//! delayed past the call timeout is given up by its client, but still
//! reaches the server, possibly after the acquire has ended and its
//! owner's place (or grant) has been released. It must then change
//! nothing: no place in line nobody waits for (FIFO: it would hold up
//! every later waiter until it lapses, `SEMAPHORE_QUEUE_TTL`), and no
//! grant nobody releases.
//!
//! The slow client goes through a `FaultProxy` that delays every chunk by
//! [`LATENCY`] (a chunk already read keeps its delay after the latency is
//! turned off), with a call timeout of 200 ms and one pooled connection,
//! warmed so its statements are prepared (the late attempt is then one
//! message, sent at once). The cases run one after the other.

use crate::support;
use std::time::{Duration, Instant};

use conformance::testkit::postgres::cluster;
use conformance::testkit::proxy::FaultProxy;
use coord_core::late::Stepped;
use coord_core::{Attempt, OwnerToken, PermitRequest, Semaphore};
use coord_postgres::PostgresBackend;
use support::{HEAL_AFTER, LATENCY, LONG, direct, slow, unique, until_late_attempts_landed};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Make `b`'s one pooled connection prepare the semaphore statements: an
/// acquire and a release answered on that connection. A call that goes
/// unanswered (the call timeout is 200 ms, which a loaded machine can
/// outlast) replaces the connection, and the new one has prepared only
/// what came after: then the whole pair again, by the same owner (its
/// retry of an unanswered attempt is that attempt). On a name of its own,
/// as an owner with an unanswered attempt leaves a mark at its release.
async fn warm(b: &PostgresBackend, name: &str) {
    let name = format!("{name}_warm");
    let o = OwnerToken::random();
    let r = req(1, 1, LONG, false);
    let deadline = Instant::now() + Duration::from_secs(20);
    for round in 0.. {
        let pair = async {
            let got = b.try_acquire(&name, o.step(), &r).await?;
            assert!(matches!(got, Attempt::Granted(_)), "{got:?}");
            b.release(&name, o.step()).await
        };
        match pair.await {
            Ok(held) => {
                // After an unanswered release, its copy may land later.
                assert!(
                    held || round > 0,
                    "the warm-up grant was not held at its release"
                );
                return;
            }
            Err(e) => assert!(Instant::now() < deadline, "the warm-up never answered: {e}"),
        }
    }
}

fn req(permits: u32, total: u32, ttl: Duration, queue: bool) -> PermitRequest {
    PermitRequest {
        permits,
        total,
        ttl,
        queue,
    }
}

/// (grant rows, queue rows) of `name`.
async fn rows(b: &PostgresBackend, name: &str) -> (i64, i64) {
    let c = b.pool().get().await.unwrap();
    let s = b.schema();
    let row = c
        .query_one(
            &format!(
                "SELECT (SELECT count(*) FROM \"{s}\".semaphore_holders WHERE name = $1), \
                        (SELECT count(*) FROM \"{s}\".semaphore_queue WHERE name = $1)"
            ),
            &[&name],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// Marks of owners that left, on `name`.
async fn left(b: &PostgresBackend, name: &str) -> i64 {
    let c = b.pool().get().await.unwrap();
    let s = b.schema();
    c.query_one(
        &format!("SELECT count(*) FROM \"{s}\".semaphore_left WHERE name = $1"),
        &[&name],
    )
    .await
    .unwrap()
    .get(0)
}

/// A waiting acquire times out while its first attempt is still on its
/// way; the acquire's release runs first (removing nothing, or the place
/// of a later attempt), then the late attempt lands. It must find its
/// owner left after it was sent and write nothing, so a later acquire of
/// the free permit is granted at once. (Were it to queue the owner again,
/// nobody would wait for that place, yet the waiters behind it (FIFO)
/// would wait until it lapses.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_attempt_after_a_timed_out_acquire_leaves_no_place() {
    let _serial = SERIAL.lock().await;
    let schema = unique("late_place");
    let proxy = FaultProxy::start(cluster().port());
    let here = direct(&schema).await;
    let far = slow(&schema, &proxy).await;
    let name = unique("late-place");
    warm(&far, &name).await;

    // The one permit is held, so the slow acquire queues.
    let holder = OwnerToken::random();
    let got = here
        .try_acquire(&name, holder.step(), &req(1, 1, LONG, false))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Granted(_)), "{got:?}");

    proxy.latency(LATENCY);
    let started = Instant::now();
    let sem = far.coord().semaphores().unwrap();
    let n = name.clone();
    let acquire =
        tokio::spawn(async move { sem.acquire(&n, 1, LONG, Duration::from_millis(600)).await });
    tokio::time::sleep(HEAL_AFTER).await;
    proxy.latency(Duration::ZERO);
    let r = acquire.await.unwrap();
    assert!(r.is_err(), "the slow acquire got the held permit: {r:?}");
    until_late_attempts_landed(started).await;
    let after_late = rows(&here, &name).await;

    // The holder leaves: the permit is free, and nobody else waits.
    assert!(here.release(&name, holder.step()).await.unwrap());
    let sem = here.coord().semaphores().unwrap();
    let t = Instant::now();
    let next = sem.acquire(&name, 1, LONG, Duration::from_secs(5)).await;
    let waited = t.elapsed();
    let end = rows(&here, &name).await;
    // A place nobody waits for would hold the acquire up until it lapses
    // (SEMAPHORE_QUEUE_TTL, 30 s, past the 5 s wait); a grant at once may
    // still take a few seconds on a loaded machine.
    assert!(
        after_late == (1, 0) && next.is_ok() && waited < Duration::from_secs(4),
        "after the late attempt landed the name had (grants, places) = {after_late:?} \
         (want (1, 0): the holder's grant, no place); the next acquire of the free \
         permit gave {:?} after {waited:?} (want a grant at once, under 4 s); \
         rows at the end: {end:?}",
        next.as_ref().map(|p| p.fencing_token())
    );
    next.unwrap().release().await.unwrap();
    assert_eq!(rows(&here, &name).await, (0, 0));

    // The slow owner's mark is the name's only state left; once lapsed,
    // the sweep deletes it.
    assert_eq!(left(&here, &name).await, 1, "the timed-out owner's mark");
    let c = here.pool().get().await.unwrap();
    c.execute(
        &format!(
            "UPDATE \"{schema}\".semaphore_left SET expires_at = now() - interval '1 day' \
              WHERE name = $1"
        ),
        &[&name],
    )
    .await
    .unwrap();
    drop(c);
    assert!(here.sweep().await.unwrap() >= 1);
    assert_eq!(
        left(&here, &name).await,
        0,
        "a lapsed mark outlived the sweep"
    );
}

/// The same late attempt after an acquire that succeeded (a retry got the
/// grant) and whose permit was released at once: the late attempt must
/// not take the permit again for nobody (it would be lost until its TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_attempt_after_a_release_takes_no_permit() {
    let _serial = SERIAL.lock().await;
    let schema = unique("late_grant");
    let proxy = FaultProxy::start(cluster().port());
    let here = direct(&schema).await;
    let far = slow(&schema, &proxy).await;
    let name = unique("late-grant");
    warm(&far, &name).await;

    proxy.latency(LATENCY);
    let started = Instant::now();
    let sem = far.coord().semaphores().unwrap();
    let n = name.clone();
    let acquire =
        tokio::spawn(async move { sem.acquire(&n, 1, LONG, Duration::from_secs(3)).await });
    tokio::time::sleep(HEAL_AFTER).await;
    proxy.latency(Duration::ZERO);
    let permit = acquire
        .await
        .unwrap()
        .expect("a retry on a healed path is granted");
    // On a loaded machine the release on the healed path can outlast the
    // 200 ms call timeout: it is then sent again in the background, and
    // lands before the late attempts are taken to have landed.
    if let Err(e) = permit.release().await {
        assert!(e.is_retryable(), "release: {e:?}");
    }
    until_late_attempts_landed(started).await;
    let after_late = rows(&here, &name).await;

    let sem = here.coord().semaphores().unwrap();
    let next = sem.try_acquire(&name, 1, LONG).await.unwrap();
    assert!(
        after_late == (0, 0) && next.is_some(),
        "after the late attempt landed the name had (grants, places) = {after_late:?} \
         (want none); another client's try_acquire of the free permit gave {:?}",
        next.as_ref().map(|p| p.fencing_token())
    );
    next.unwrap().release().await.unwrap();
    assert_eq!(left(&here, &name).await, 1, "the released owner's mark");
}

/// Through the raw trait, an owner may be used again after its release:
/// its new attempts are not taken for late ones, also when the release
/// marked it as left (an attempt of it was given up on). A lapsed mark is
/// pruned by the next write on the name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_used_again_after_its_release_is_served() {
    let _serial = SERIAL.lock().await;
    let schema = unique("late_reuse");
    let b = direct(&schema).await;
    // The core's book of unanswered steps, as the handles keep it.
    let here = Stepped::<dyn Semaphore>::new(b.clone());
    let name = unique("reuse");
    let (holder, o) = (OwnerToken::random(), OwnerToken::random());
    let got = here
        .try_acquire(&name, &holder, &req(1, 1, LONG, false))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Granted(_)), "{got:?}");
    let got = here
        .try_acquire(&name, &o, &req(1, 1, LONG, true))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Held { .. }), "{got:?}");
    assert!(!here.release(&name, &o).await.unwrap());
    assert_eq!(rows(&b, &name).await, (1, 0));
    // Queued again, then granted once the holder leaves.
    let got = here
        .try_acquire(&name, &o, &req(1, 1, LONG, true))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Held { .. }), "{got:?}");
    assert_eq!(rows(&b, &name).await, (1, 1));
    assert!(here.release(&name, &holder).await.unwrap());
    let got = here
        .try_acquire(&name, &o, &req(1, 1, LONG, true))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Granted(_)), "{got:?}");
    assert!(here.release(&name, &o).await.unwrap());
    let got = here
        .try_acquire(&name, &o, &req(1, 1, LONG, false))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Granted(_)), "{got:?}");
    assert!(here.release(&name, &o).await.unwrap());
    assert_eq!(rows(&b, &name).await, (0, 0));
    assert_eq!(left(&b, &name).await, 0, "answered attempts left marks");

    // An attempt given up on mid-call (whether it reached the server or
    // not, and when): the release marks the owner; its later attempts are
    // served all the same.
    let got = here
        .try_acquire(&name, &holder, &req(1, 1, LONG, false))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Granted(_)), "{got:?}");
    let r = req(1, 1, LONG, true);
    // Polled once (it is sent, or about to be), then dropped. On a loaded
    // machine its reply can be in by the end of that poll (the connection
    // runs on another worker thread): that attempt was answered, its place
    // is released (leaving no mark), and another owner tries.
    let mut tries = 0;
    let o = loop {
        tries += 1;
        let o = OwnerToken::random();
        let mut gave_up = Box::pin(here.try_acquire(&name, &o, &r));
        let first = futures::poll!(gave_up.as_mut());
        drop(gave_up);
        if first.is_pending() {
            break o;
        }
        assert!(
            tries < 20,
            "every attempt was answered within its first poll"
        );
        assert!(!here.release(&name, &o).await.unwrap());
        assert_eq!(left(&b, &name).await, 0, "an answered attempt marked");
    };
    assert!(!here.release(&name, &o).await.unwrap());
    assert_eq!(left(&b, &name).await, 1, "the release marked the owner");
    let got = here
        .try_acquire(&name, &o, &req(1, 1, LONG, true))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Held { .. }), "{got:?}");
    assert_eq!(rows(&b, &name).await, (1, 1), "queued again");
    assert!(here.release(&name, &holder).await.unwrap());
    let got = here
        .try_acquire(&name, &o, &req(1, 1, LONG, true))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Granted(_)), "{got:?}");
    assert!(here.release(&name, &o).await.unwrap());
    assert_eq!(rows(&b, &name).await, (0, 0));

    // Lapsed: the next grant on the name prunes it.
    let c = b.pool().get().await.unwrap();
    c.execute(
        &format!(
            "UPDATE \"{schema}\".semaphore_left SET expires_at = now() - interval '1 s' \
              WHERE name = $1"
        ),
        &[&name],
    )
    .await
    .unwrap();
    drop(c);
    let got = here
        .try_acquire(&name, &o, &req(1, 1, LONG, false))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Granted(_)), "{got:?}");
    assert_eq!(left(&b, &name).await, 0, "a lapsed mark was not pruned");
    assert!(here.release(&name, &o).await.unwrap());
    assert_eq!(rows(&b, &name).await, (0, 0));
}
