//! Pooling and the listener: PgBouncer with a direct LISTEN URL (apart or
//! in the one URL) keeps wake-ups, prepared statements only on direct
//! connections, dropping the client closes its connections, and listening
//! can be turned off.

use std::time::{Duration, Instant};

use conformance::testkit::postgres::{cluster, pgbouncer};

use super::unique;

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
