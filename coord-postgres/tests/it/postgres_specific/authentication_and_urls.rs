//! Connecting: a SCRAM role's right and wrong password, an unreachable
//! server that is unavailable without showing the password, and options
//! in the URL that take effect.

use std::time::Duration;

use conformance::testkit::postgres::cluster;
use coord_core::Error;

use super::unique;

/// A role with a SCRAM password: the right password works; a wrong one is
/// a clear, non-retryable error that contains neither password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_role_right_and_wrong_password() {
    let db = unique("scramdb");
    cluster().create_database(&db);
    let user = unique("alice");
    let right = "S3cret-right_pw";
    let url = cluster().create_role(&user, right, &db);
    let coord = coord_postgres::connect(&url)
        .await
        .expect("the right password connects");
    let g = coord
        .locks()
        .unwrap()
        .try_acquire("scram", Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free");
    g.release().await.unwrap();
    assert!(!format!("{coord:?}").contains(right));

    let wrong = "Wr0ng-pw_guess";
    let bad_url = cluster().url_as(&user, wrong, &db);
    let e = coord_postgres::connect(&bad_url)
        .await
        .expect_err("a wrong password must fail");
    let text = format!("{e} / {e:?}");
    assert!(
        text.contains("password authentication failed"),
        "the error says what is wrong: {text}"
    );
    assert!(!text.contains(wrong) && !text.contains(right), "{text}");
    assert!(matches!(e, Error::Store { .. }), "{e:?}");
    assert!(!e.is_retryable(), "a wrong password is not worth retrying");

    let builder = coord_postgres::builder(&bad_url).listen_url(&url);
    assert!(!format!("{builder:?}").contains(wrong));
    assert!(!format!("{builder:?}").contains(right));
}

/// Nothing listens on this port: the error is Unavailable (retryable) and
/// has no password in it.
#[tokio::test]
async fn unreachable_server_is_unavailable_without_password() {
    let port = conformance::testkit::port::free_port();
    let e = coord_postgres::builder(&format!(
        "postgres://bob:Hunter2pw@127.0.0.1:{port}/x?sslmode=disable"
    ))
    .connect_timeout(Duration::from_secs(2))
    .connect()
    .await
    .expect_err("nobody listens");
    assert!(e.is_retryable(), "{e:?}");
    assert!(!format!("{e} {e:?}").contains("Hunter2pw"), "{e}");
}

/// Options in the URL take effect (the unprefixed aliases too): the schema
/// holding the tables, the pool size, the call timeout (which is also each
/// session's `statement_timeout`), prepared statements; a bad option fails
/// before any connection is tried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_options_take_effect() {
    let schema = unique("urlopt");
    let url = format!(
        "{}&schema={schema}&pool_size=3&statement_timeout=1500ms&coord_sweep_every=off\
         &coord_prepared_statements=false",
        cluster().url()
    );
    let b = coord_postgres::builder(&url)
        .connect_backend()
        .await
        .unwrap();
    assert_eq!(b.schema(), schema);
    assert_eq!(b.pool().status().max_size, 3);
    assert!(!b.prepared_statements());
    assert!(format!("{b:?}").contains("1.5s"), "{b:?}");
    let g = b
        .coord()
        .locks()
        .unwrap()
        .try_acquire("from-url", Duration::from_secs(10))
        .await
        .unwrap()
        .expect("granted");
    g.release().await.unwrap();
    for bad in ["coord_timeout=2", "pool_size=none", "coord_sweep_every=0s"] {
        match coord_postgres::connect(&format!("postgres://u@127.0.0.1:1/db?{bad}")).await {
            Err(Error::Config(m)) => assert!(m.contains(bad.split('=').next().unwrap()), "{m}"),
            Err(e) => panic!("{bad}: not a Config error: {e}"),
            Ok(_) => panic!("{bad}: connected"),
        }
    }
}
