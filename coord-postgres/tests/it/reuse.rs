//! Claim rows are reused: a release frees its row in place, the next grant
//! takes it in place with a higher fencing token, and only the sweep
//! deletes a row (once its last grant ended more than the grace ago),
//! after which the name's next grant still gets a higher token. A row of a
//! name idle past its TTL and grace is gone (tests/alone/soak.rs counts them at
//! scale).

use crate::support;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conformance::testkit::postgres::cluster;
use coord_core::{Attempt, Election, FencingSource, FencingToken, Lease, Lock, OwnerToken};
use coord_postgres::PostgresBackend;
use coord_postgres::tokio_postgres::{self, AsyncMessage, NoTls};
use futures::StreamExt;
use support::{granted, psql, unique};

/// Per name, each grant's token and whether it was recorded in time.
type GrantLog = HashMap<String, Vec<(u64, bool)>>;

const GRACE: Duration = Duration::from_millis(100);

async fn backend(schema: &str, prepared: bool) -> Arc<PostgresBackend> {
    coord_postgres::builder(&cluster().url())
        .schema(schema.to_string())
        .prepared_statements(prepared)
        .idle_grace(GRACE)
        .sweep_every(None)
        .connect_backend()
        .await
        .expect("connect")
}

/// Counts the inserts and deletes on the schema's claims table from now on.
fn count_row_changes(schema: &str) {
    psql(&format!(
        "CREATE TABLE \"{schema}\".changes (op text); \
         CREATE FUNCTION \"{schema}\".note() RETURNS trigger LANGUAGE plpgsql AS \
           $$ BEGIN INSERT INTO \"{schema}\".changes VALUES (TG_OP); RETURN NULL; END $$; \
         CREATE TRIGGER note AFTER INSERT OR DELETE ON \"{schema}\".claims \
           FOR EACH ROW EXECUTE FUNCTION \"{schema}\".note()"
    ));
}

fn changes(schema: &str, op: &str) -> u64 {
    psql(&format!(
        "SELECT count(*) FROM \"{schema}\".changes WHERE op = '{op}'"
    ))
    .parse()
    .expect("a count")
}

/// One row per name from its first grant on: 30 cycles by alternating
/// owners (with metadata, and the lease and election kinds beside) insert
/// one row per name and delete none; each release leaves the row free
/// (no owner, no metadata, no candidate) and each grant draws a higher
/// token. With and without prepared statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_frees_the_row_in_place_and_the_next_grant_takes_it() {
    for prepared in [true, false] {
        let schema = unique("reuse");
        let b = backend(&schema, prepared).await;
        // The schema exists after the first call.
        FencingSource::next(&*b, "warm-up").await.unwrap();
        count_row_changes(&schema);
        let mut last = FencingToken(0);
        for i in 0..30 {
            let owner = OwnerToken::random();
            let t = granted(
                b.try_acquire_with_metadata(
                    "job",
                    owner.step(),
                    Duration::from_secs(30),
                    b"{\"i\":1}",
                )
                .await
                .unwrap(),
            );
            assert!(t > last, "cycle {i}: token {t:?} after {last:?}");
            let lease = granted(
                b.grant("worker", owner.step(), Duration::from_secs(30))
                    .await
                    .unwrap(),
            );
            assert!(lease > t);
            let term = granted(
                b.try_campaign("leader", "me", owner.step(), Duration::from_secs(30))
                    .await
                    .unwrap(),
            );
            assert!(term > lease);
            last = term;
            assert!(Lock::release(&*b, "job", owner.step()).await.unwrap());
            assert!(b.revoke("worker", owner.step()).await.unwrap());
            assert!(b.resign("leader", owner.step()).await.unwrap());
            assert!(
                !Lock::release(&*b, "job", owner.step()).await.unwrap(),
                "a second release"
            );
            let left = psql(&format!(
                "SELECT count(*) FILTER (WHERE owner IS NULL AND metadata IS NULL \
                                          AND candidate IS NULL) || '/' || count(*) \
                   FROM \"{schema}\".claims"
            ));
            assert_eq!(
                left, "3/3",
                "cycle {i} (prepared {prepared}): free rows/rows"
            );
        }
        assert_eq!(changes(&schema, "INSERT"), 3, "prepared {prepared}");
        assert_eq!(changes(&schema, "DELETE"), 0, "prepared {prepared}");
        // Force release frees in place too.
        let owner = OwnerToken::random();
        granted(
            b.try_acquire("job", owner.step(), Duration::from_secs(30))
                .await
                .unwrap(),
        );
        assert!(b.force_release("job").await.unwrap());
        assert!(!Lock::release(&*b, "job", owner.step()).await.unwrap());
        assert_eq!(changes(&schema, "DELETE"), 0);
        assert!(Lock::inspect(&*b, "job").await.unwrap().holders.is_empty());
    }
}

/// The sweep deletes a free row, and an expired one, once its last grant
/// ended more than the grace ago (not before), and the name's next grant,
/// on a new row, still gets a higher token than every earlier grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_swept_away_gets_a_higher_token_next() {
    for prepared in [true, false] {
        let schema = unique("swept");
        let b = backend(&schema, prepared).await;
        let ttl = Duration::from_millis(300);
        let (o1, o2) = (OwnerToken::random(), OwnerToken::random());
        let t1 = granted(b.try_acquire("freed", o1.step(), ttl).await.unwrap());
        let t2 = granted(b.try_acquire("expired", o2.step(), ttl).await.unwrap());
        assert!(Lock::release(&*b, "freed", o1.step()).await.unwrap());
        assert_eq!(
            b.sweep().await.unwrap(),
            0,
            "swept before the TTL and grace"
        );
        tokio::time::sleep(ttl + GRACE + Duration::from_millis(100)).await;
        assert_eq!(b.sweep().await.unwrap(), 2);
        assert_eq!(
            psql(&format!("SELECT count(*) FROM \"{schema}\".claims")),
            "0"
        );
        let t3 = granted(b.try_acquire("freed", o2.step(), ttl).await.unwrap());
        let t4 = granted(b.try_acquire("expired", o1.step(), ttl).await.unwrap());
        assert!(
            t3 > t2 && t4 > t3 && t2 > t1,
            "tokens {t1:?} {t2:?} then, after the sweep, {t3:?} {t4:?} (prepared {prepared})"
        );
    }
}

/// 12 tasks cycle on 16 names for 4 s (half their grants released, half
/// left to expire after 60 ms; a pause of 0-150 ms after each) while
/// another client sweeps in a loop with a 100 ms grace: rows are taken in
/// place, taken over expired, deleted and made again. Each name's tokens,
/// in grant order, strictly rise. A grant counts only when its task
/// recorded it within the TTL of sending the attempt (so no later grant
/// could have come before the record).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_rise_per_name_while_rows_are_reused_and_swept() {
    let schema = unique("churn");
    let b = backend(&schema, true).await;
    let sweeper = backend(&schema, false).await;
    let ttl = Duration::from_millis(60);
    let log: Arc<Mutex<GrantLog>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let swept = Arc::new(AtomicU64::new(0));
    let sweeping = {
        let (stop, swept) = (stop.clone(), swept.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                swept.fetch_add(sweeper.sweep().await.unwrap(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let mut tasks = Vec::new();
    for k in 0..12 {
        let (b, log, stop) = (b.clone(), log.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            let mut r: u64 = k + 1;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                r = r
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let name = format!("n{}", (r >> 33) % 16);
                let owner = OwnerToken::random();
                let sent = Instant::now();
                let Attempt::Granted(t) = b.try_acquire(&name, owner.step(), ttl).await.unwrap()
                else {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                };
                {
                    let mut log = log.lock().unwrap();
                    let valid = sent.elapsed() < ttl;
                    log.entry(name.clone()).or_default().push((t.get(), valid));
                }
                if n % 2 == 0 {
                    Lock::release(&*b, &name, owner.step()).await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis((r >> 40) % 150)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    sweeping.await.unwrap();
    let log = log.lock().unwrap();
    let mut grants = 0;
    for (name, entries) in log.iter() {
        let valid: Vec<u64> = entries.iter().filter(|e| e.1).map(|e| e.0).collect();
        grants += valid.len();
        for w in valid.windows(2) {
            assert!(w[1] > w[0], "{name}: token {} after {}", w[1], w[0]);
        }
    }
    println!(
        "{grants} grants, {} rows swept",
        swept.load(Ordering::Relaxed)
    );
    assert!(grants > 40, "only {grants} grants");
    assert!(
        swept.load(Ordering::Relaxed) > 0,
        "the sweep deleted no row"
    );
}

/// The waiting mark stays on a freed row only until the next grant of it:
/// after a release that woke a waiter, uncontended cycles on the same name
/// send no NOTIFY (a marker sent after them is the first payload).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_row_notifies_only_while_someone_waits() {
    let schema = unique("rwk");
    let url = format!("{}&coord_schema={schema}", cluster().url());
    let holder = coord_postgres::connect(&url)
        .await
        .unwrap()
        .with_poll_interval(Duration::from_secs(60));
    let waiter = coord_postgres::connect(&url)
        .await
        .unwrap()
        .with_poll_interval(Duration::from_secs(60));
    let ttl = Duration::from_secs(30);
    let g = holder
        .locks()
        .unwrap()
        .try_acquire("busy", ttl)
        .await
        .unwrap()
        .expect("free");
    let waiting = tokio::spawn({
        let locks = waiter.locks().unwrap();
        async move { locks.acquire("busy", ttl, Duration::from_secs(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let woken = Instant::now();
    g.release().await.unwrap();
    let g = waiting.await.unwrap().expect("woken by NOTIFY");
    assert!(woken.elapsed() < Duration::from_secs(5));
    g.release().await.unwrap();

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
    let channel = format!("{schema}_wake");
    client
        .batch_execute(&format!("LISTEN \"{channel}\""))
        .await
        .unwrap();
    let locks = holder.locks().unwrap();
    for _ in 0..10 {
        let g = locks.try_acquire("busy", ttl).await.unwrap().expect("free");
        g.release().await.unwrap();
    }
    client
        .query("SELECT pg_notify($1, 'marker')", &[&channel])
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the marker arrives")
        .expect("a payload");
    assert_eq!(first, "marker", "a release nobody waited for notified");
}
