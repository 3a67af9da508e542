//! Semaphores on the real server: what they leave in the store (nothing
//! for an idle name once TTLs and the grace have passed), an abandoned
//! place in line lapsing so the waiters behind it are not held up for
//! ever, and polling waiters that write nothing. The cases run one after
//! the other (one counts transaction ids server-wide).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use conformance::testkit::postgres::cluster;
use coord_core::{Attempt, OwnerToken, PermitRequest, Semaphore};
use coord_postgres::PostgresBackend;

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A client on a schema of its own (so its rows can be counted), without
/// the background sweep.
async fn backend(grace: Duration) -> Arc<PostgresBackend> {
    coord_postgres::builder(&cluster().url())
        .schema(unique("sem"))
        .idle_grace(grace)
        .sweep_every(None)
        .connect_backend()
        .await
        .expect("connect to the test cluster")
}

/// (grant rows, queue rows) in the backend's schema.
async fn rows(b: &PostgresBackend) -> (i64, i64) {
    let c = b.pool().get().await.unwrap();
    let s = b.schema();
    let row = c
        .query_one(
            &format!(
                "SELECT (SELECT count(*) FROM \"{s}\".semaphore_holders), \
                        (SELECT count(*) FROM \"{s}\".semaphore_queue)"
            ),
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

fn req(permits: u32, total: u32, ttl: Duration, queue: bool) -> PermitRequest {
    PermitRequest {
        permits,
        total,
        ttl,
        queue,
    }
}

/// Released grants, refused single attempts and timed-out waits leave no
/// row at all; a crashed holder's grant is deleted by the sweep once its
/// TTL and the grace have passed, and the name is then bound to no total.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_name_leaves_no_rows_after_its_ttl_and_the_grace() {
    let _alone = crate::ALONE.lock().await;
    let grace = Duration::from_millis(300);
    let b = backend(grace).await;
    let coord = b.coord();
    let sem = coord.semaphores().unwrap();
    assert!(sem.is_fifo());
    let name = unique("idle");
    let long = Duration::from_secs(30);
    for _ in 0..5 {
        let p = sem
            .acquire_many(&name, 2, 3, long, Duration::ZERO)
            .await
            .unwrap();
        let q = sem
            .try_acquire(&name, 3, long)
            .await
            .unwrap()
            .expect("1 free");
        assert!(sem.try_acquire(&name, 3, long).await.unwrap().is_none());
        let e = sem
            .acquire(&name, 3, long, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(matches!(e, coord_core::Error::Timeout { .. }), "{e:?}");
        q.release().await.unwrap();
        p.release().await.unwrap();
    }
    assert_eq!(
        rows(&b).await,
        (0, 0),
        "released or refused requests left rows"
    );

    // A crashed holder: its grant stays until its TTL, then the sweep
    // deletes it after the grace.
    let ttl = Duration::from_millis(400);
    let crashed = sem.acquire(&name, 3, ttl, Duration::ZERO).await.unwrap();
    std::mem::forget(crashed);
    assert_eq!(rows(&b).await, (1, 0));
    b.sweep().await.unwrap();
    assert_eq!(rows(&b).await, (1, 0), "the sweep deleted a live grant");
    tokio::time::sleep(ttl + grace + Duration::from_millis(100)).await;
    assert!(b.sweep().await.unwrap() >= 1);
    assert_eq!(
        rows(&b).await,
        (0, 0),
        "an expired grant outlived the grace"
    );
    // Idle: a new total is accepted.
    let all = sem
        .try_acquire_many(&name, 5, 5, long)
        .await
        .unwrap()
        .expect("all 5 free");
    all.release().await.unwrap();
    assert_eq!(rows(&b).await, (0, 0));
}

/// A waiter that died in line (its place is never renewed) holds up the
/// waiters behind it for `SEMAPHORE_QUEUE_TTL` at most: the live waiter
/// behind it is granted once the place lapses (from the store's expiry
/// hint: it polls only every 60 s), not before, and the sweep deletes the
/// dead place after the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiters_place_lapses_and_is_swept() {
    let _alone = crate::ALONE.lock().await;
    let grace = Duration::from_millis(300);
    let b = backend(grace).await;
    let name = unique("dead");
    let long = Duration::from_secs(120);
    let holder = OwnerToken::random();
    let got = b
        .try_acquire(&name, holder.step(), &req(1, 2, long, false))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Granted(_)), "{got:?}");
    // The dead waiter: one refused queueing attempt for both permits,
    // never repeated.
    let dead = OwnerToken::random();
    let got = b
        .try_acquire(&name, dead.step(), &req(2, 2, long, true))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Held { .. }), "{got:?}");
    let queued_at = Instant::now();
    assert_eq!(rows(&b).await, (1, 1));
    // Both permits free: the dead waiter could be granted, so the live
    // one behind it (1 permit) must still wait, in line.
    assert!(b.release(&name, holder.step()).await.unwrap());
    let sem = b
        .coord()
        .with_poll_interval(Duration::from_secs(60))
        .semaphores()
        .unwrap();
    let live = sem
        .acquire(&name, 2, long, Duration::from_secs(45))
        .await
        .expect("the live waiter is granted once the dead place lapses");
    let waited = queued_at.elapsed();
    let ttl = coord_postgres::SEMAPHORE_QUEUE_TTL;
    assert!(
        waited + Duration::from_millis(200) >= ttl,
        "granted after {waited:?}: overtook a place in line that had not lapsed"
    );
    assert!(
        waited <= ttl + Duration::from_secs(3),
        "granted only {waited:?} after the dead waiter queued (place TTL {ttl:?})"
    );
    live.release().await.unwrap();
    tokio::time::sleep(grace + Duration::from_millis(100)).await;
    b.sweep().await.unwrap();
    assert_eq!(
        rows(&b).await,
        (0, 0),
        "the lapsed place outlived the grace"
    );
}

/// A queued waiter's polls write nothing: 200 refused attempts of a
/// waiter whose place is fresh take no transaction id (no row lock, no
/// WAL flush), and 200 refused single attempts neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_waiters_write_nothing() {
    let _alone = crate::ALONE.lock().await;
    let b = backend(Duration::from_secs(60)).await;
    let name = unique("poll");
    let long = Duration::from_secs(60);
    let holder = OwnerToken::random();
    let got = b
        .try_acquire(&name, holder.step(), &req(1, 1, long, false))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Granted(_)), "{got:?}");
    let waiter = OwnerToken::random();
    let got = b
        .try_acquire(&name, waiter.step(), &req(1, 1, long, true))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Held { .. }), "{got:?}");
    let xids = crate::XidCount::start().await;
    for i in 0..200 {
        let got = b
            .try_acquire(&name, waiter.step(), &req(1, 1, long, true))
            .await
            .unwrap();
        assert!(matches!(got, Attempt::Held { .. }), "poll {i}: {got:?}");
        let other = OwnerToken::random();
        let got = b
            .try_acquire(&name, other.step(), &req(1, 1, long, false))
            .await
            .unwrap();
        assert!(matches!(got, Attempt::Held { .. }), "single {i}: {got:?}");
    }
    let used = xids.used();
    assert!(
        used <= 5,
        "400 refused attempts used {used} transaction ids (they wrote)"
    );
    assert_eq!(rows(&b).await, (1, 1), "single attempts left places");
    assert!(b.release(&name, holder.step()).await.unwrap());
    let got = b
        .try_acquire(&name, waiter.step(), &req(1, 1, long, true))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Granted(_)), "{got:?}");
    assert!(b.release(&name, waiter.step()).await.unwrap());
    assert_eq!(rows(&b).await, (0, 0));
}

/// NOTIFY is sent only to waiters a change makes grantable: 20
/// uncontended cycles, and a release while the only waiter still does not
/// fit, send nothing; the release that lets it in sends exactly its
/// payload (`semaphore:<owner hex>:<name>`), and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_go_only_to_waiters_made_grantable() {
    use coord_postgres::tokio_postgres::{self, AsyncMessage, NoTls};
    use futures::StreamExt;

    let _alone = crate::ALONE.lock().await;
    let b = backend(Duration::from_secs(60)).await;
    assert!(b.capabilities().notifications);
    let (client, mut conn) = tokio_postgres::connect(&cluster().url(), NoTls)
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            if let AsyncMessage::Notification(n) = m {
                let _ = tx.send(n.payload().to_string());
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN \"{}\"", b.channel()))
        .await
        .unwrap();
    let marker = |m: &'static str| {
        let (client, channel) = (&client, b.channel().to_string());
        async move {
            client
                .query("SELECT pg_notify($1, $2)", &[&channel, &m])
                .await
                .unwrap();
        }
    };
    async fn next(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> String {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("a payload arrives")
            .expect("a payload")
    }

    let name = unique("notify");
    let long = Duration::from_secs(60);
    for _ in 0..20 {
        let o = OwnerToken::random();
        let got = b
            .try_acquire(&name, o.step(), &req(1, 2, long, false))
            .await
            .unwrap();
        assert!(matches!(got, Attempt::Granted(_)), "{got:?}");
        assert!(b.release(&name, o.step()).await.unwrap());
    }
    marker("first").await;
    assert_eq!(
        next(&mut rx).await,
        "first",
        "an uncontended cycle notified"
    );

    // Two holders of 1 each; a waiter for 2 in line.
    let (h1, h2, w) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    for h in [&h1, &h2] {
        let got = b
            .try_acquire(&name, h.step(), &req(1, 2, long, false))
            .await
            .unwrap();
        assert!(matches!(got, Attempt::Granted(_)), "{got:?}");
    }
    let got = b
        .try_acquire(&name, w.step(), &req(2, 2, long, true))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Held { .. }), "{got:?}");
    assert!(b.release(&name, h1.step()).await.unwrap());
    marker("second").await;
    assert_eq!(
        next(&mut rx).await,
        "second",
        "a release that frees too little for the waiter notified"
    );
    assert!(b.release(&name, h2.step()).await.unwrap());
    assert_eq!(
        next(&mut rx).await,
        format!("semaphore:{}:{name}", w.to_hex()),
        "the release that lets the waiter in must notify it"
    );
    let got = b
        .try_acquire(&name, w.step(), &req(2, 2, long, true))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Granted(_)), "{got:?}");
    assert!(b.release(&name, w.step()).await.unwrap());
    marker("third").await;
    assert_eq!(
        next(&mut rx).await,
        "third",
        "a release nobody waits for notified"
    );
}
