//! Semaphore grants survive a server crash although they commit
//! asynchronously (so the name's lock is never held across a WAL flush):
//! the pipelined durable update flushes them before they are reported.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use conformance::testkit::postgres::cluster;
use coord_core::{Attempt, Error, FencingSource, OwnerToken, PermitRequest, Semaphore};

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn req(permits: u32, total: u32) -> PermitRequest {
    PermitRequest {
        permits,
        total,
        ttl: Duration::from_secs(600),
        queue: false,
    }
}

/// A WAL writer that flushes asynchronous commits only every 10 s (and a
/// role whose default is `synchronous_commit = off`): two grants taking
/// all 3 permits of a name, then at once a crash (`pg_ctl stop -m
/// immediate`). After the restart both grants are still held (no permit
/// is free, the total still binds) and the next token is above theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_grants_survive_a_crash() {
    let _alone = crate::ALONE.lock().await;
    let db = unique("semdurable");
    cluster().create_database(&db);
    let user = unique("sem_async_role");
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
    cluster().psql(&db, "CHECKPOINT");
    tokio::time::sleep(Duration::from_secs(1)).await;

    let name = unique("sem");
    let mut tokens = Vec::new();
    for (owner, permits) in [(OwnerToken::random(), 2), (OwnerToken::random(), 1)] {
        match b
            .try_acquire(&name, owner.step(), &req(permits, 3))
            .await
            .unwrap()
        {
            Attempt::Granted(t) => tokens.push(t),
            other => panic!("expected a grant: {other:?}"),
        }
    }
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
    let now = loop {
        match b
            .try_acquire(&name, OwnerToken::random().step(), &req(1, 3))
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
        matches!(now, Attempt::Held { .. }),
        "a permit granted before the crash was lost: {now:?}"
    );
    match b
        .try_acquire(&name, OwnerToken::random().step(), &req(1, 4))
        .await
    {
        Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, "permits_total"),
        other => panic!("the total no longer binds after the crash: {other:?}"),
    }
    let next = b.next("after").await.unwrap();
    let max = tokens.iter().max().copied().unwrap();
    assert!(
        next > max,
        "a token after the crash ({next:?}) is not above those before it ({tokens:?})"
    );
}
