//! The `sqlx` feature against the real server: fenced writes inside a sqlx
//! transaction (applied, stale, missing, rolled back), and a backend built
//! from a sqlx `PgPool` (its settings carried over, or a typed error).
#![cfg(feature = "sqlx")]

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use conformance::testkit::postgres::cluster;
use coord_core::{Error, FencingToken};
use coord_postgres::sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use coord_postgres::sqlx::{self, Row};
use coord_postgres::{FencedTable, FencedWrite};

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A sqlx pool on a fresh database, and a coord backend built from it.
async fn setup(tag: &str) -> (PgPool, coord_core::Coord) {
    let url = cluster().create_database(&unique(tag));
    let pool = PgPool::connect(&url).await.unwrap();
    let coord = coord_postgres::from_sqlx_pool(&pool)
        .unwrap()
        .connect()
        .await
        .unwrap();
    (pool, coord)
}

async fn create_accounts(pool: &PgPool) -> (String, FencedTable) {
    let table = unique("accounts");
    sqlx::raw_sql(&format!(
        "CREATE TABLE \"{table}\" (id text PRIMARY KEY, balance bigint NOT NULL, \
         note text, fencing_token bigint NOT NULL DEFAULT 0); \
         INSERT INTO \"{table}\" VALUES ('acct-1', 100, NULL, 0)"
    ))
    .execute(pool)
    .await
    .unwrap();
    let fenced = FencedTable::new(&table, "id", "fencing_token").unwrap();
    (table, fenced)
}

/// (balance, note, token) of a row, or None.
async fn row<'e>(
    e: impl sqlx::PgExecutor<'e>,
    table: &str,
    id: &str,
) -> Option<(i64, Option<String>, u64)> {
    sqlx::query(&format!(
        "SELECT balance, note, fencing_token FROM \"{table}\" WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(e)
    .await
    .unwrap()
    .map(|r| {
        (
            r.get::<i64, _>(0),
            r.get::<Option<String>, _>(1),
            r.get::<i64, _>(2) as u64,
        )
    })
}

/// Two holders of one lock, the first one's claim lost (a forced release
/// stands in for an expiry behind its back): (old token, new token).
async fn two_holders(coord: &coord_core::Coord, name: &str) -> (FencingToken, FencingToken) {
    let locks = coord.locks().unwrap();
    let g1 = locks
        .try_acquire(name, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let t1 = g1.fencing_token();
    assert!(locks.force_release(name).await.unwrap());
    let g2 = locks
        .try_acquire(name, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let t2 = g2.fencing_token();
    assert!(t2 > t1);
    g2.release().await.unwrap();
    drop(g1);
    (t1, t2)
}

/// Inside one sqlx transaction: the current holder's update and upsert are
/// applied, the same token again too (>=), the stale holder's late writes
/// are refused and change nothing, a missing row is told apart; committed,
/// the newest write is what stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_inside_a_sqlx_transaction() {
    let (pool, coord) = setup("sqlx_fence").await;
    let (table, fenced) = create_accounts(&pool).await;
    let (t1, t2) = two_holders(&coord, "acct-1").await;

    let mut tx = pool.begin().await.unwrap();
    let w = fenced
        .sqlx_update("acct-1", t2)
        .set("balance", 150_i64)
        .set("note", "by holder 2")
        .execute(&mut *tx)
        .await
        .unwrap();
    assert_eq!(w, FencedWrite::Applied);
    let w = fenced
        .sqlx_update("acct-1", t2)
        .set("balance", 160_i64)
        .execute(&mut *tx)
        .await
        .unwrap();
    assert_eq!(w, FencedWrite::Applied, "the same token again is accepted");
    // Holder 1 wakes up late and writes: refused, nothing changed.
    let w = fenced
        .sqlx_update("acct-1", t1)
        .set("balance", 1_i64)
        .set("note", None::<String>)
        .execute(&mut *tx)
        .await
        .unwrap();
    assert_eq!(w, FencedWrite::Stale);
    assert_eq!(
        row(&mut *tx, &table, "acct-1").await,
        Some((160, Some("by holder 2".into()), t2.get()))
    );
    // A missing row is told apart, and nothing is inserted.
    let w = fenced
        .sqlx_update("acct-2", t2)
        .set("balance", 5_i64)
        .execute(&mut *tx)
        .await
        .unwrap();
    assert_eq!(w, FencedWrite::Missing);
    assert_eq!(row(&mut *tx, &table, "acct-2").await, None);
    // Upsert inserts it, then fences it.
    let w = fenced
        .sqlx_upsert("acct-2", t2)
        .set("balance", 7_i64)
        .execute(&mut *tx)
        .await
        .unwrap();
    assert_eq!(w, FencedWrite::Applied);
    let w = fenced
        .sqlx_upsert("acct-2", t1)
        .set("balance", 1_i64)
        .set("note", "stale")
        .execute(&mut *tx)
        .await
        .unwrap();
    assert_eq!(w, FencedWrite::Stale);
    // An existing row is updated by an upsert with the current token.
    let w = fenced
        .sqlx_upsert("acct-1", t2)
        .set("balance", 170_i64)
        .execute(&mut *tx)
        .await
        .unwrap();
    assert_eq!(w, FencedWrite::Applied);
    // Nobody outside sees the transaction's writes before the commit.
    assert_eq!(
        row(&pool, &table, "acct-1").await,
        Some((100, None, 0)),
        "uncommitted writes leaked"
    );
    tx.commit().await.unwrap();
    assert_eq!(
        row(&pool, &table, "acct-1").await,
        Some((170, Some("by holder 2".into()), t2.get()))
    );
    assert_eq!(
        row(&pool, &table, "acct-2").await,
        Some((7, None, t2.get()))
    );

    // The other executors: a plain connection, and the pool itself.
    let mut conn = pool.acquire().await.unwrap();
    let w = fenced
        .sqlx_update("acct-1", t1)
        .set("balance", 2_i64)
        .execute(&mut *conn)
        .await
        .unwrap();
    assert_eq!(w, FencedWrite::Stale);
    let w = fenced
        .sqlx_update("acct-1", t2)
        .set("balance", 180_i64)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(w, FencedWrite::Applied);
    assert_eq!(row(&pool, &table, "acct-1").await.unwrap().0, 180);
}

/// Fenced writes applied inside a transaction that is rolled back leave
/// nothing: no value, no token, no inserted row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_transaction_leaves_nothing() {
    let (pool, coord) = setup("sqlx_rollback").await;
    let (table, fenced) = create_accounts(&pool).await;
    let (_, t) = two_holders(&coord, "acct-1").await;

    let mut tx = pool.begin().await.unwrap();
    assert!(
        fenced
            .sqlx_update("acct-1", t)
            .set("balance", 999_i64)
            .execute(&mut *tx)
            .await
            .unwrap()
            .applied()
    );
    assert!(
        fenced
            .sqlx_upsert("acct-3", t)
            .set("balance", 3_i64)
            .execute(&mut *tx)
            .await
            .unwrap()
            .applied()
    );
    assert_eq!(row(&mut *tx, &table, "acct-1").await.unwrap().0, 999);
    tx.rollback().await.unwrap();
    assert_eq!(row(&pool, &table, "acct-1").await, Some((100, None, 0)));
    assert_eq!(row(&pool, &table, "acct-3").await, None);

    // Dropped without commit: the same.
    {
        let mut tx = pool.begin().await.unwrap();
        assert!(
            fenced
                .sqlx_upsert("acct-4", t)
                .set("balance", 4_i64)
                .execute(&mut *tx)
                .await
                .unwrap()
                .applied()
        );
    }
    assert_eq!(row(&pool, &table, "acct-4").await, None);
}

/// Bad calls are refused before anything is sent; server errors are
/// Store errors and leave the transaction to be rolled back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_fenced_writes_are_typed_errors() {
    let (pool, coord) = setup("sqlx_bad").await;
    let (table, fenced) = create_accounts(&pool).await;
    let (_, t) = two_holders(&coord, "acct-1").await;
    let mut tx = pool.begin().await.unwrap();
    for column in ["id", "fencing_token", "bad name", ""] {
        let e = fenced
            .sqlx_update("acct-1", t)
            .set(column, "x")
            .execute(&mut *tx)
            .await
            .unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument { .. }),
            "{column}: {e:?}"
        );
    }
    let e = fenced
        .sqlx_upsert("acct-1", FencingToken(u64::MAX))
        .set("balance", 1_i64)
        .execute(&mut *tx)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    // Nothing was sent: the transaction is still usable.
    assert_eq!(row(&mut *tx, &table, "acct-1").await, Some((100, None, 0)));
    let e = fenced
        .sqlx_update("acct-1", t)
        .set("no_such_column", 1_i64)
        .execute(&mut *tx)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Store { .. }), "{e:?}");
    assert!(e.to_string().contains("42703"), "the SQLSTATE is told: {e}");
    tx.rollback().await.unwrap();
}

/// A backend built from a sqlx pool of a password-protected role: the
/// password, user, database and application name are carried over; it
/// takes locks with increasing fencing tokens on its own connections.
/// The same pool with a wrong password fails to connect, as a URL would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_from_a_pg_pool_takes_locks_with_fencing_tokens() {
    let db = unique("sqlx_pooldb");
    cluster().create_database(&db);
    let user = unique("carol");
    let password = "P@ss:w/rd%with&odd=chars";
    let role_url = cluster().create_role(&user, password, &db);
    let app = unique("sqlx_app");
    let options = PgConnectOptions::from_str(&role_url.replace(password, "x"))
        .unwrap()
        .password(password)
        .application_name(&app);
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options.clone())
        .await
        .unwrap();
    let backend = coord_postgres::from_sqlx_pool(&pool)
        .unwrap()
        .schema(unique("s"))
        .connect_backend()
        .await
        .expect("the pool's password, user and database are carried over");
    let coord = backend.coord();
    let locks = coord.locks().unwrap();
    let mut last = FencingToken(0);
    for _ in 0..3 {
        let g = locks
            .try_acquire("job", Duration::from_secs(10))
            .await
            .unwrap()
            .expect("free");
        assert!(g.fencing_token() > last);
        last = g.fencing_token();
        g.release().await.unwrap();
    }
    // coord's own connections, as the pool's role, on its database, with
    // its application name (the sqlx pool holds at most 2).
    let (n, who, on): (i64, String, String) = sqlx::query_as(
        "SELECT count(*), min(usename)::text, min(datname)::text FROM pg_stat_activity \
         WHERE application_name = $1",
    )
    .bind(&app)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        n >= 2,
        "coord's connections carry the application name: {n}"
    );
    assert_eq!((who.as_str(), on.as_str()), (user.as_str(), db.as_str()));
    assert!(!format!("{backend:?}").contains(password));

    let wrong = PgPoolOptions::new().connect_lazy_with(options.password("Wr0ng-guess"));
    let e = coord_postgres::from_sqlx_pool(&wrong)
        .unwrap()
        .connect()
        .await
        .expect_err("a wrong password must fail");
    assert!(matches!(e, Error::Store { .. }), "{e:?}");
    let text = format!("{e} / {e:?}");
    assert!(text.contains("password authentication failed"), "{text}");
    assert!(
        !text.contains("Wr0ng-guess") && !text.contains(password),
        "{text}"
    );
}

/// Settings coord cannot honour are a typed Config error naming them, not
/// silently dropped: client certificates, an inline root certificate.
#[tokio::test]
async fn a_pool_whose_options_cannot_be_carried_over_is_a_config_error() {
    let base = PgConnectOptions::from_str(&cluster().url()).unwrap();
    for (options, name) in [
        (base.clone().ssl_client_cert("/etc/client.pem"), "sslcert"),
        (base.clone().ssl_client_key("/etc/client.key"), "sslkey"),
        (
            base.clone().ssl_root_cert_from_pem(
                b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".to_vec(),
            ),
            "sslrootcert",
        ),
    ] {
        let pool = PgPoolOptions::new().connect_lazy_with(options);
        let e = coord_postgres::from_sqlx_pool(&pool).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{name}: {e:?}");
        assert!(e.to_string().contains(name), "{name}: {e}");
    }
    // A root certificate file is carried over (and then read at connect).
    let pool = PgPoolOptions::new().connect_lazy_with(
        base.clone()
            .ssl_mode(sqlx::postgres::PgSslMode::VerifyCa)
            .ssl_root_cert("/nonexistent/ca.pem"),
    );
    let e = coord_postgres::from_sqlx_pool(&pool)
        .unwrap()
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
}

/// Whether the backend's pooled connections come over TLS, and over a
/// unix socket; a lock is taken first.
async fn connection_of(backend: &std::sync::Arc<coord_postgres::PostgresBackend>) -> (bool, bool) {
    let g = backend
        .coord()
        .locks()
        .unwrap()
        .try_acquire("conn", Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free");
    g.release().await.unwrap();
    let client = backend.pool().get().await.unwrap();
    let row = client
        .query_one(
            "SELECT ssl, inet_client_addr() IS NULL FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// `sslmode=verify-full` and the `sslrootcert` file of sqlx options are
/// carried over: the backend connects over TLS to a server whose
/// certificate that CA signed, and refuses one it did not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_settings_are_carried_over() {
    let tls = conformance::testkit::postgres::PgCluster::create_tls();
    let options = |ca: &std::path::Path| {
        PgConnectOptions::new_without_pgpass()
            .host("localhost")
            .port(tls.port())
            .username("postgres")
            .database("postgres")
            .ssl_mode(sqlx::postgres::PgSslMode::VerifyFull)
            .ssl_root_cert(ca)
    };
    let backend = coord_postgres::from_sqlx_options(&options(&tls.ca_cert()))
        .unwrap()
        .connect_backend()
        .await
        .unwrap();
    assert_eq!(connection_of(&backend).await, (true, false), "TLS over TCP");
    drop(backend);
    let e = coord_postgres::from_sqlx_options(&options(&tls.other_ca_cert()))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect_err("a server certificate the CA did not sign");
    assert!(!e.is_retryable(), "{e:?}");
    assert!(e.to_string().contains("certificate"), "{e}");
}

/// A unix-socket directory in the sqlx options is where the backend
/// connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_socket_is_carried_over() {
    let options = PgConnectOptions::new_without_pgpass()
        .socket(cluster().dir())
        .port(cluster().port())
        .username("postgres")
        .database("postgres");
    let backend = coord_postgres::from_sqlx_options(&options)
        .unwrap()
        .schema(unique("sock"))
        .connect_backend()
        .await
        .unwrap();
    assert_eq!(
        connection_of(&backend).await,
        (false, true),
        "a unix socket"
    );
}
