//! Grants survive a server crash whatever the role's `synchronous_commit`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use conformance::testkit::postgres::cluster;
use coord_core::{Attempt, FencingSource, Lease, Lock, OwnerToken};

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A role whose default is `synchronous_commit = off`, and a WAL writer
/// that flushes asynchronous commits only every 10 s: a lock grant, a
/// lease grant and a fencing token, then at once a crash
/// (`pg_ctl stop -m immediate`). After the restart the lock and the lease
/// are still held and the next token is above every token handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_survive_a_crash_when_the_role_commits_asynchronously() {
    let _alone = crate::ALONE.lock().await;
    let db = unique("durable");
    cluster().create_database(&db);
    let user = unique("async_role");
    let url = cluster().create_role(&user, "Async-pw1", &db);
    cluster().psql(
        "postgres",
        &format!("ALTER ROLE \"{user}\" SET synchronous_commit = off"),
    );
    cluster().psql("postgres", "ALTER SYSTEM SET wal_writer_delay = '10s'");
    cluster().psql("postgres", "SELECT pg_reload_conf()");
    let b = coord_postgres::builder(&url)
        .listen(false)
        .connect_backend()
        .await
        .expect("connect as the role");
    // The layout is made; make it durable, and let the WAL writer take the
    // new delay.
    cluster().psql(&db, "CHECKPOINT");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let setting = cluster().psql(
        &db,
        &format!(
            "SELECT setconfig::text FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole \
             WHERE r.rolname = '{user}'"
        ),
    );
    assert!(setting.contains("synchronous_commit=off"), "{setting}");

    let (lock, lease) = (unique("lock"), unique("lease"));
    let owner = OwnerToken::random();
    let mut tokens = Vec::new();
    for got in [
        b.try_acquire(&lock, owner.step(), Duration::from_secs(600))
            .await
            .unwrap(),
        b.grant(&lease, owner.step(), Duration::from_secs(600))
            .await
            .unwrap(),
    ] {
        match got {
            Attempt::Granted(t) => tokens.push(t),
            other => panic!("expected a grant: {other:?}"),
        }
    }
    tokens.push(b.next("durable").await.unwrap());
    drop(b);
    tokio::task::spawn_blocking(|| {
        cluster().crash();
        cluster().start();
    })
    .await
    .unwrap();
    cluster().psql("postgres", "ALTER SYSTEM RESET wal_writer_delay");
    cluster().psql("postgres", "SELECT pg_reload_conf()");

    let b = coord_postgres::builder(&url)
        .listen(false)
        .connect_backend()
        .await
        .expect("connect after the restart");
    let deadline = Instant::now() + Duration::from_secs(10);
    let lock_now = loop {
        match b
            .try_acquire(&lock, OwnerToken::random().step(), Duration::from_secs(5))
            .await
        {
            Ok(a) => break a,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(
        matches!(lock_now, Attempt::Held { .. }),
        "the lock granted before the crash was lost: {lock_now:?}"
    );
    assert!(
        b.remaining(&lease).await.unwrap().is_some(),
        "the lease granted before the crash was lost"
    );
    let next = b.next("durable").await.unwrap();
    let max = tokens.iter().max().copied().unwrap();
    assert!(
        next > max,
        "a token after the crash ({next:?}) is not above those before it ({tokens:?})"
    );
}

/// A token from `FencingSource::next` is durable when it is returned,
/// whoever wrote the sequence's WAL record that covers it. PostgreSQL logs
/// a sequence 32 values ahead, so most draws write no WAL of their own.
/// Another session draws 40 values with an asynchronous commit (as a
/// semaphore grant or a queue delivery commits), so the record covering
/// the next values is its, and the WAL writer flushes only every 10 s.
/// Then `next()` draws one of those values and the server crashes at once.
/// After the restart `next()` must hand out a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencing_token_is_durable_when_returned() {
    let _alone = crate::ALONE.lock().await;
    let db = unique("next_durable");
    let url = cluster().create_database(&db);
    let b = coord_postgres::builder(&url)
        .listen(false)
        .connect_backend()
        .await
        .expect("connect");
    let first = b.next("durable").await.unwrap();
    cluster().psql("postgres", "ALTER SYSTEM SET wal_writer_delay = '10s'");
    cluster().psql("postgres", "SELECT pg_reload_conf()");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let other = cluster().psql(
        &db,
        "SET synchronous_commit = off; \
         SELECT max(coord.fencing_next()) FROM generate_series(1, 40)",
    );
    let before = b.next("durable").await.unwrap();
    drop(b);
    tokio::task::spawn_blocking(|| {
        cluster().crash();
        cluster().start();
    })
    .await
    .unwrap();
    cluster().psql("postgres", "ALTER SYSTEM RESET wal_writer_delay");
    cluster().psql("postgres", "SELECT pg_reload_conf()");
    let b = coord_postgres::builder(&url)
        .listen(false)
        .connect_backend()
        .await
        .expect("connect after the restart");
    let deadline = Instant::now() + Duration::from_secs(10);
    let after = loop {
        match b.next("durable").await {
            Ok(t) => break t,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(
        after > before,
        "a token went back across the crash: {before} before it (the other session drew {}, \
         the first draw was {first}), {after} after",
        other.trim()
    );
}

/// See `conformance::crash::tokens_rise_across_a_crash`: the server
/// stopped with `pg_ctl stop -m immediate` (no shutdown checkpoint) and
/// started again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_token_rises_across_a_crash() {
    let _alone = crate::ALONE.lock().await;
    let url = cluster().create_database(&unique("crash"));
    let before = coord_postgres::builder(&url)
        .listen(false)
        .connect()
        .await
        .expect("connect");
    conformance::crash::tokens_rise_across_a_crash(&before, "crash", || async move {
        tokio::task::spawn_blocking(|| {
            cluster().crash();
            cluster().start();
        })
        .await
        .unwrap();
        coord_postgres::builder(&url)
            .listen(false)
            .connect()
            .await
            .expect("connect after the restart")
    })
    .await;
}
