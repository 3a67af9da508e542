//! The LISTEN connection cannot connect when the client starts (its URL
//! points at a port where nothing answers yet); it keeps trying, and once
//! the port comes up, wake-ups arrive by NOTIFY.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use conformance::testkit::port::free_port;
use conformance::testkit::postgres::cluster;
use tokio::net::{TcpListener, TcpStream};

/// Forward every connection accepted on `listener` to the cluster; counts
/// the connections.
fn forward(listener: TcpListener, accepted: Arc<AtomicU64>) {
    let target = cluster().port();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            accepted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", target)).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
}

/// Sessions that have run LISTEN on the wake-up channel of `schema`, seen
/// by the server (other tests' clients, on other schemas, may still be
/// closing their listening sessions).
fn listening_sessions(schema: &str) -> u64 {
    cluster()
        .psql(
            "postgres",
            &format!(
                "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN \"{schema}_wake\"' \
                 AND pid <> pg_backend_pid()"
            ),
        )
        .trim()
        .parse()
        .expect("a count")
}

/// The client starts while its listen URL refuses connections; the
/// polling fallback is a minute, so a prompt wake-up can only come from
/// NOTIFY. Once the port answers, the listener connects by itself and a
/// release wakes the waiter within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_cannot_connect_at_start_recovers() {
    let _alone = crate::ALONE.lock().await;
    let port = free_port();
    let listen_url = format!("postgres://postgres@127.0.0.1:{port}/postgres?sslmode=disable");
    let schema = format!("listen_recovers_{}", std::process::id());
    let coord = coord_postgres::builder(&cluster().url())
        .schema(schema.clone())
        .listen_url(&listen_url)
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await
        .expect("the statements' server is up")
        .with_poll_interval(Duration::from_secs(60));
    assert_eq!(listening_sessions(&schema), 0);

    tokio::time::sleep(Duration::from_millis(500)).await;
    let accepted = Arc::new(AtomicU64::new(0));
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind the listen port");
    forward(listener, accepted.clone());
    let deadline = Instant::now() + Duration::from_secs(10);
    while listening_sessions(&schema) == 0 {
        assert!(
            Instant::now() < deadline,
            "the listener did not connect within 10 s of its port coming up \
             ({} connections accepted)",
            accepted.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let locks = coord.locks().unwrap();
    let name = format!("listen-recovers-{}", std::process::id());
    let held = locks
        .try_acquire(&name, Duration::from_secs(30))
        .await
        .unwrap()
        .expect("free");
    let waiter = {
        let locks = locks.clone();
        let name = name.clone();
        tokio::spawn(async move {
            locks
                .acquire(&name, Duration::from_secs(30), Duration::from_secs(10))
                .await
                .map(|g| (g, Instant::now()))
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.release().await.unwrap();
    let released = Instant::now();
    let (g, woke) = waiter
        .await
        .unwrap()
        .expect("the waiter gets the lock after the release");
    // From the release's reply; the waiter polls every 60 s (30 s at the
    // soonest, jittered) and waits 10 s, so 3 s still tells a wake-up from
    // a poll on a loaded machine.
    let lag = woke.saturating_duration_since(released);
    assert!(
        lag < Duration::from_secs(3),
        "the waiter took {lag:?} after the release's reply: no wake-up came by NOTIFY"
    );
    g.release().await.unwrap();
}
