//! A pooled connection plans each statement once (generic plans) and
//! keeps the plans; those made while the queue's table was empty must not
//! read the whole table once it holds a backlog (or dead rows): every
//! step goes by its index.

use std::time::Duration;

use tokio::time::sleep;
use tokio_postgres::NoTls;

use conformance::testkit::postgres::cluster;

use super::unique;

/// Sequential and index scans of `schema`'s message table so far, as the
/// statistics show them.
async fn scans(c: &tokio_postgres::Client, schema: &str) -> (i64, i64) {
    c.execute("SELECT pg_stat_force_next_flush()", &[])
        .await
        .expect("flush this session's statistics");
    let r = c
        .query_one(
            "SELECT seq_scan, idx_scan FROM pg_stat_user_tables
              WHERE schemaname = $1 AND relname = 'queue_messages'",
            &[&schema],
        )
        .await
        .expect("scans");
    (r.get(0), r.get(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_steps_planned_on_an_empty_table_use_the_indexes_on_a_backlog() {
    let schema = unique("qplans");
    // One pooled connection: every step below is planned, once, on it.
    let coord = coord_postgres::builder(&cluster().url())
        .schema(&schema)
        .pool_size(1)
        .sweep_every(None)
        .connect()
        .await
        .expect("connect");
    let q = coord.queues().unwrap();
    let s = format!("\"{schema}\"");
    let (c, conn) = tokio_postgres::connect(&cluster().url(), NoTls)
        .await
        .expect("raw connect");
    tokio::spawn(conn);
    // Statistics that say the table is empty (vacuumed while empty), and
    // no autovacuum to update them (and so have the plans made again).
    for step in [
        format!("ALTER TABLE {s}.queue_messages SET (autovacuum_enabled = false)"),
        format!("VACUUM ANALYZE {s}.queue_messages"),
    ] {
        c.batch_execute(&step).await.expect("set up");
    }
    let cycle = || async {
        q.push("q", b"m").await.expect("push");
        let d = q
            .pop("q", Duration::from_secs(30), Duration::from_secs(5))
            .await;
        d.expect("pop")
            .expect("a message")
            .ack()
            .await
            .expect("ack");
    };
    // Every step planned while the table holds at most one message.
    cycle().await;
    cycle().await;
    // A backlog, pushed by another session.
    c.batch_execute(&format!(
        "SELECT count(*) FROM generate_series(1, 2000) g,
                LATERAL {s}.queue_push('q', '\\x00'::bytea, 0, '', NULL, 0)"
    ))
    .await
    .expect("push a backlog");
    // A backend reports its statistics when it goes idle, at most once a
    // second (else later): a call a second after the last one reports
    // everything before it, before its reply.
    let flushed = || async {
        sleep(Duration::from_millis(1100)).await;
        q.stats("q").await.expect("stats");
        scans(&c, &schema).await
    };
    let (seq, idx) = flushed().await;
    for _ in 0..20 {
        cycle().await;
    }
    let (seq_now, idx_now) = flushed().await;
    assert!(
        idx_now >= idx + 20,
        "the statistics of 20 cycles never showed (index scans {idx} -> {idx_now})"
    );
    assert_eq!(
        seq_now - seq,
        0,
        "20 push-pop-ack cycles on a backlog of 2,000 messages read the whole table {} times",
        seq_now - seq
    );
}
