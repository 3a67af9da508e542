//! Messages and fencing tokens survive a crash of the server.

use std::time::{Duration, Instant};

use conformance::testkit::postgres::cluster;
use coord_core::{Lane, MessageId, OwnerToken, PopAttempt, Queue, QueueConfig};

use super::{LONG, msg, unique};

/// Pushes, deliveries and acks survive a crash although their steps
/// commit asynchronously: a role whose default is `synchronous_commit =
/// off` and a WAL writer that flushes only every 10 s, then a crash
/// (`pg_ctl stop -m immediate`) right after. After the restart the pushed
/// messages are there (a dedup id still remembered), the delivered one is
/// still in flight, the acked one is gone, and the next token is above
/// every token issued before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_and_tokens_survive_a_crash() {
    let _alone = crate::ALONE.lock().await;
    let db = unique("qdurable");
    cluster().create_database(&db);
    let user = unique("q_async_role");
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

    let name = unique("durable");
    let cfg = QueueConfig::default();
    let acked = b.push(&name, &msg(b"acked", None)).await.unwrap().id;
    let held = b.push(&name, &msg(b"held", None)).await.unwrap().id;
    let dedup = msg(b"kept", None).dedup("once", LONG);
    let kept = b.push(&name, &dedup).await.unwrap().id;
    let mut tokens = Vec::new();
    for want in [acked, held] {
        let owner = OwnerToken::random();
        match b
            .try_pop(&name, Lane::Main, &owner, LONG, &cfg)
            .await
            .unwrap()
        {
            PopAttempt::Delivered { message, token } => {
                assert_eq!(message.id, want);
                tokens.push(token);
            }
            other => panic!("{other:?}"),
        }
        if want == acked {
            assert!(b.ack(&name, Lane::Main, acked, &owner).await.unwrap());
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
    let stats = loop {
        match b.stats(&name).await {
            Ok(s) => break s,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(
        (stats.ready, stats.in_flight),
        (1, 1),
        "after the crash: {stats:?}"
    );
    let again = b.push(&name, &dedup).await.unwrap();
    assert_eq!((again.id, again.duplicate), (kept, true), "the dedup id");
    let peeked: Vec<(MessageId, u32)> = b
        .peek(&name, Lane::Main, 10)
        .await
        .unwrap()
        .iter()
        .map(|m| (m.id, m.attempts))
        .collect();
    assert_eq!(
        peeked,
        [(held, 1), (kept, 0)],
        "the acked message came back"
    );
    let max = tokens.iter().max().copied().unwrap();
    match b
        .try_pop(&name, Lane::Main, &OwnerToken::random(), LONG, &cfg)
        .await
        .unwrap()
    {
        PopAttempt::Delivered { message, token } => {
            assert_eq!(message.id, kept);
            assert!(
                token > max,
                "a token after the crash ({token:?}) is not above those before it ({tokens:?})"
            );
        }
        other => panic!("{other:?}"),
    }
}
