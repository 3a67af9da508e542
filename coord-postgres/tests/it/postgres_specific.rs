//! PostgreSQL-specific behaviour: first use by many clients at once, SCRAM
//! authentication, the fenced-write helper, PgBouncer with a direct LISTEN
//! URL, the database clock, and the listener's lifetime.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use conformance::testkit::postgres::{cluster, pgbouncer};
use coord_core::{Attempt, Error, FencingToken, Lock, OwnerToken};
use coord_postgres::tokio_postgres::types::Type;
use coord_postgres::{FencedTable, FencedWrite};

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// 8 clients start together on an empty database: every one connects
/// (creating the schema under the advisory lock) and works. Directly (a
/// fresh database each round), and through PgBouncer (a fresh schema each
/// round in one database, so the clients' DDL runs on server connections
/// that are open already and have looked the schema up, finding none,
/// before the first client created it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_use_on_an_empty_database() {
    let shared = unique("bounced");
    cluster().create_database(&shared);
    for round in 0..8 {
        let bounced = round % 2 == 1;
        let (url, db, schema) = if bounced {
            (
                pgbouncer().url_for(&shared),
                shared.clone(),
                unique("first"),
            )
        } else {
            let db = unique("empty");
            (cluster().create_database(&db), db, "coord".to_string())
        };
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(8));
        let mut tasks = Vec::new();
        for i in 0..8 {
            let (url, schema, start) = (url.clone(), schema.clone(), start.clone());
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                let coord = coord_postgres::builder(&url)
                    .schema(schema)
                    // No LISTEN probe through PgBouncer (it waits 2 s).
                    .listen(!bounced)
                    .connect()
                    .await
                    .unwrap_or_else(|e| {
                        panic!("round {round} (via PgBouncer: {bounced}) client {i}: {e}")
                    });
                let g = coord
                    .locks()
                    .unwrap()
                    .acquire(
                        "first-use",
                        Duration::from_secs(10),
                        Duration::from_secs(20),
                    )
                    .await
                    .expect("lock on the fresh schema");
                let t = g.fencing_token();
                g.release().await.unwrap();
                t
            }));
        }
        let mut tokens = Vec::new();
        for t in tasks {
            tokens.push(t.await.unwrap());
        }
        tokens.sort();
        tokens.dedup();
        assert_eq!(tokens.len(), 8, "every grant got its own token");
        let tables = cluster().psql(
            &db,
            &format!("SELECT count(*) FROM pg_tables WHERE schemaname = '{schema}'"),
        );
        assert_eq!(
            tables.trim(),
            "13",
            "meta, claims, barriers, limiter_state, limiter_log, semaphore_holders, \
             semaphore_queue, semaphore_left, queue_messages, queue_groups, queue_lanes, \
             queue_dedup, queue_abandoned"
        );
    }
}

/// A role with a SCRAM password: the right password works; a wrong one is
/// a clear, non-retryable error that contains neither password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_role_right_and_wrong_password() {
    let db = unique("scramdb");
    cluster().create_database(&db);
    let user = unique("alice");
    let right = "S3cret-right_pw";
    let url = cluster().create_role(&user, right, &db);
    let coord = coord_postgres::connect(&url)
        .await
        .expect("the right password connects");
    let g = coord
        .locks()
        .unwrap()
        .try_acquire("scram", Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free");
    g.release().await.unwrap();
    assert!(!format!("{coord:?}").contains(right));

    let wrong = "Wr0ng-pw_guess";
    let bad_url = cluster().url_as(&user, wrong, &db);
    let e = coord_postgres::connect(&bad_url)
        .await
        .expect_err("a wrong password must fail");
    let text = format!("{e} / {e:?}");
    assert!(
        text.contains("password authentication failed"),
        "the error says what is wrong: {text}"
    );
    assert!(!text.contains(wrong) && !text.contains(right), "{text}");
    assert!(matches!(e, Error::Store { .. }), "{e:?}");
    assert!(!e.is_retryable(), "a wrong password is not worth retrying");

    let builder = coord_postgres::builder(&bad_url).listen_url(&url);
    assert!(!format!("{builder:?}").contains(wrong));
    assert!(!format!("{builder:?}").contains(right));
}

/// Nothing listens on this port: the error is Unavailable (retryable) and
/// has no password in it.
#[tokio::test]
async fn unreachable_server_is_unavailable_without_password() {
    let port = conformance::testkit::port::free_port();
    let e = coord_postgres::builder(&format!(
        "postgres://bob:Hunter2pw@127.0.0.1:{port}/x?sslmode=disable"
    ))
    .connect_timeout(Duration::from_secs(2))
    .connect()
    .await
    .expect_err("nobody listens");
    assert!(e.is_retryable(), "{e:?}");
    assert!(!format!("{e} {e:?}").contains("Hunter2pw"), "{e}");
}

/// The fenced-write helper applies a write iff its token is >= the row's
/// stored token, and rejects a stale holder's late write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_write_rejects_a_stale_token() {
    let schema = unique("fence");
    let backend = coord_postgres::builder(&cluster().url())
        .schema(schema.clone())
        .connect_backend()
        .await
        .unwrap();
    let client = backend.pool().get().await.unwrap();
    let table = unique("accounts");
    client
        .batch_execute(&format!(
            "CREATE TABLE \"{table}\" (id text PRIMARY KEY, balance bigint NOT NULL, \
             fencing_token bigint NOT NULL DEFAULT 0); \
             INSERT INTO \"{table}\" VALUES ('acct-1', 100, 0)"
        ))
        .await
        .unwrap();
    let fenced = FencedTable::new(&table, "id", "fencing_token").unwrap();
    let coord = backend.coord();
    let locks = coord.locks().unwrap();

    // Holder 1 takes the lock, then loses it (forced release stands in for
    // an expiry behind its back); holder 2 takes it and writes.
    let g1 = locks
        .try_acquire("acct-1", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let t1 = g1.fencing_token();
    assert!(locks.force_release("acct-1").await.unwrap());
    let g2 = locks
        .try_acquire("acct-1", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let t2 = g2.fencing_token();
    assert!(t2 > t1);
    let key = "acct-1";
    let v = 150_i64;
    let w = fenced
        .update(
            &**client,
            (&key, Type::TEXT),
            t2,
            &[("balance", &v, Type::INT8)],
        )
        .await
        .unwrap();
    assert_eq!(w, FencedWrite::Applied);
    // The same token again is accepted (>=).
    let v = 160_i64;
    assert!(
        fenced
            .update(
                &**client,
                (&key, Type::TEXT),
                t2,
                &[("balance", &v, Type::INT8)]
            )
            .await
            .unwrap()
            .applied()
    );
    // Holder 1 wakes up late and writes: refused, nothing changed.
    let stale = 1_i64;
    let w = fenced
        .update(
            &**client,
            (&key, Type::TEXT),
            t1,
            &[("balance", &stale, Type::INT8)],
        )
        .await
        .unwrap();
    assert_eq!(w, FencedWrite::Stale);
    let row = client
        .query_one(
            &format!("SELECT balance, fencing_token FROM \"{table}\" WHERE id = 'acct-1'"),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 160);
    assert_eq!(row.get::<_, i64>(1) as u64, t2.get());
    // Missing rows are told apart; upsert inserts them, then fences them.
    let other = "acct-2";
    assert_eq!(
        fenced
            .update(
                &**client,
                (&other, Type::TEXT),
                t2,
                &[("balance", &v, Type::INT8)]
            )
            .await
            .unwrap(),
        FencedWrite::Missing
    );
    assert!(
        fenced
            .upsert(
                &**client,
                (&other, Type::TEXT),
                t2,
                &[("balance", &v, Type::INT8)]
            )
            .await
            .unwrap()
            .applied()
    );
    assert_eq!(
        fenced
            .upsert(
                &**client,
                (&other, Type::TEXT),
                t1,
                &[("balance", &stale, Type::INT8)]
            )
            .await
            .unwrap(),
        FencedWrite::Stale
    );
    // The key and token columns cannot be set by hand; identifiers are
    // checked.
    assert!(
        fenced
            .update(
                &**client,
                (&key, Type::TEXT),
                t2,
                &[("id", &other, Type::TEXT)]
            )
            .await
            .is_err()
    );
    assert!(FencedTable::new("x; DROP TABLE y", "id", "t").is_err());
    assert!(FencedTable::new("public.accounts", "id", "fencing_token").is_ok());
    g2.release().await.unwrap();
    drop(g1);
}

/// Through PgBouncer with a direct URL for LISTEN: statements are pooled
/// per transaction, wake-ups still come by NOTIFY (the polling fallback is
/// set to a minute, so a prompt wake-up cannot come from polling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_with_a_direct_listen_url_keeps_wakeups() {
    let make = || async {
        coord_postgres::builder(&pgbouncer().url())
            .listen_url(&cluster().url())
            .connect()
            .await
            .unwrap()
            .with_poll_interval(Duration::from_secs(60))
    };
    let (a, b) = (make().await, make().await);
    assert!(a.capabilities().notifications);
    let name = unique("bouncer-wake");
    let held = a
        .locks()
        .unwrap()
        .try_acquire(&name, Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    let locks_b = b.locks().unwrap();
    let n2 = name.clone();
    let waiter = tokio::spawn(async move {
        let t0 = Instant::now();
        let g = locks_b
            .acquire(&n2, Duration::from_secs(60), Duration::from_secs(30))
            .await
            .unwrap();
        let waited = t0.elapsed();
        g.release().await.unwrap();
        waited
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.release().await.unwrap();
    let waited = waiter.await.unwrap();
    assert!(
        waited < Duration::from_secs(5),
        "woken by NOTIFY, not by the 60 s poll: {waited:?}"
    );
}

/// The same, with everything in one URL (as `COORD_URL` gives it): the
/// direct URL for LISTEN is the `listen_url` option, percent-encoded.
/// Without it a client behind PgBouncer gets no notifications.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_with_listen_url_in_the_url_keeps_wakeups() {
    let encoded: String = cluster()
        .url()
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let bouncer = pgbouncer().url();
    let sep = if bouncer.contains('?') { '&' } else { '?' };
    let url = format!("{bouncer}{sep}listen_url={encoded}");
    let without = coord_postgres::connect(&bouncer).await.unwrap();
    assert!(!without.capabilities().notifications);
    let make = || async {
        coord_postgres::connect(&url)
            .await
            .unwrap()
            .with_poll_interval(Duration::from_secs(60))
    };
    let (a, b) = (make().await, make().await);
    assert!(a.capabilities().notifications);
    let name = unique("bouncer-url-wake");
    let held = a
        .locks()
        .unwrap()
        .try_acquire(&name, Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    let locks_b = b.locks().unwrap();
    let waiter = tokio::spawn(async move {
        let t0 = Instant::now();
        let g = locks_b
            .acquire(&name, Duration::from_secs(60), Duration::from_secs(30))
            .await
            .unwrap();
        let waited = t0.elapsed();
        g.release().await.unwrap();
        waited
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.release().await.unwrap();
    let waited = waiter.await.unwrap();
    assert!(
        waited < Duration::from_secs(5),
        "woken by NOTIFY, not by the 60 s poll: {waited:?}"
    );
}

/// A held lock reports the holder's remaining time, measured on the
/// database clock; tokens are per grant; a repeat by the same owner is
/// idempotent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_reports_remaining_time_and_repeats_are_idempotent() {
    let backend = coord_postgres::builder(&cluster().url())
        .connect_backend()
        .await
        .unwrap();
    let name = unique("held");
    let (o1, o2) = (OwnerToken::random(), OwnerToken::random());
    let Attempt::Granted(t1) = backend
        .try_acquire(&name, &o1, Duration::from_secs(10))
        .await
        .unwrap()
    else {
        panic!("free lock");
    };
    assert_eq!(
        backend
            .try_acquire(&name, &o1, Duration::from_secs(10))
            .await
            .unwrap(),
        Attempt::Granted(t1),
        "a retry after a lost reply gets the same token"
    );
    match backend
        .try_acquire(&name, &o2, Duration::from_secs(10))
        .await
        .unwrap()
    {
        Attempt::Held {
            expires_in: Some(left),
        } => assert!(
            left <= Duration::from_secs(10) && left > Duration::from_secs(8),
            "{left:?}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(!backend.release(&name, &o2).await.unwrap());
    assert!(
        !backend
            .extend(&name, &o2, Duration::from_secs(10))
            .await
            .unwrap()
    );
    assert!(backend.release(&name, &o1).await.unwrap());
    let Attempt::Granted(t2) = backend
        .try_acquire(&name, &o2, Duration::from_secs(10))
        .await
        .unwrap()
    else {
        panic!("released lock");
    };
    assert!(t2 > t1);
    // Release frees the row in place (the sweep deletes it once idle);
    // the next grant takes it with a higher token (tests/it/reuse.rs).
    assert!(backend.release(&name, &o2).await.unwrap());
    let left = cluster().psql(
        "postgres",
        &format!(
            "SELECT count(*) FROM coord.claims WHERE kind = 'lock' AND name = '{name}' \
             AND owner IS NOT NULL"
        ),
    );
    assert_eq!(left.trim(), "0");
    let o3 = OwnerToken::random();
    let Attempt::Granted(t3) = backend
        .try_acquire(&name, &o3, Duration::from_secs(10))
        .await
        .unwrap()
    else {
        panic!("released lock");
    };
    assert!(t3 > t2 && FencingToken(t2.get()) > t1);
    assert!(backend.release(&name, &o3).await.unwrap());
}

/// Dropping the client ends its LISTEN connection and its pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_client_closes_its_connections() {
    let app = unique("dropcheck");
    let url = format!("{}&application_name={app}", cluster().url());
    let count = || {
        cluster()
            .psql(
                "postgres",
                &format!("SELECT count(*) FROM pg_stat_activity WHERE application_name = '{app}'"),
            )
            .trim()
            .parse::<u32>()
            .unwrap()
    };
    let coord = coord_postgres::connect(&url).await.unwrap();
    assert!(coord.capabilities().notifications);
    // A call, so the pool holds a connection (opened on demand).
    let g = coord
        .locks()
        .unwrap()
        .try_acquire(&unique("dropcheck"), Duration::from_secs(10))
        .await
        .unwrap()
        .expect("free");
    g.release().await.unwrap();
    assert!(
        count() >= 2,
        "a pooled connection and the LISTEN connection"
    );
    drop(coord);
    let deadline = Instant::now() + Duration::from_secs(10);
    while count() > 0 {
        assert!(
            Instant::now() < deadline,
            "connections left open after drop"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `coord_listen=false` turns wake-ups off and says so.
#[tokio::test]
async fn listening_can_be_turned_off() {
    let coord = coord_postgres::connect(&format!("{}&coord_listen=false", cluster().url()))
        .await
        .unwrap();
    assert!(!coord.capabilities().notifications);
    assert_eq!(coord.capabilities().backend, "postgres");
    assert!(coord.capabilities().server_clock);
}

/// GCRA refills one request per window/limit while a burst runs: across 8
/// clients, a burst of 1000 admits at least `limit` and at most `limit`
/// plus what refilled during the burst, never more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gcra_burst_admits_limit_plus_refill_and_no_more() {
    use coord_core::{Algorithm, Quota};
    const LIMIT: u64 = 100;
    let window = Duration::from_secs(20);
    let quota = Quota::new(LIMIT, window, Algorithm::Gcra);
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(coord_postgres::connect(&cluster().url()).await.unwrap());
    }
    let key = unique("gcra-burst");
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(clients.len()));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for c in &clients {
        let (c, k, s) = (c.clone(), key.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            let lim = c.limiter().unwrap();
            s.wait().await;
            let checks = (0..125).map(|_| lim.check(&k, quota));
            futures::future::join_all(checks)
                .await
                .into_iter()
                .filter(|d| d.as_ref().expect("limiter check").allowed)
                .count() as u64
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    let elapsed = t0.elapsed();
    let refill = (elapsed.as_secs_f64() / (window.as_secs_f64() / LIMIT as f64)).ceil() as u64;
    assert!(
        (LIMIT..=LIMIT + refill).contains(&admitted),
        "admitted {admitted} in {elapsed:?}: limit {LIMIT} + refill {refill}"
    );
}

/// Named prepared statements are used on a direct connection and never
/// through PgBouncer's transaction pooling (where they would break), unless
/// asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_statements_only_on_direct_connections() {
    let direct = coord_postgres::builder(&cluster().url())
        .connect_backend()
        .await
        .unwrap();
    assert!(direct.prepared_statements());
    let bounced = coord_postgres::builder(&pgbouncer().url())
        .connect_backend()
        .await
        .unwrap();
    assert!(!bounced.prepared_statements());
    let split = coord_postgres::builder(&pgbouncer().url())
        .listen_url(&cluster().url())
        .connect_backend()
        .await
        .unwrap();
    assert!(!split.prepared_statements());
    let off = coord_postgres::builder(&cluster().url())
        .prepared_statements(false)
        .connect_backend()
        .await
        .unwrap();
    assert!(!off.prepared_statements());
    // Both modes work, on the same rows.
    for b in [&direct, &off, &split] {
        let coord = b.coord();
        let name = unique("prepared");
        let g = coord
            .locks()
            .unwrap()
            .try_acquire(&name, Duration::from_secs(30))
            .await
            .unwrap()
            .unwrap();
        assert!(
            coord
                .locks()
                .unwrap()
                .try_acquire(&name, Duration::from_secs(30))
                .await
                .unwrap()
                .is_none()
        );
        g.release().await.unwrap();
    }
}

/// Options in the URL take effect (the unprefixed aliases too): the schema
/// holding the tables, the pool size, the call timeout (which is also each
/// session's `statement_timeout`), prepared statements; a bad option fails
/// before any connection is tried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_options_take_effect() {
    let schema = unique("urlopt");
    let url = format!(
        "{}&schema={schema}&pool_size=3&statement_timeout=1500ms&coord_sweep_every=off\
         &coord_prepared_statements=false",
        cluster().url()
    );
    let b = coord_postgres::builder(&url)
        .connect_backend()
        .await
        .unwrap();
    assert_eq!(b.schema(), schema);
    assert_eq!(b.pool().status().max_size, 3);
    assert!(!b.prepared_statements());
    assert!(format!("{b:?}").contains("1.5s"), "{b:?}");
    let g = b
        .coord()
        .locks()
        .unwrap()
        .try_acquire("from-url", Duration::from_secs(10))
        .await
        .unwrap()
        .expect("granted");
    g.release().await.unwrap();
    for bad in ["coord_timeout=2", "pool_size=none", "coord_sweep_every=0s"] {
        match coord_postgres::connect(&format!("postgres://u@127.0.0.1:1/db?{bad}")).await {
            Err(Error::Config(m)) => assert!(m.contains(bad.split('=').next().unwrap()), "{m}"),
            Err(e) => panic!("{bad}: not a Config error: {e}"),
            Ok(_) => panic!("{bad}: connected"),
        }
    }
}

/// A first user whose version check raced the schema's creation (it found
/// no schema, then waited for the schema lock while another first user
/// created it) runs no DDL once it holds the lock: clients already at work
/// on the tables never wait behind it, and are never aborted as a deadlock
/// with it (otherwise a semaphore acquire can fail with 40P01 against a
/// late first user's DDL).
///
/// Deterministic: a session holds the schema lock while first user A,
/// then session R (a session-level lock on the same key), then first user
/// B queue on it. When R gets it, A's DDL is committed; R locks every table
/// of the schema in ACCESS SHARE mode, as any client at work does, and lets
/// B in. B must connect while R still holds its table locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_first_user_runs_no_ddl_on_a_current_schema() {
    use coord_postgres::tokio_postgres::{self, NoTls};
    async fn session() -> tokio_postgres::Client {
        let (c, conn) = tokio_postgres::connect(&cluster().url(), NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        c
    }
    let schema = unique("late");
    let key = format!("hashtext('coord-schema:{schema}')::int8");
    let probe = session().await;
    let queued = |n: i64| {
        let (probe, key) = (&probe, key.clone());
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let sql = format!(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
                     AND objid = (({key}) & 4294967295)::oid"
                );
                if probe.query_one(&sql, &[]).await.unwrap().get::<_, i64>(0) >= n {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "{n} never queued on the schema lock"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let connect = |url: String| {
        tokio::spawn(async move {
            coord_postgres::builder(&url)
                .listen(false)
                .connect()
                .await
                .map(|_| ())
        })
    };
    let url = format!("{}&schema={schema}&timeout=20s", cluster().url());

    let holder = session().await;
    holder
        .batch_execute(&format!("BEGIN; SELECT pg_advisory_xact_lock({key})"))
        .await
        .unwrap();
    let a = connect(url.clone());
    queued(1).await;
    let (locked_tx, locked_rx) = tokio::sync::oneshot::channel::<()>();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let r = {
        let (key, schema) = (key.clone(), schema.clone());
        tokio::spawn(async move {
            let r = session().await;
            r.batch_execute(&format!("SELECT pg_advisory_lock({key})"))
                .await
                .unwrap();
            r.batch_execute(&format!(
                "BEGIN; DO $$ DECLARE t record; BEGIN \
                   FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = '{schema}' LOOP \
                     EXECUTE format('LOCK TABLE %I.%I IN ACCESS SHARE MODE', '{schema}', t.tablename); \
                   END LOOP; END $$; SELECT pg_advisory_unlock({key})"
            ))
            .await
            .unwrap();
            locked_tx.send(()).unwrap();
            let _ = done_rx.await;
            r.batch_execute("COMMIT").await.unwrap();
        })
    };
    queued(2).await;
    let b = connect(url.clone());
    queued(3).await;
    holder.batch_execute("COMMIT").await.unwrap();
    a.await.unwrap().expect("first user A connects");
    locked_rx.await.expect("R took its table locks");
    let b = tokio::time::timeout(Duration::from_secs(5), b).await;
    let _ = done_tx.send(());
    r.await.unwrap();
    match b {
        Ok(joined) => joined.unwrap().expect("late first user B connects"),
        Err(_) => panic!(
            "the late first user B waited 5 s behind a session that only reads the tables: \
             it ran the schema's DDL again"
        ),
    }
}

/// One layout version: a schema holding another (an older client's, or a
/// newer one's) is refused with a configuration error saying what to do,
/// before any DDL, and is left as it is (a lock held there stays held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_of_another_layout_is_refused_and_left_as_it_is() {
    let schema = unique("other_layout");
    let url = cluster().url();
    let first = coord_postgres::builder(&url)
        .schema(schema.clone())
        .listen(false)
        .connect_backend()
        .await
        .expect("create the schema");
    let o = OwnerToken::random();
    assert!(matches!(
        Lock::try_acquire(&*first, "held", &o, Duration::from_secs(60))
            .await
            .unwrap(),
        Attempt::Granted(_)
    ));
    let version = format!("SELECT version FROM \"{schema}\".meta");
    let current: i32 = cluster().psql("postgres", &version).trim().parse().unwrap();
    let objects = format!(
        "SELECT (SELECT count(*) FROM pg_tables WHERE schemaname = '{schema}') \
              + (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
                  WHERE n.nspname = '{schema}')"
    );
    let before = cluster().psql("postgres", &objects);
    for other in [current - 1, current + 1] {
        cluster().psql(
            "postgres",
            &format!("UPDATE \"{schema}\".meta SET version = {other}"),
        );
        let r = coord_postgres::builder(&url)
            .schema(schema.clone())
            .listen(false)
            .connect()
            .await;
        match r {
            Err(Error::Config(m)) => {
                assert!(
                    m.contains(&format!("layout {other}")) && m.contains("another schema"),
                    "the error should name the layout found and what to do: {m}"
                );
            }
            got => panic!("a schema of layout {other} was not refused: {got:?}"),
        }
        assert_eq!(
            cluster().psql("postgres", &version).trim(),
            other.to_string(),
            "the refused client changed the schema's version"
        );
        assert_eq!(cluster().psql("postgres", &objects), before);
    }
    cluster().psql(
        "postgres",
        &format!("UPDATE \"{schema}\".meta SET version = {current}"),
    );
    let o2 = OwnerToken::random();
    assert!(matches!(
        Lock::try_acquire(&*first, "held", &o2, Duration::from_secs(60))
            .await
            .unwrap(),
        Attempt::Held { .. }
    ));
}
