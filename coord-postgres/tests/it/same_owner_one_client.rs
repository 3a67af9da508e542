//! One owner's calls racing through ONE client (the raw traits), on the
//! client's record of owners with an unanswered attempt
//! (`coord_core::late::Unanswered`, the backend's `unanswered`); the
//! PostgreSQL twin of coord-redis's `tests/it/same_owner_one_client.rs`.
//!
//! The release of an owner with an unanswered attempt leaves a mark with
//! its stamp, so a late copy of that attempt (stamped before) takes
//! nothing; then it forgets the owner, but only the record the release
//! saw (`forget` takes `Unanswered::seen`). Were it to forget
//! unconditionally after its round trip, an attempt of the same owner
//! stamped AFTER the release (not covered by its mark) that went
//! unanswered DURING that round trip would lose its record; the owner's
//! next release would then leave no mark, and the attempt's late copy
//! would take the name for nobody until its TTL.
//!
//! The window is forced, with no timing guess, by locks and the client's
//! own connection pool (2 connections, FIFO, recycled without a check):
//!
//! - A0, an attempt of O while the test holds both pooled connections,
//!   is dropped waiting for one: O is recorded (nothing was sent).
//! - X, O's release (it saw A0's record: it leaves a mark), waits on the
//!   server for a lock a raw session holds (the name's row for a lock, the
//!   name's semaphore lock for a semaphore; seen in `pg_stat_activity`).
//! - A1, O's next attempt (stamped after X), gets the other pooled
//!   connection, on which an earlier statement still waits for an
//!   advisory lock the test holds: that statement's call was dropped, and
//!   the pool took the connection back as it was. A1's request is sent
//!   behind it (seen unread in the server's socket, /proc/net/tcp, so
//!   Linux only) and A1 is dropped: unanswered, its copy on its way.
//! - X is let through and answered; then Y, O's next release, on X's
//!   connection; then the advisory lock is let go and A1's copy runs.
//!
//! X must not forget A1's record: else Y leaves no mark, and A1's copy
//! takes the name for O, who has released it. A control round runs the
//! same calls with X answered before A1 is sent: Y marks O and A1's copy
//! takes nothing, whatever X forgets.

use crate::support;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance::claim_kind::ClaimKind as Kind;
use conformance::testkit::postgres::cluster;
use coord_core::{Attempt, OwnerToken};
use coord_postgres::PostgresBackend;
use coord_postgres::tokio_postgres::Client;
use deadpool_postgres::Object;
use futures::FutureExt;
use support::{direct, raw, unique};

/// Far above every step of a round: no call of the client times out (a
/// timed-out call cancels its statement; a dropped one does not).
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
const TTL: Duration = Duration::from_secs(60);
/// How long a step may take to show up on the server.
const STEP: Duration = Duration::from_secs(10);

/// Polls `f` once (whatever it sends on that poll is sent) and drops it.
fn poll_once_and_drop<F: Future>(f: F) {
    assert!(f.now_or_never().is_none(), "answered at once");
}

async fn backend_pid(c: &Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

/// `pid`'s (state, wait_event_type, wait_event, query, client_port).
type Activity = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<i32>,
);

async fn activity(w: &Client, pid: i32) -> Activity {
    let r = w
        .query_one(
            "SELECT state, wait_event_type, wait_event, query, client_port \
               FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))
}

/// Waits until the session `pid` waits for a lock (one of `event`) in a statement
/// containing `query`.
async fn wait_lock(w: &Client, pid: i32, event: &[&str], query: &str) {
    let start = Instant::now();
    loop {
        let (_, kind, ev, q, _) = activity(w, pid).await;
        if kind.as_deref() == Some("Lock")
            && ev.as_deref().is_some_and(|e| event.contains(&e))
            && q.as_deref().is_some_and(|q| q.contains(query))
        {
            return;
        }
        assert!(
            start.elapsed() < STEP,
            "session {pid} never waited for a lock ({event:?}) in `{query}`: {ev:?} {q:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The bytes the server has not read yet from the client at
/// `client_port` (its socket's receive queue, /proc/net/tcp).
fn unread(client_port: u16) -> Option<u64> {
    let server = cluster().port();
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let port = |a: &str| {
                a.rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
            };
            if f.len() > 4 && port(f[1]) == Some(server) && port(f[2]) == Some(client_port) {
                let rx = f[4].split(':').nth(1)?;
                return u64::from_str_radix(rx, 16).ok();
            }
        }
    }
    None
}

/// Waits until the server's socket of the client at `client_port` holds
/// bytes it has not read.
async fn wait_unread(client_port: u16) {
    let start = Instant::now();
    loop {
        if unread(client_port).is_some_and(|b| b > 0) {
            return;
        }
        assert!(start.elapsed() < STEP, "nothing was sent on the connection");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// One round on a fresh name; `race`: X waits on the server while A1 is
/// sent and dropped (else X is answered before A1 is sent). Returns (the
/// holders once A1's copy ran, O, another owner's attempt then).
async fn round(
    schema: &str,
    c: &Arc<PostgresBackend>,
    kind: Kind,
    race: bool,
) -> (Vec<OwnerToken>, OwnerToken, Attempt) {
    let direct = direct(schema).await;
    let watch = raw().await;
    let n = unique("rso");
    let o = OwnerToken::random();
    assert!(
        matches!(
            kind.attempt(&**c, &n, &o, TTL).await,
            Ok(Attempt::Granted(_))
        ),
        "O takes {n}"
    );

    // The test takes both pooled connections.
    let h0 = c.pool().get().await.unwrap();
    let h1 = c.pool().get().await.unwrap();
    assert_eq!(c.pool().status().available, 0);
    let (pid0, pid1) = (backend_pid(&h0).await, backend_pid(&h1).await);
    assert_ne!(pid0, pid1);
    let (id0, id1) = (Object::id(&h0), Object::id(&h1));

    // A0: an attempt of O dropped waiting for a connection: O recorded.
    poll_once_and_drop(kind.attempt(&**c, &n, &o, TTL));

    // B: a statement on h0 that waits for an advisory lock the test
    // holds; its call is dropped, so the connection goes back to the pool
    // with it still running.
    let key = format!("hashtextextended('rso-blocker:{n}', 0)");
    let blocker = raw().await;
    blocker
        .batch_execute(&format!("SELECT pg_advisory_lock({key})"))
        .await
        .unwrap();
    poll_once_and_drop(h0.simple_query(&format!("SELECT pg_advisory_xact_lock({key})")));
    wait_lock(&watch, pid0, &["advisory"], "rso-blocker").await;
    let (_, _, _, _, port0) = activity(&watch, pid0).await;
    let port0 = u16::try_from(port0.expect("a TCP connection")).unwrap();
    assert_eq!(unread(port0), Some(0), "B was read by the server");

    // X: O's release, on h1 (the only idle connection).
    let gate = raw().await;
    if race {
        // X waits on the server for the lock its statement takes first.
        gate.batch_execute("BEGIN").await.unwrap();
        let held = match kind {
            Kind::Lock => gate
                .query(
                    &format!(
                        "SELECT 1 FROM \"{schema}\".claims \
                          WHERE kind = 'lock' AND name = $1 FOR UPDATE"
                    ),
                    &[&n],
                )
                .await
                .unwrap()
                .len(),
            Kind::Semaphore => gate
                .query(
                    "SELECT pg_advisory_xact_lock(hashtext('coord-semaphores:' || $1::text), \
                                                  hashtext($2::text))",
                    &[&schema, &n],
                )
                .await
                .unwrap()
                .len(),
        };
        assert_eq!(held, 1);
    }
    drop(h1);
    let mut x = Some({
        let (c, n) = (c.clone(), n.clone());
        tokio::spawn(async move { kind.release(&*c, &n, &o).await })
    });
    let h1 = if race {
        let (event, call) = match kind {
            Kind::Lock => (&["transactionid", "tuple"][..], "claim_leave("),
            Kind::Semaphore => (&["advisory"][..], "semaphore_release("),
        };
        wait_lock(&watch, pid1, event, call).await;
        None
    } else {
        let xr = x.take().unwrap().await.unwrap();
        assert!(xr.is_ok(), "X should be answered: {xr:?}");
        // Its connection back to the test.
        let h1 = c.pool().get().await.unwrap();
        assert_eq!(Object::id(&h1), id1);
        Some(h1)
    };

    // A1: O's attempt, stamped after X; it gets h0 (the only idle
    // connection), sends its request behind B, and is dropped once the
    // request is in the server's socket.
    drop(h0);
    {
        let a1 = kind.attempt(&**c, &n, &o, TTL);
        tokio::pin!(a1);
        tokio::select! {
            r = &mut a1 => panic!("A1 should not be answered: {r:?}"),
            () = wait_unread(port0) => {}
        }
    }
    if let Some(x) = &x {
        assert!(!x.is_finished(), "X answered before A1 was dropped");
    }
    // h0 back to the test: no call of the client queues behind B now.
    let h0 = c.pool().get().await.unwrap();
    assert_eq!(Object::id(&h0), id0);

    // X answered (race: let through now).
    if let Some(x) = x {
        gate.batch_execute("COMMIT").await.unwrap();
        let xr = x.await.unwrap();
        assert!(xr.is_ok(), "X should be answered: {xr:?}");
    }
    drop(h1);

    // Y: O's next release, after it gave up on A1 (on X's connection).
    let y = kind.release(&**c, &n, &o).await;
    assert!(
        matches!(y, Ok(false)),
        "Y found nothing (X released O): {y:?}"
    );
    let after_y = kind.holders(&*direct, &n).await;
    assert!(after_y.is_empty(), "held after Y: {after_y:?}");
    assert!(unread(port0).is_some_and(|b| b > 0), "A1 is still unread");

    // A1's copy runs: B gets its lock, then A1's statements run on h0.
    drop(h0);
    blocker
        .batch_execute(&format!("SELECT pg_advisory_unlock({key})"))
        .await
        .unwrap();
    let start = Instant::now();
    loop {
        // A1's last statement is its transaction's COMMIT.
        let (state, _, _, q, _) = activity(&watch, pid0).await;
        if state.as_deref() == Some("idle") && q.as_deref() == Some("COMMIT") {
            break;
        }
        assert!(
            start.elapsed() < STEP,
            "A1's copy never ran: {state:?} {q:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(unread(port0), Some(0), "A1 was read by the server");

    let now = kind.holders(&*direct, &n).await;
    let other = kind
        .attempt(&*direct, &n, &OwnerToken::random(), TTL)
        .await
        .unwrap();
    (now, o, other)
}

async fn late_copy_after_release_race(kind: Kind) {
    let schema = unique("rso_late");
    let _ = direct(&schema).await;
    // Statements as text, pipelined (A1 is sent in one go); two pooled
    // connections; no LISTEN connection and no sweep, so only the test's
    // calls take pooled connections.
    let c = coord_postgres::builder(&cluster().url())
        .schema(&schema)
        .call_timeout(CALL_TIMEOUT)
        .pool_size(2)
        .prepared_statements(false)
        .listen(false)
        .sweep_every(None)
        .connect_backend()
        .await
        .unwrap();
    // Control: X answered before A1; Y marks O, A1's copy takes nothing.
    let (now, _, other) = round(&schema, &c, kind, false).await;
    assert!(
        now.is_empty() && matches!(other, Attempt::Granted(_)),
        "{kind:?} control: A1's late copy took the name (holders {now:?}, another owner: {other:?})"
    );
    // The race: A1 dropped while X waits on the server.
    let (now, o, other) = round(&schema, &c, kind, true).await;
    println!("{kind:?} race: holders {now:?} (O: {o:?}), another owner: {other:?}");
    if !now.is_empty() {
        assert_eq!(now, vec![o], "the holder is A1's owner");
    }
    assert!(
        now.is_empty() && matches!(other, Attempt::Granted(_)),
        "{kind:?}: the owner released after giving up on its attempt, yet the attempt's late \
         copy holds the name for nobody (holders {now:?}; another owner: {other:?}): the \
         release waiting on the server when the attempt was dropped forgot the owner's record"
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
