//! TLS with libpq's `sslmode` semantics, against a cluster that requires
//! TLS and presents a certificate signed by a throwaway CA.

use std::sync::OnceLock;
use std::time::Duration;

use conformance::testkit::postgres::PgCluster;
use coord_core::Error;

fn tls() -> &'static PgCluster {
    static TLS: OnceLock<PgCluster> = OnceLock::new();
    TLS.get_or_init(PgCluster::create_tls)
}

fn url(host: &str, query: &str) -> String {
    format!(
        "postgres://postgres@{host}:{}/postgres?{query}",
        tls().port()
    )
}

/// Connect, take a lock, and report whether the pooled connection is
/// encrypted.
async fn encrypted(url: &str) -> coord_core::Result<bool> {
    let backend = coord_postgres::builder(url)
        .connect_timeout(Duration::from_secs(5))
        .connect_backend()
        .await?;
    let coord = backend.coord();
    assert!(
        coord.capabilities().notifications,
        "LISTEN over TLS works too"
    );
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = format!(
        "tls-lock-{}",
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let g = coord
        .locks()?
        .try_acquire(&name, Duration::from_secs(5))
        .await?
        .expect("free");
    g.release().await?;
    let client = backend.pool().get().await.unwrap();
    let row = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    Ok(row.get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_and_verify_ca_with_the_right_ca() {
    let ca = tls().ca_cert();
    for host in ["localhost", "127.0.0.1"] {
        for mode in ["verify-full", "verify-ca"] {
            let u = url(
                host,
                &format!("sslmode={mode}&sslrootcert={}", ca.display()),
            );
            assert!(encrypted(&u).await.unwrap_or_else(|e| panic!("{u}: {e}")));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_and_prefer_encrypt_without_a_ca() {
    for query in ["sslmode=require", "sslmode=prefer", "connect_timeout=5"] {
        let u = url("127.0.0.1", query);
        assert!(encrypted(&u).await.unwrap_or_else(|e| panic!("{u}: {e}")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_or_no_tls_is_refused_clearly() {
    // A server certificate not signed by the CA we trust.
    let other = tls().other_ca_cert();
    let u = format!(
        "postgres://postgres:Pw-not-shown@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}",
        tls().port(),
        other.display()
    );
    let e = coord_postgres::connect(&u)
        .await
        .expect_err("untrusted certificate");
    let text = format!("{e} {e:?}");
    assert!(!text.contains("Pw-not-shown"), "{text}");
    assert!(
        !e.is_retryable(),
        "a bad certificate is not an outage: {e:?}"
    );
    assert!(
        text.to_lowercase().contains("certificate"),
        "the error names the certificate problem: {text}"
    );
    // require + the wrong root: verified as verify-ca (libpq), refused.
    let u = url(
        "127.0.0.1",
        &format!("sslmode=require&sslrootcert={}", other.display()),
    );
    assert!(coord_postgres::connect(&u).await.is_err());
    // Plain TCP is rejected by the server's hostssl-only rules.
    let e = coord_postgres::connect(&url("127.0.0.1", "sslmode=disable"))
        .await
        .expect_err("no TLS");
    assert!(matches!(e, Error::Store { .. }), "{e:?}");
    // A missing root file is a configuration error.
    let e = coord_postgres::connect(&url(
        "localhost",
        "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
    ))
    .await
    .expect_err("no such file");
    assert!(matches!(e, Error::Config(_)), "{e:?}");
}
