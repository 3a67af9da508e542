//! The statement pool sizes to demand: connections are opened as
//! concurrent calls need them, up to `pool_size`, and calls beyond wait
//! for a connection in arrival order (FIFO).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use conformance::testkit::postgres::cluster;
use coord_postgres::PostgresBackend;

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A backend whose connections carry `application_name = app` (the
/// LISTEN connection is off, so every connection is the pool's).
async fn backend(app: &str, pool: usize) -> Arc<PostgresBackend> {
    coord_postgres::builder(&format!("{}&application_name={app}", cluster().url()))
        .pool_size(pool)
        .prepared_statements(true)
        .sweep_every(None)
        .listen(false)
        .call_timeout(Duration::from_secs(10))
        .connect_backend()
        .await
        .expect("connect to the test cluster")
}

/// The server's client connections named `app`.
async fn connections(app: &str) -> i64 {
    let (client, connection) = tokio_postgres::connect(&cluster().url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            &[&app],
        )
        .await
        .expect("count connections")
        .get(0)
}

/// `tasks` tasks, each `cycles` uncontended lock cycles on a name of its own.
async fn cycles(b: &Arc<PostgresBackend>, tasks: usize, cycles: usize) {
    let locks = b.coord().locks().expect("locks");
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let (locks, name) = (locks.clone(), unique(&format!("pool{i}")));
            tokio::spawn(async move {
                for _ in 0..cycles {
                    let g = locks
                        .try_acquire(&name, Duration::from_secs(30))
                        .await
                        .expect("try_acquire")
                        .expect("uncontended name is free");
                    g.release().await.expect("release");
                }
            })
        })
        .collect();
    for h in handles {
        h.await.expect("cycle task");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_opened_as_concurrent_calls_need_them_up_to_the_pool_size() {
    let app = unique("coord_pool_demand");
    let b = backend(&app, 32).await;
    // One caller at a time needs one connection.
    cycles(&b, 1, 50).await;
    let sequential = connections(&app).await;
    assert!(
        sequential <= 1,
        "one caller at a time left {sequential} connections open (pool of up to 32)"
    );
    // 64 concurrent callers: more connections, never more than the size.
    cycles(&b, 64, 20).await;
    let busy = connections(&app).await;
    assert!(
        busy > 1 && busy <= 32,
        "64 concurrent callers left {busy} connections open (pool of up to 32)"
    );
    let status = b.pool().status();
    assert!(status.size <= 32, "pool status {status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_beyond_the_pool_size_get_a_connection_in_arrival_order() {
    let app = unique("coord_pool_fifo");
    let b = backend(&app, 1).await;
    let locks = b.coord().locks().expect("locks");
    // Take the pool's only connection, so every call below queues.
    let held = b.pool().get().await.expect("the pool's connection");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut handles = Vec::new();
    for i in 0..6 {
        let (locks, tx, name) = (locks.clone(), tx.clone(), unique("fifo"));
        handles.push(tokio::spawn(async move {
            let g = locks
                .try_acquire(&name, Duration::from_secs(30))
                .await
                .expect("try_acquire")
                .expect("uncontended name is free");
            tx.send(i).expect("send");
            g.release().await.expect("release");
        }));
        // Each caller queued before the next one arrives.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            b.pool().status().waiting,
            i + 1,
            "caller {i} is not waiting"
        );
    }
    drop(held);
    for h in handles {
        h.await.expect("caller");
    }
    drop(tx);
    let mut order = Vec::new();
    while let Some(i) = rx.recv().await {
        order.push(i);
    }
    assert_eq!(
        order,
        (0..6).collect::<Vec<_>>(),
        "grants out of arrival order"
    );
    assert_eq!(connections(&app).await, 1, "a pool of 1 opened more");
}

/// The pool's connection is closed and the link to the server turns slow
/// (`latency` each way, per message); calls of a client with call timeout
/// `timeout` and pool size 1 (connecting to `url`'s server through a
/// proxy) are tried until one is answered, for up to 15 s.
async fn answered_after_a_slow_reconnect(url: &str, latency: Duration, timeout: Duration) {
    use conformance::testkit::proxy::FaultProxy;
    use coord_core::{Lock, OwnerToken};
    let pg = cluster();
    let proxy = FaultProxy::start(pg.port());
    let url = url.replace(&format!(":{}/", pg.port()), &format!(":{}/", proxy.port()));
    let b = coord_postgres::builder(&url)
        .schema(unique("slow_connect"))
        .pool_size(1)
        .prepared_statements(true)
        .sweep_every(None)
        .listen(false)
        .call_timeout(timeout)
        .connect_backend()
        .await
        .expect("connect through the proxy");
    let o = OwnerToken::random();
    assert!(matches!(
        b.try_acquire("warm", o.step(), Duration::from_secs(10))
            .await,
        Ok(coord_core::Attempt::Granted(_))
    ));
    proxy.latency(latency);
    proxy.reset();
    let start = std::time::Instant::now();
    let mut errors = Vec::new();
    loop {
        // (A release that timed out may have been applied: only whether
        // one is answered counts.)
        match b.release("warm", o.step()).await {
            Ok(_) => break,
            Err(e) => errors.push(format!("{:?}: {e}", start.elapsed())),
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "no call answered in 15 s: {errors:#?}"
        );
    }
    println!(
        "answered after {:?}, {} calls failed",
        start.elapsed(),
        errors.len()
    );
}

/// Connecting takes longer than the call timeout (a SCRAM login and the
/// session settings: four round trips of 100 ms, against 350 ms) while a
/// call on an open connection does not (two). A call that times out while
/// its connection is being made must leave that connect to go on, for the
/// next call: dropped with the call, every call would start a connect of
/// its own and none would ever be answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_slower_than_the_call_timeout_is_not_given_up_with_the_call() {
    let pg = cluster();
    let user = unique("slow_login");
    let url = blocking_role(pg, &user);
    answered_after_a_slow_reconnect(&url, Duration::from_millis(50), Duration::from_millis(350))
        .await;
}

/// A role of its own with a SCRAM password; its URL.
fn blocking_role(pg: &conformance::testkit::postgres::PgCluster, user: &str) -> String {
    pg.create_role(user, "slow-Pa55", "postgres")
}
