//! Claim rows reused in place, under races: each race the reuse opens is
//! forced deterministically, with a second connection holding a
//! transaction open at the exact point (a take, an extend, the sweep's
//! delete, a new name's insert) while the backend's statement waits behind
//! it, then committing or rolling back; a fault-injected stall between a
//! take's token draw and its row lock checks that the re-check
//! (EvalPlanQual) draws again; a churn of grants, releases, expiries,
//! stale releases and extends and a grace-0 sweep checks that no two
//! owners hold a name at once and tokens rise; and a layout-10 client
//! beside upgraded ones checks the upgrade caveat's bound.

use crate::support;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conformance::testkit::postgres::cluster;
use coord_core::{Attempt, Election, FencingToken, Lease, Lock, OwnerToken};
use coord_postgres::PostgresBackend;
use coord_postgres::tokio_postgres::Client;
use futures::StreamExt;
use support::{granted, psql, raw, unique, wait_blocked};

const GRACE: Duration = Duration::from_millis(100);

async fn backend_with(schema: &str, grace: Duration) -> Arc<PostgresBackend> {
    coord_postgres::builder(&cluster().url())
        .schema(schema.to_string())
        .idle_grace(grace)
        .sweep_every(None)
        .connect_backend()
        .await
        .expect("connect")
}

async fn backend(schema: &str) -> Arc<PostgresBackend> {
    backend_with(schema, GRACE).await
}

/// The text of `claim_take` without metadata (src/sql.rs), for a raw
/// connection to run inside a transaction it keeps open.
fn take_sql(schema: &str) -> String {
    let s = format!("\"{schema}\"");
    format!(
        "WITH l AS MATERIALIZED (SELECT 1 AS ok \
           WHERE CASE WHEN current_setting('transaction_isolation') = 'read committed' THEN true \
                      ELSE {s}.not_read_committed() END), \
         u AS ( \
           UPDATE {s}.claims c \
              SET owner = $3::bytea, candidate = $4::text, fencing = {s}.fencing_next(), \
                  metadata = NULL::bytea, \
                  expires_at = clock_timestamp() + $5::int8 * interval '1 microsecond', \
                  waiting = c.owner IS NOT NULL AND c.waiting \
             FROM l \
            WHERE c.kind = $1::text AND c.name = $2::text \
              AND (c.owner IS NULL OR c.expires_at <= clock_timestamp()) \
           RETURNING c.fencing) \
         SELECT u.fencing FROM u \
         UNION ALL \
         SELECT i.f FROM ( \
           SELECT {s}.claim_insert($1::text, $2::text, $3::bytea, $4::text, $5::int8, NULL::bytea, NULL::int8) AS f \
             FROM l \
            WHERE NOT EXISTS (SELECT 1 FROM {s}.claims x WHERE x.kind = $1::text AND x.name = $2::text) \
           OFFSET 0) i \
          WHERE i.f IS NOT NULL"
    )
}

/// The text of `claim_extend` (src/sql.rs).
fn extend_sql(schema: &str) -> String {
    let s = format!("\"{schema}\"");
    format!(
        "WITH l AS MATERIALIZED (SELECT 1 FROM {s}.claims c \
           WHERE c.kind = $1::text AND c.name = $2::text AND c.owner = $3::bytea FOR UPDATE), \
         n AS MATERIALIZED (SELECT clock_timestamp() AS t FROM l) \
         UPDATE {s}.claims c SET expires_at = n.t + $4::int8 * interval '1 microsecond' FROM n \
          WHERE c.kind = $1::text AND c.name = $2::text AND c.owner = $3::bytea AND c.expires_at > n.t \
         RETURNING 1"
    )
}

/// A raw take of `name` (kind lock) by `owner`: the token, if granted.
async fn raw_take(
    c: &Client,
    schema: &str,
    name: &str,
    owner: &OwnerToken,
    ttl_us: i64,
) -> Option<i64> {
    let owner: &[u8] = owner.as_bytes();
    let rows = c
        .query(
            &take_sql(schema),
            &[&"lock", &name, &owner, &None::<String>, &ttl_us],
        )
        .await
        .expect("raw take");
    assert!(rows.len() <= 1, "a take returned {} rows", rows.len());
    rows.first().map(|r| r.get(0))
}

/// The row of a lock name as text: owner hex | fencing | expires_at | xmin | waiting.
fn row(schema: &str, name: &str) -> String {
    psql(&format!(
        "SELECT coalesce(encode(owner, 'hex'), '-') || '|' || fencing || '|' || expires_at \
                || '|' || xmin || '|' || waiting \
           FROM \"{schema}\".claims WHERE kind = 'lock' AND name = '{name}'"
    ))
}

/// EvalPlanQual, take vs take: a take waiting for the row lock of another
/// take in flight on the same free row is refused once that one commits
/// (the holder keeps its token), and granted with a higher token once it
/// rolls back. Also for a new name (the waiting take's placeholder insert
/// waits for the other's index entry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_waiting_behind_another_take_wins_only_if_that_one_rolls_back() {
    let schema = unique("rv_tt");
    let b = backend(&schema).await;
    let ttl = Duration::from_secs(30);
    for (fresh, commit) in [(false, true), (false, false), (true, true), (true, false)] {
        let name = format!("n_{fresh}_{commit}");
        let mut before = FencingToken(0);
        if !fresh {
            let x = OwnerToken::random();
            before = granted(b.try_acquire(&name, &x, ttl).await.unwrap());
            assert!(Lock::release(&*b, &name, &x).await.unwrap());
        }
        let c1 = raw().await;
        c1.batch_execute("BEGIN").await.unwrap();
        let a = OwnerToken::random();
        let ta = raw_take(&c1, &schema, &name, &a, 30_000_000)
            .await
            .expect("the first take is granted");
        assert!(ta as u64 > before.get());
        let bo = OwnerToken::random();
        let waiting = tokio::spawn({
            let (b, name, bo) = (b.clone(), name.clone(), bo);
            async move { b.try_acquire(&name, &bo, ttl).await.unwrap() }
        });
        wait_blocked(&schema, 1).await;
        assert!(!waiting.is_finished());
        c1.batch_execute(if commit { "COMMIT" } else { "ROLLBACK" })
            .await
            .unwrap();
        let r = waiting.await.unwrap();
        let holders = Lock::inspect(&*b, &name).await.unwrap().holders;
        assert_eq!(holders.len(), 1, "{name}: holders {holders:?}");
        if commit {
            assert!(
                !matches!(r, Attempt::Granted(_)),
                "{name}: granted {r:?} while {ta} is held"
            );
            assert_eq!(holders[0].owner, a);
            assert_eq!(holders[0].token.get(), ta as u64);
        } else {
            let tb = granted(r);
            assert!(tb.get() > ta as u64, "{name}: {tb:?} after a drawn {ta}");
            assert_eq!(holders[0].owner, bo);
        }
        assert_eq!(
            psql(&format!(
                "SELECT count(*) FROM \"{schema}\".claims WHERE name = '{name}'"
            )),
            "1"
        );
    }
}

/// EvalPlanQual, take vs extend: the holder's extend runs before its
/// expiry but commits after it. A take that saw the old, expired version
/// waits for the extend's row lock and is then refused; the holder keeps
/// its token and the extended expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_of_an_expired_version_waiting_behind_its_extend_is_refused() {
    let schema = unique("rv_te");
    let b = backend(&schema).await;
    let x = OwnerToken::random();
    let tx = granted(
        b.try_acquire("e", &x, Duration::from_millis(400))
            .await
            .unwrap(),
    );
    let c1 = raw().await;
    c1.batch_execute("BEGIN").await.unwrap();
    let xb: &[u8] = x.as_bytes();
    let n = c1
        .query(&extend_sql(&schema), &[&"lock", &"e", &xb, &30_000_000i64])
        .await
        .unwrap();
    assert_eq!(n.len(), 1, "the live holder's extend");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let bo = OwnerToken::random();
    let waiting = tokio::spawn({
        let b = b.clone();
        async move {
            b.try_acquire("e", &bo, Duration::from_secs(30))
                .await
                .unwrap()
        }
    });
    wait_blocked(&schema, 1).await;
    c1.batch_execute("COMMIT").await.unwrap();
    let r = waiting.await.unwrap();
    assert!(
        !matches!(r, Attempt::Granted(_)),
        "taken ({r:?}) over an extended holder"
    );
    let h = Lock::inspect(&*b, "e").await.unwrap().holders;
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].owner, x);
    assert_eq!(h[0].token, tx);
    assert!(h[0].remaining.unwrap() > Duration::from_secs(20));
}

/// A stale owner's release and extend that wait behind a takeover of its
/// expired row change nothing once the takeover commits (the new holder's
/// row is byte for byte the same, same xmin), and report NotHeld; after a
/// rolled-back takeover the stale release frees its own expired row
/// (reporting NotHeld) and the extend resurrects nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_release_and_extend_behind_a_takeover_change_nothing() {
    let schema = unique("rv_st");
    let b = backend(&schema).await;
    for commit in [true, false] {
        let name = format!("s_{commit}");
        let a = OwnerToken::random();
        let t0 = granted(
            b.try_acquire(&name, &a, Duration::from_millis(300))
                .await
                .unwrap(),
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
        let c1 = raw().await;
        c1.batch_execute("BEGIN").await.unwrap();
        let nb = OwnerToken::random();
        let tb = raw_take(&c1, &schema, &name, &nb, 30_000_000)
            .await
            .expect("a takeover of the expired row");
        assert!(tb as u64 > t0.get());
        let rel = tokio::spawn({
            let (b, name) = (b.clone(), name.clone());
            async move { Lock::release(&*b, &name, &a).await.unwrap() }
        });
        let ext = tokio::spawn({
            let (b, name) = (b.clone(), name.clone());
            async move {
                Lock::extend(&*b, &name, &a, Duration::from_secs(60))
                    .await
                    .unwrap()
            }
        });
        wait_blocked(&schema, 2).await;
        c1.batch_execute(if commit { "COMMIT" } else { "ROLLBACK" })
            .await
            .unwrap();
        let after_commit = row(&schema, &name);
        assert!(!rel.await.unwrap(), "a stale release reported held");
        assert!(!ext.await.unwrap(), "a stale extend succeeded");
        let now = row(&schema, &name);
        if commit {
            assert_eq!(now, after_commit, "the stale owner's calls changed the row");
            assert!(now.starts_with(&nb.to_hex()), "{now}");
            let h = Lock::inspect(&*b, &name).await.unwrap().holders;
            assert_eq!(h[0].owner, nb);
            assert_eq!(h[0].token.get(), tb as u64);
        } else {
            assert!(Lock::inspect(&*b, &name).await.unwrap().holders.is_empty());
            let next = granted(
                b.try_acquire(&name, &OwnerToken::random(), Duration::from_secs(30))
                    .await
                    .unwrap(),
            );
            assert!(next.get() > tb as u64);
        }
        // A second stale round, on the settled row: nothing changes.
        let settled = row(&schema, &name);
        assert!(!Lock::release(&*b, &name, &a).await.unwrap());
        assert!(
            !Lock::extend(&*b, &name, &a, Duration::from_secs(60))
                .await
                .unwrap()
        );
        assert_eq!(row(&schema, &name), settled);
    }
}

/// The sweep's delete in flight: takes that saw the row (one raw, one by
/// the backend) wait for it, find it deleted, and the backend's attempt
/// then grants a new row with a higher token than the swept one; a raw
/// take on the deleted version grants nothing. Released and expired rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takes_waiting_behind_the_sweeps_delete_get_a_new_row_with_a_higher_token() {
    let schema = unique("rv_sw");
    let b = backend(&schema).await;
    for release in [true, false] {
        let name = format!("w_{release}");
        let x = OwnerToken::random();
        // Long enough for the release right after the grant to find it
        // held on a loaded machine.
        let ttl = Duration::from_secs(1);
        let tx = granted(b.try_acquire(&name, &x, ttl).await.unwrap());
        if release {
            assert!(Lock::release(&*b, &name, &x).await.unwrap());
        }
        tokio::time::sleep(ttl + GRACE + Duration::from_millis(150)).await;
        let c1 = raw().await;
        c1.batch_execute("BEGIN").await.unwrap();
        let n: i64 = c1
            .query_one(
                &format!("SELECT \"{schema}\".sweep(100000, 86400000000, 1000)"),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(n >= 1, "the sweep deleted {n}");
        let c2 = raw().await;
        let other = OwnerToken::random();
        let raw_waiting = tokio::spawn({
            let (schema, name) = (schema.clone(), name.clone());
            async move {
                c2.batch_execute("BEGIN").await.unwrap();
                let t = raw_take(&c2, &schema, &name, &other, 30_000_000).await;
                (c2, t)
            }
        });
        let bo = OwnerToken::random();
        let waiting = tokio::spawn({
            let (b, name) = (b.clone(), name.clone());
            async move {
                b.try_acquire(&name, &bo, Duration::from_secs(30))
                    .await
                    .unwrap()
            }
        });
        wait_blocked(&schema, 2).await;
        c1.batch_execute("COMMIT").await.unwrap();
        let (c2, t_raw) = raw_waiting.await.unwrap();
        let r = waiting.await.unwrap();
        // The raw take ran on a snapshot with the row: it grants nothing.
        let tb = granted(r);
        assert!(tb > tx, "{tb:?} after a swept {tx:?}");
        assert_eq!(t_raw, None, "a take of a deleted version granted {t_raw:?}");
        c2.batch_execute("COMMIT").await.unwrap();
        let h = Lock::inspect(&*b, &name).await.unwrap().holders;
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].owner, bo);
        assert_eq!(
            psql(&format!(
                "SELECT count(*) FROM \"{schema}\".claims WHERE name = '{name}'"
            )),
            "1"
        );
    }
}

/// Installs a wrapper of `fencing_next` that, in sessions with
/// `coordtest.stall = on`, records each drawn token and then sleeps
/// `stall_ms` (a take descheduled between its draw and its row lock).
fn stall_draws(schema: &str, stall_ms: u64) {
    psql(&format!(
        "CREATE TABLE \"{schema}\".draws (at timestamptz DEFAULT clock_timestamp(), v bigint); \
         CREATE OR REPLACE FUNCTION \"{schema}\".fencing_next() RETURNS bigint LANGUAGE plpgsql AS $f$ \
         DECLARE v bigint := \"{schema}\".timeline_next('\"{schema}\".fencing', 0); \
         BEGIN \
           IF current_setting('coordtest.stall', true) = 'on' THEN \
             INSERT INTO \"{schema}\".draws (v) VALUES (v); \
             PERFORM pg_sleep({stall_ms} / 1000.0); \
           END IF; \
           RETURN v; \
         END $f$"
    ));
}

/// A take stalls between drawing its token (in the UPDATE's projection,
/// before the row lock) and locking the row; meanwhile another client takes
/// the row with a higher token and releases it. The stalled take must not
/// store its early token: the re-check on the newest version draws again
/// (tokens rise), or, if the row is held, grants nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_stalled_after_its_draw_draws_again_on_the_newest_version() {
    let schema = unique("rv_stall");
    let b = backend(&schema).await;
    let ttl = Duration::from_secs(30);
    // Rows first (free), then the wrapper.
    for name in ["freed", "held", "by_acquire"] {
        let x = OwnerToken::random();
        granted(b.try_acquire(name, &x, ttl).await.unwrap());
        assert!(Lock::release(&*b, name, &x).await.unwrap());
    }
    stall_draws(&schema, 800);
    for name in ["freed", "held", "by_acquire"] {
        let slow = OwnerToken::random();
        let stalled = tokio::spawn({
            let schema = schema.clone();
            async move {
                let c = raw().await;
                c.batch_execute("SET coordtest.stall = 'on'").await.unwrap();
                if name == "by_acquire" {
                    // claim_acquire (waiting clients, elections): its
                    // UPDATE draws in the same place.
                    let o: &[u8] = slow.as_bytes();
                    let r = c
                        .query_one(
                            &format!(
                                "SELECT granted FROM \"{schema}\".claim_acquire($1::text, $2::text, \
                                 $3::bytea, NULL::text, $4::int8, 'ch', false, false, NULL::bytea, NULL::int8)"
                            ),
                            &[&"lock", &name, &o, &30_000_000i64],
                        )
                        .await
                        .unwrap();
                    r.get::<_, Option<i64>>(0)
                } else {
                    raw_take(&c, &schema, name, &slow, 30_000_000).await
                }
            }
        });
        // Wait for the first draw: the stalled take sleeps in it (its
        // draws row is not visible before it commits).
        let watcher = raw().await;
        let start = Instant::now();
        loop {
            let k: i64 = watcher
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                      WHERE wait_event = 'PgSleep' AND query LIKE '%' || $1::text || '%'",
                    &[&schema],
                )
                .await
                .unwrap()
                .get(0);
            if k > 0 {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(5), "never stalled");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let fast = OwnerToken::random();
        let tf = granted(b.try_acquire(name, &fast, ttl).await.unwrap());
        if name != "held" {
            assert!(Lock::release(&*b, name, &fast).await.unwrap());
        }
        let got = stalled.await.unwrap();
        let early: i64 = psql(&format!("SELECT min(v) FROM \"{schema}\".draws"))
            .parse()
            .unwrap();
        assert!(
            tf.get() > early as u64,
            "the fast grant {tf:?} drew after {early}"
        );
        let draws = psql(&format!(
            "SELECT string_agg(v::text, ',' ORDER BY at) FROM \"{schema}\".draws"
        ));
        println!("{name}: early {early}, fast {tf:?}, stalled take got {got:?}, draws {draws}");
        if name != "held" {
            assert_eq!(
                draws.split(',').count(),
                2,
                "{name}: one draw before, one after the re-check"
            );
            let t = got.expect("the free row is taken after the re-check");
            assert!(
                t as u64 > tf.get(),
                "the stalled take stored {t} after a grant of {tf:?} (draws {draws})"
            );
        } else {
            assert_eq!(got, None, "granted over a live holder");
            let h = Lock::inspect(&*b, name).await.unwrap().holders;
            assert_eq!(h[0].owner, fast);
        }
        psql(&format!("TRUNCATE \"{schema}\".draws"));
    }
}

/// Elections on reused rows: every new leadership's term is higher (after a
/// resign, after an expiry, after a second resign by the same candidate),
/// a stale leader's renew and resign change nothing, and an observer
/// (polling every 60 s, so woken by NOTIFY alone) sees every new term
/// within a few seconds, never a term going back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_terms_rise_over_reused_rows_and_observers_hear_them() {
    let schema = unique("rv_el");
    let b = backend(&schema).await;
    let url = format!("{}&coord_schema={schema}", cluster().url());
    let watcher = coord_postgres::connect(&url)
        .await
        .unwrap()
        .with_poll_interval(Duration::from_secs(60));
    let elections = watcher.elections().unwrap();
    let mut stream = Box::pin(elections.observe("office").unwrap());
    let first = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("the first state")
        .unwrap()
        .unwrap();
    assert!(first.is_none());
    let seen: Arc<Mutex<Vec<Option<u64>>>> = Arc::default();
    let collector = tokio::spawn({
        let seen = seen.clone();
        async move {
            while let Some(item) = stream.next().await {
                let item = item.unwrap();
                seen.lock().unwrap().push(item.map(|l| l.term.get()));
            }
        }
    });
    let wait_seen = |term: u64| {
        let seen = seen.clone();
        async move {
            let start = Instant::now();
            loop {
                if seen.lock().unwrap().contains(&Some(term)) {
                    return;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "the observer never saw term {term}: {:?}",
                    seen.lock().unwrap()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let long = Duration::from_secs(30);
    let (a, bb, c) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let t1 = granted(b.try_campaign("office", "a", &a, long).await.unwrap());
    wait_seen(t1.get()).await;
    assert!(b.resign("office", &a).await.unwrap());
    assert!(b.leader("office").await.unwrap().is_none());
    let t2 = granted(
        b.try_campaign("office", "b", &bb, Duration::from_millis(300))
            .await
            .unwrap(),
    );
    assert!(t2 > t1);
    wait_seen(t2.get()).await;
    // a is stale: its renew and resign change nothing.
    assert!(!Election::renew(&*b, "office", &a, long).await.unwrap());
    assert!(!b.resign("office", &a).await.unwrap());
    assert_eq!(b.leader("office").await.unwrap().unwrap().term, t2);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let t3 = granted(b.try_campaign("office", "c", &c, long).await.unwrap());
    assert!(t3 > t2);
    wait_seen(t3.get()).await;
    // b expired and was replaced: stale.
    assert!(!Election::renew(&*b, "office", &bb, long).await.unwrap());
    assert!(!b.resign("office", &bb).await.unwrap());
    let l = b.leader("office").await.unwrap().unwrap();
    assert_eq!((l.candidate.as_str(), l.term), ("c", t3));
    // A repeat by the live leader keeps its term.
    assert_eq!(
        granted(b.try_campaign("office", "c", &c, long).await.unwrap()),
        t3
    );
    assert!(b.resign("office", &c).await.unwrap());
    let t4 = granted(b.try_campaign("office", "c", &c, long).await.unwrap());
    assert!(t4 > t3, "a new term after resigning: {t4:?} after {t3:?}");
    wait_seen(t4.get()).await;
    collector.abort();
    let seen = seen.lock().unwrap().clone();
    let terms: Vec<u64> = seen.iter().flatten().copied().collect();
    for w in terms.windows(2) {
        assert!(w[1] >= w[0], "terms went back: {seen:?}");
    }
}

/// Leases and force release on reused rows: a force-released lock's former
/// holder cannot release, extend or take back the row's next grant; a
/// revoked lease's owner cannot renew after another's grant of the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_and_revoke_leave_no_handle_on_the_reused_row() {
    let schema = unique("rv_fr");
    let b = backend(&schema).await;
    let long = Duration::from_secs(30);
    let (a, n) = (OwnerToken::random(), OwnerToken::random());
    let t1 = granted(b.try_acquire("f", &a, long).await.unwrap());
    assert!(b.force_release("f").await.unwrap());
    assert!(
        !b.force_release("f").await.unwrap(),
        "a free row force-released"
    );
    let t2 = granted(b.try_acquire("f", &n, long).await.unwrap());
    assert!(t2 > t1);
    let settled = row(&schema, "f");
    assert!(!Lock::extend(&*b, "f", &a, long).await.unwrap());
    assert!(!Lock::release(&*b, "f", &a).await.unwrap());
    assert!(matches!(
        b.try_acquire("f", &a, long).await.unwrap(),
        Attempt::Held { .. }
    ));
    assert_eq!(row(&schema, "f"), settled);
    let l1 = granted(b.grant("l", &a, long).await.unwrap());
    assert!(b.revoke("l", &a).await.unwrap());
    assert!(
        !Lease::renew(&*b, "l", &a, long).await.unwrap(),
        "renewed a revoked lease"
    );
    assert!(b.remaining("l").await.unwrap().is_none());
    let l2 = granted(b.grant("l", &n, long).await.unwrap());
    assert!(l2 > l1);
    assert!(!Lease::renew(&*b, "l", &a, long).await.unwrap());
    assert!(!b.revoke("l", &a).await.unwrap());
    assert!(b.remaining("l").await.unwrap().unwrap() > Duration::from_secs(20));
}

/// Per name, the current holder as the clients know it: owner, and the
/// latest instant the server's grant can have ended by (a lower bound of
/// its expiry: the send time of the grant or extend plus the TTL).
type Holders = HashMap<String, (OwnerToken, Instant, u64)>;

/// 10 tasks on 6 names for 6 s with a sweeper at grace 0 in a loop: grants
/// (with and without metadata, through waiting acquires too), releases,
/// extends, grants left to expire (40 ms), and stale releases and extends
/// of earlier owners. A grant while another owner's grant is surely live
/// (its send time plus TTL not yet passed, not released) is a double
/// grant; tokens of grants recorded in time must rise; a stale release or
/// extend must report NotHeld.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_double_grant_and_rising_tokens_under_churn_with_a_grace_0_sweep() {
    churn(6, 30).await;
}

/// The same on ONE name, 10 tasks with no pause between cycles: every
/// attempt races the others' takes, releases, stale calls and the sweep
/// on the same row (the EvalPlanQual re-checks under full contention).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_double_grant_and_rising_tokens_on_one_hot_name() {
    churn(1, 1).await;
}

async fn churn(names: u64, pause_ms: u64) {
    let schema = unique("rv_churn");
    let b = backend_with(&schema, Duration::ZERO).await;
    let sweeper = backend_with(&schema, Duration::ZERO).await;
    let ttl = Duration::from_millis(40);
    let holders: Arc<Mutex<Holders>> = Arc::default();
    let stale: Arc<Mutex<Vec<(String, OwnerToken)>>> = Arc::default();
    let tokens: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let swept = Arc::new(AtomicU64::new(0));
    let grants = Arc::new(AtomicU64::new(0));
    let sweeping = {
        let (stop, swept) = (stop.clone(), swept.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                swept.fetch_add(sweeper.sweep().await.unwrap(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let mut tasks = Vec::new();
    for k in 0..10u64 {
        let tokens = tokens.clone();
        let (b, holders, stale, stop, grants) = (
            b.clone(),
            holders.clone(),
            stale.clone(),
            stop.clone(),
            grants.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut r: u64 = k * 7919 + 1;
            let mut next = || {
                r = r
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                r >> 33
            };
            while !stop.load(Ordering::Relaxed) {
                // Now and then, a stale owner's release or extend.
                if next() % 3 == 0 {
                    let s = stale.lock().unwrap().pop();
                    if let Some((key, sowner)) = s {
                        let (lease, sname) = split(&key);
                        let rel = next() % 2 == 0;
                        let ok = match (lease, rel) {
                            (false, true) => Lock::release(&*b, sname, &sowner).await.unwrap(),
                            (false, false) => Lock::extend(&*b, sname, &sowner, ttl).await.unwrap(),
                            (true, true) => b.revoke(sname, &sowner).await.unwrap(),
                            (true, false) => Lease::renew(&*b, sname, &sowner, ttl).await.unwrap(),
                        };
                        assert!(
                            !ok,
                            "{key}: a stale owner's {} succeeded",
                            if rel { "release" } else { "extend" }
                        );
                    }
                }
                let lease = next() % 4 == 0;
                let name = format!("c{}", next() % names);
                let key = format!("{}:{name}", if lease { "lease" } else { "lock" });
                let owner = OwnerToken::random();
                let sent = Instant::now();
                let attempt = match (lease, next() % 2) {
                    (true, _) => b.grant(&name, &owner, ttl).await.unwrap(),
                    (false, 0) => b.try_acquire(&name, &owner, ttl).await.unwrap(),
                    (false, _) => b
                        .try_acquire_with_metadata(&name, &owner, ttl, b"m")
                        .await
                        .unwrap(),
                };
                let Attempt::Granted(t) = attempt else {
                    tokio::time::sleep(Duration::from_millis(next() % 3)).await;
                    continue;
                };
                grants.fetch_add(1, Ordering::Relaxed);
                let now = Instant::now();
                // Only a grant recorded within its TTL of the send is known
                // to have been live when recorded (else a later grant may
                // already have been recorded before it).
                if now.duration_since(sent) < ttl {
                    let mut last = tokens.lock().unwrap();
                    let prev = last.insert(key.clone(), t.get()).unwrap_or(0);
                    assert!(t.get() > prev, "{key}: token {t:?} after {prev} (in grant order)");
                    drop(last);
                    let mut h = holders.lock().unwrap();
                    if let Some((prev, until, prev_t)) = h.get(&key).copied() {
                        assert!(
                            prev == owner || until <= now,
                            "{key}: granted {t:?} to a new owner while {prev_t} was surely live \
                             ({:?} left)",
                            until - now
                        );
                        assert!(t.get() > prev_t, "{key}: token {t:?} after {prev_t}");
                    }
                    h.insert(key.clone(), (owner, sent + ttl, t.get()));
                }
                let release = |b: Arc<PostgresBackend>, name: String, owner: OwnerToken| async move {
                    if lease {
                        b.revoke(&name, &owner).await.unwrap()
                    } else {
                        Lock::release(&*b, &name, &owner).await.unwrap()
                    }
                };
                match next() % 4 {
                    0 => {
                        // Extend once, then release.
                        let sent = Instant::now();
                        let ok = if lease {
                            Lease::renew(&*b, &name, &owner, ttl).await.unwrap()
                        } else {
                            Lock::extend(&*b, &name, &owner, ttl).await.unwrap()
                        };
                        if ok {
                            let mut h = holders.lock().unwrap();
                            if let Some(e) = h.get_mut(&key) {
                                if e.0 == owner {
                                    e.1 = e.1.max(sent + ttl);
                                }
                            }
                        }
                        holders.lock().unwrap().retain(|_, e| e.0 != owner);
                        release(b.clone(), name.clone(), owner).await;
                    }
                    1 | 2 => {
                        holders.lock().unwrap().retain(|_, e| e.0 != owner);
                        release(b.clone(), name.clone(), owner).await;
                    }
                    _ => {} // left to expire
                }
                // Stale from here on: released, or left to expire and
                // checked only once its TTL surely passed.
                let stale = stale.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(ttl + Duration::from_millis(20)).await;
                    stale.lock().unwrap().push((key, owner));
                });
                tokio::time::sleep(Duration::from_millis(next() % pause_ms)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    sweeping.await.unwrap();
    println!(
        "{} grants, {} rows swept",
        grants.load(Ordering::Relaxed),
        swept.load(Ordering::Relaxed)
    );
    assert!(grants.load(Ordering::Relaxed) > 100);
    assert!(swept.load(Ordering::Relaxed) > 0);
}

fn split(key: &str) -> (bool, &str) {
    let (kind, name) = key.split_once(':').unwrap();
    (kind == "lease", name)
}
/// Wake-ups on reused rows, with 60 s polling (so only NOTIFY wakes): a
/// lock waiter of one client, while a third client (no waiters) takes the
/// row first, (a) right after the holder's release (a grant of a freed row
/// clears the mark) and (b) right at the holder's expiry (a takeover keeps
/// the mark): either way the third client's release wakes the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_after_a_third_client_took_the_reused_row() {
    let schema = unique("rv_wk");
    let url = format!("{}&coord_schema={schema}", cluster().url());
    let client = || async {
        coord_postgres::connect(&url)
            .await
            .unwrap()
            .with_poll_interval(Duration::from_secs(60))
    };
    let (h, w, c) = (client().await, client().await, client().await);
    for expire in [false, true] {
        let name = format!("busy_{expire}");
        let hold = if expire {
            Duration::from_millis(1500)
        } else {
            Duration::from_secs(30)
        };
        let g = h
            .locks()
            .unwrap()
            .try_acquire(&name, hold)
            .await
            .unwrap()
            .expect("free");
        let waiting = tokio::spawn({
            let locks = w.locks().unwrap();
            let name = name.clone();
            async move {
                let g = locks
                    .acquire(&name, Duration::from_secs(30), Duration::from_secs(40))
                    .await;
                (g, Instant::now())
            }
        });
        tokio::time::sleep(Duration::from_millis(400)).await;
        let third = c.locks().unwrap();
        let taken = if expire {
            std::mem::forget(g);
            // Spin from just before the expiry.
            tokio::time::sleep(Duration::from_millis(900)).await;
            let start = Instant::now();
            loop {
                if let Some(t) = third
                    .try_acquire(&name, Duration::from_secs(30))
                    .await
                    .unwrap()
                {
                    break Some(t);
                }
                if waiting.is_finished() || start.elapsed() > Duration::from_secs(3) {
                    break None;
                }
            }
        } else {
            g.release().await.unwrap();
            third
                .try_acquire(&name, Duration::from_secs(30))
                .await
                .unwrap()
        };
        let Some(t) = taken else {
            println!("{name}: the waiter won the race; nothing to check");
            let (g, _) = waiting.await.unwrap();
            g.unwrap().release().await.unwrap();
            continue;
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !waiting.is_finished(),
            "{name}: granted while the third client holds"
        );
        let released = Instant::now();
        t.release().await.unwrap();
        let (g, at) = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .unwrap_or_else(|_| {
                panic!("{name}: the waiter was not woken by the third client's release")
            })
            .unwrap();
        let g = g.expect("granted");
        let after = at.duration_since(released);
        println!("{name}: woken {after:?} after the third client's release");
        assert!(
            after < Duration::from_secs(5),
            "{name}: woken only after {after:?}"
        );
        g.release().await.unwrap();
    }
}

/// Metadata and candidates never carry over a reused row: a takeover of an
/// expired holder's row (by the one-statement take and by claim_acquire, a
/// waiting client's path) and a grant of a freed row show none of the
/// earlier holder's metadata.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_metadata_survives_a_reused_row() {
    let schema = unique("rv_md");
    let b = backend(&schema).await;
    let short = Duration::from_millis(200);
    for path in ["take", "acquire", "freed"] {
        let name = format!("md_{path}");
        let a = OwnerToken::random();
        granted(
            b.try_acquire_with_metadata(&name, &a, short, b"secret")
                .await
                .unwrap(),
        );
        if path == "freed" {
            assert!(Lock::release(&*b, &name, &a).await.unwrap());
        } else {
            tokio::time::sleep(short + Duration::from_millis(100)).await;
        }
        let n = OwnerToken::random();
        if path == "acquire" {
            let c = raw().await;
            let o: &[u8] = n.as_bytes();
            let r = c
                .query_one(
                    &format!(
                        "SELECT granted FROM \"{schema}\".claim_acquire($1::text, $2::text, \
                         $3::bytea, NULL::text, $4::int8, 'ch', false, true, NULL::bytea, NULL::int8)"
                    ),
                    &[&"lock", &name, &o, &30_000_000i64],
                )
                .await
                .unwrap();
            assert!(r.get::<_, Option<i64>>(0).is_some());
        } else {
            granted(
                b.try_acquire(&name, &n, Duration::from_secs(30))
                    .await
                    .unwrap(),
            );
        }
        let h = Lock::inspect(&*b, &name).await.unwrap().holders;
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].owner, n);
        assert_eq!(
            h[0].metadata, None,
            "{path}: the earlier holder's metadata carried over"
        );
    }
}

/// (a) of the test above, forced: the holder's release and a third
/// owner's take of the freed row commit together (one raw transaction, so
/// the waiter's wake-up always finds the row taken and the mark cleared);
/// the waiter must mark the new grant, and that grant's release (by the
/// backend) must wake it, with 60 s polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_woken_onto_a_row_retaken_in_the_same_commit_is_woken_again() {
    let schema = unique("rv_wk2");
    let url = format!("{}&coord_schema={schema}", cluster().url());
    let b = backend(&schema).await;
    let w = coord_postgres::connect(&url)
        .await
        .unwrap()
        .with_poll_interval(Duration::from_secs(60));
    let (hold, third) = (OwnerToken::random(), OwnerToken::random());
    granted(
        b.try_acquire("busy", &hold, Duration::from_secs(30))
            .await
            .unwrap(),
    );
    let waiting = tokio::spawn({
        let locks = w.locks().unwrap();
        async move {
            let g = locks
                .acquire("busy", Duration::from_secs(30), Duration::from_secs(40))
                .await;
            (g, Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        psql(&format!(
            "SELECT waiting FROM \"{schema}\".claims WHERE name = 'busy'"
        )),
        "t",
        "the waiter marked the holder's row"
    );
    let s = format!("\"{schema}\"");
    let release = format!(
        "UPDATE {s}.claims c SET owner = NULL, candidate = NULL, metadata = NULL \
          WHERE c.kind = $1::text AND c.name = $2::text AND c.owner = $3::bytea \
         RETURNING c.expires_at > clock_timestamp() AS held, \
           CASE WHEN $5::bool OR c.waiting \
                THEN pg_notify($4::text, $1::text || ':' || $2::text) END AS woke"
    );
    let c = raw().await;
    c.batch_execute("BEGIN").await.unwrap();
    let ho: &[u8] = hold.as_bytes();
    let channel = format!("{schema}_wake");
    let r = c
        .query(&release, &[&"lock", &"busy", &ho, &channel, &false])
        .await
        .unwrap();
    assert_eq!(r.len(), 1);
    let t = raw_take(&c, &schema, "busy", &third, 30_000_000).await;
    assert!(t.is_some());
    c.batch_execute("COMMIT").await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !waiting.is_finished(),
        "granted while the third owner holds"
    );
    assert_eq!(
        psql(&format!(
            "SELECT waiting FROM \"{schema}\".claims WHERE name = 'busy'"
        )),
        "t",
        "the woken waiter marked the third owner's grant again"
    );
    let released = Instant::now();
    assert!(Lock::release(&*b, "busy", &third).await.unwrap());
    let (g, at) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter was not woken by the third owner's release")
        .unwrap();
    let after = at.duration_since(released);
    assert!(after < Duration::from_secs(5), "woken only after {after:?}");
    g.unwrap().release().await.unwrap();
}
