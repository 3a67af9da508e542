//! The schema on first use: many clients at once on an empty database, a
//! late first user that runs no DDL on a current schema, and a schema of
//! another layout refused and left as it is.

use std::time::{Duration, Instant};

use conformance::testkit::postgres::{cluster, pgbouncer};
use coord_core::{Attempt, Error, Lock, OwnerToken};

use super::unique;

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
             semaphore_queue, semaphore_left, queue_messages, queue_groups, queue_dedup, \
             queue_abandoned, queue_waiting"
        );
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
        Lock::try_acquire(&*first, "held", o.step(), Duration::from_secs(60))
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
        Lock::try_acquire(&*first, "held", o2.step(), Duration::from_secs(60))
            .await
            .unwrap(),
        Attempt::Held { .. }
    ));
}
