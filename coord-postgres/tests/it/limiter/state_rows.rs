//! The limiter's state rows: GCRA decides on the clock after the row lock,
//! a row deleted while a check waits is made again, denials write
//! nothing, and commits do not wait for the WAL flush.

use std::sync::Arc;
use std::time::Duration;

use conformance::testkit::postgres::cluster;
use coord_core::{Algorithm, Limiter, Quota};
use coord_postgres::PostgresBackend;

use super::{ALL, away_from_a_600s_boundary, quota, unique, wall_us};

/// A backend on a schema of its own (so triggers installed for a test
/// touch no other test), with or without prepared statements, no sweep.
async fn own_backend(tag: &str, prepared: bool, pool: usize) -> Arc<PostgresBackend> {
    let b = coord_postgres::builder(&cluster().url())
        .schema(unique(tag))
        .pool_size(pool)
        .prepared_statements(prepared)
        .sweep_every(None)
        .call_timeout(Duration::from_secs(10))
        .listen(false)
        .connect_backend()
        .await
        .expect("connect to the test cluster");
    assert_eq!(b.prepared_statements(), prepared);
    b
}

fn algorithm_name(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => "fixed_window",
        Algorithm::SlidingWindow => "sliding_window",
        Algorithm::SlidingLog => "sliding_log",
        _ => "gcra",
    }
}

/// One query on a connection of its own; the rows' columns as text.
async fn sql(query: &str) -> Vec<Vec<Option<String>>> {
    let (client, connection) = tokio_postgres::connect(&cluster().url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let mut out = Vec::new();
    for m in client.simple_query(query).await.expect(query) {
        if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
            out.push((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect());
        }
    }
    out
}

/// The GCRA decision time of a key whose state had run out before the
/// check: the check wrote tat x limit = now x limit + cost x window.
async fn gcra_decided_at(schema: &str, key: &str, window_us: i64, cost: i64) -> i64 {
    let rows = sql(&format!(
        "SELECT ((tat_x - {cost}::numeric * {window_us}) / q_limit)::int8 FROM \"{schema}\".limiter_state \
          WHERE algorithm = 'gcra' AND key = '{key}'"
    ))
    .await;
    rows[0][0]
        .as_deref()
        .expect("a GCRA state")
        .parse()
        .expect("a time")
}

/// Another session holds the row lock of a key's state for 300 ms while
/// a GCRA check of the key comes in: the check waits and decides on the
/// clock it reads once it has the lock (its recorded decision time is
/// after the holder's commit), with and without prepared statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_decides_on_the_clock_after_the_row_lock() {
    for prepared in [true, false] {
        let b = own_backend("gcra_lock", prepared, 2).await;
        let s = b.schema().to_string();
        let key = unique("locked");
        let quota = Quota::new(1000, Duration::from_secs(1), Algorithm::Gcra);
        for _ in 0..3 {
            assert!(b.check(&key, &quota, 1).await.unwrap().allowed);
        }
        // The state runs out (3 ms of backlog).
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (holder, connection) = tokio_postgres::connect(&cluster().url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        holder.batch_execute("BEGIN").await.unwrap();
        let locked = holder
            .execute(
                &format!(
                    "SELECT 1 FROM \"{s}\".limiter_state WHERE algorithm = 'gcra' AND key = $1 FOR UPDATE"
                ),
                &[&key],
            )
            .await
            .unwrap();
        assert_eq!(locked, 1);
        let check = tokio::spawn({
            let (b, key) = (b.clone(), key.clone());
            async move { b.check(&key, &quota, 1).await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!check.is_finished(), "the check waits for the row lock");
        let released = wall_us();
        holder.batch_execute("COMMIT").await.unwrap();
        let d = check.await.unwrap();
        assert!(d.allowed, "prepared {prepared}: {d:?}");
        assert_eq!(d.remaining, 999, "prepared {prepared}: {d:?}");
        let at = gcra_decided_at(&s, &key, 1_000_000, 1).await;
        assert!(
            at >= released,
            "prepared {prepared}: decided at {at}, {} µs before the lock was released",
            released - at
        );
    }
}

/// The sweep race: a key's state row is deleted (as the sweep deletes an
/// idle one) by a session that held its lock while a check waited for
/// it. The check decides like on no state, on the clock after the
/// deletion, and records its admission in a new row; every algorithm,
/// with and without prepared statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_row_deleted_while_a_check_waits_is_made_again() {
    for prepared in [true, false] {
        let b = own_backend("swept", prepared, 2).await;
        let s = b.schema().to_string();
        for algorithm in ALL {
            let algo = algorithm_name(algorithm);
            let key = unique("swept");
            let quota = Quota::new(10, Duration::from_secs(1), algorithm);
            assert!(b.check(&key, &quota, 1).await.unwrap().allowed);
            tokio::time::sleep(Duration::from_millis(20)).await;
            let (holder, connection) =
                tokio_postgres::connect(&cluster().url(), tokio_postgres::NoTls)
                    .await
                    .unwrap();
            tokio::spawn(connection);
            holder.batch_execute("BEGIN").await.unwrap();
            let locked = holder
                .execute(
                    &format!(
                        "SELECT 1 FROM \"{s}\".limiter_state WHERE algorithm = $1 AND key = $2 FOR UPDATE"
                    ),
                    &[&algo, &key],
                )
                .await
                .unwrap();
            assert_eq!(locked, 1);
            let check = tokio::spawn({
                let (b, key) = (b.clone(), key.clone());
                async move { b.check(&key, &quota, 1).await.unwrap() }
            });
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(
                !check.is_finished(),
                "{algo}: the check waits for the row lock"
            );
            holder
                .execute(
                    &format!("DELETE FROM \"{s}\".limiter_state WHERE algorithm = $1 AND key = $2"),
                    &[&algo, &key],
                )
                .await
                .unwrap();
            holder
                .execute(
                    &format!("DELETE FROM \"{s}\".limiter_log WHERE key = $1"),
                    &[&key],
                )
                .await
                .unwrap();
            let deleted = wall_us();
            holder.batch_execute("COMMIT").await.unwrap();
            let d = check.await.unwrap();
            assert!(d.allowed, "prepared {prepared}, {algo}: {d:?}");
            assert_eq!(
                d.remaining, 9,
                "prepared {prepared}, {algo}: like on no state: {d:?}"
            );
            let rows = sql(&format!(
                "SELECT coalesce(q_window, retain) FROM \"{s}\".limiter_state WHERE algorithm = '{algo}' AND key = '{key}'"
            ))
            .await;
            assert_eq!(
                rows.len(),
                1,
                "prepared {prepared}, {algo}: the row is made again"
            );
            assert_eq!(
                rows[0][0].as_deref(),
                Some("1000000"),
                "prepared {prepared}, {algo}: the admission is recorded"
            );
            if algorithm == Algorithm::Gcra {
                let at = gcra_decided_at(&s, &key, 1_000_000, 1).await;
                assert!(
                    at >= deleted,
                    "prepared {prepared}: decided at {at}, {} µs before the deletion committed",
                    deleted - at
                );
            }
        }
    }
}

/// A denial writes nothing: once a key is used up, 100 denied checks
/// leave its state row as it was (no new version, no row lock: xmin, xmax
/// and ctid unchanged) and add no sliding-log entry; every algorithm,
/// with and without prepared statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denials_write_nothing() {
    for prepared in [true, false] {
        let b = own_backend("denials", prepared, 2).await;
        let s = b.schema().to_string();
        away_from_a_600s_boundary().await;
        for algorithm in ALL {
            let algo = algorithm_name(algorithm);
            let key = unique("denied");
            for _ in 0..2 {
                assert!(
                    b.check(&key, &quota(algorithm, 2), 1)
                        .await
                        .unwrap()
                        .allowed
                );
            }
            let state = format!(
                "SELECT xmin::text, xmax::text, ctid::text, \
                        (SELECT count(*) FROM \"{s}\".limiter_log l WHERE l.key = x.key) \
                   FROM \"{s}\".limiter_state x WHERE algorithm = '{algo}' AND key = '{key}'"
            );
            let before = sql(&state).await;
            assert_eq!(before.len(), 1);
            for i in 0..100 {
                // The same quota, and a smaller one (another path).
                let q = quota(algorithm, if i % 2 == 0 { 2 } else { 1 });
                let d = b.check(&key, &q, 1).await.unwrap();
                assert!(!d.allowed, "prepared {prepared}, {algo}: check {i}: {d:?}");
            }
            let after = sql(&state).await;
            assert_eq!(before, after, "prepared {prepared}, {algo}: denials wrote");
        }
    }
}

/// Limiter decisions commit without waiting for the WAL flush
/// (`synchronous_commit = off` in the check's own transaction), whatever
/// the session's setting (coord raises it to `on` for grants): a trigger
/// records the setting at every write of a state row or log entry.
/// Fresh keys, repeated checks and quota changes, every algorithm, with
/// and without prepared statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limiter_commits_are_asynchronous() {
    for prepared in [true, false] {
        let b = own_backend("async", prepared, 2).await;
        let s = b.schema().to_string();
        sql(&format!(
            "CREATE TABLE \"{s}\".commit_audit (tbl text, setting text); \
             CREATE FUNCTION \"{s}\".commit_audit() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN INSERT INTO \"{s}\".commit_audit VALUES (TG_TABLE_NAME, current_setting('synchronous_commit')); \
                   RETURN NULL; END $$; \
             CREATE TRIGGER commit_audit AFTER INSERT OR UPDATE ON \"{s}\".limiter_state \
             FOR EACH ROW EXECUTE FUNCTION \"{s}\".commit_audit(); \
             CREATE TRIGGER commit_audit AFTER INSERT OR UPDATE ON \"{s}\".limiter_log \
             FOR EACH ROW EXECUTE FUNCTION \"{s}\".commit_audit();"
        ))
        .await;
        for algorithm in ALL {
            let key = unique("async");
            for i in 0..6 {
                let q = quota(algorithm, if i < 4 { 100 } else { 101 });
                assert!(b.check(&key, &q, 1).await.unwrap().allowed);
            }
        }
        let rows = sql(&format!(
            "SELECT tbl, setting, count(*) FROM \"{s}\".commit_audit GROUP BY 1, 2 ORDER BY 1, 2"
        ))
        .await;
        let writes: i64 = rows
            .iter()
            .map(|r| r[2].as_deref().unwrap().parse::<i64>().unwrap())
            .sum();
        assert!(writes >= 24, "prepared {prepared}: {rows:?}");
        assert!(
            rows.iter().all(|r| r[1].as_deref() == Some("off")),
            "prepared {prepared}: limiter writes under {rows:?}"
        );
    }
}
