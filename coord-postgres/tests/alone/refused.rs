//! A refused lock attempt (the name is held by another owner) spends no
//! commit on the server: no transaction id, so no commit record and no
//! WAL flush, and the holder's row version is untouched (no row lock).
//!
//! Transaction ids are counted cluster-wide, so this binary holds this
//! one test alone: nothing else runs on its cluster meanwhile.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use conformance::testkit::postgres::cluster;

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// One query on a connection of its own: the first column of the first
/// row, as text.
async fn one(query: &str) -> String {
    let (client, connection) = tokio_postgres::connect(&cluster().url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    for m in client.simple_query(query).await.expect(query) {
        if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
            return r.get(0).unwrap_or_default().to_string();
        }
    }
    panic!("no row from {query}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_try_acquire_spends_no_transaction_id_and_locks_no_row() {
    let _alone = crate::ALONE.lock().await;
    const ATTEMPTS: i64 = 200;
    // With prepared statements (direct connections) and without (every
    // call in BEGIN ... COMMIT, as behind PgBouncer).
    for prepared in [true, false] {
        let schema = unique("refused");
        let connect = || {
            coord_postgres::builder(&cluster().url())
                .schema(schema.clone())
                .pool_size(4)
                .prepared_statements(prepared)
                .sweep_every(None)
                .listen(false)
                .connect()
        };
        let (holder, other) = (
            connect().await.expect("holder"),
            connect().await.expect("other"),
        );
        let name = "held";
        let guard = holder
            .locks()
            .expect("locks")
            .try_acquire(name, Duration::from_secs(60))
            .await
            .expect("try_acquire")
            .expect("the name is free");
        let row = format!(
            "SELECT xmin::text || ':' || xmax::text || ':' || ctid::text \
               FROM \"{schema}\".claims WHERE kind = 'lock' AND name = '{name}'"
        );
        let version = one(&row).await;
        let locks = other.locks().expect("locks");
        let xids = crate::XidCount::start().await;
        for _ in 0..ATTEMPTS {
            let attempt = locks
                .try_acquire(name, Duration::from_secs(60))
                .await
                .expect("try_acquire");
            assert!(
                attempt.is_none(),
                "the held name was granted to another owner"
            );
        }
        // One id is the count's own read; one attempt in ten writing
        // would take 20.
        let spent = xids.used() - 1;
        assert!(
            spent < 5,
            "{ATTEMPTS} refused attempts (prepared statements: {prepared}) took {spent} \
             transaction ids: a refused attempt writes (a row lock or a row), so it commits \
             durably and flushes WAL"
        );
        assert_eq!(
            one(&row).await,
            version,
            "refused attempts changed or locked the holder's row (prepared statements: \
             {prepared})"
        );
        guard.release().await.expect("release");
    }
}
