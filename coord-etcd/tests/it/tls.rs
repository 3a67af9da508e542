//! TLS: a client that trusts the server's CA connects over `etcds://`; one
//! that does not, or that speaks plain text, is refused.

use std::time::Duration;

use conformance::testkit::etcd::EtcdServer;
use coord_core::Error;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_the_right_ca_and_refusals_without() {
    let server = tokio::task::spawn_blocking(EtcdServer::start_tls)
        .await
        .unwrap();
    let ca = server.tls_files().expect("a TLS server").ca.clone();
    let url = format!(
        "etcds://{}?ca_file={}&timeout_ms=3000",
        server.endpoint(),
        ca.display()
    );
    let coord = coord_etcd::connect(&url).await.expect("connect over TLS");
    let g = coord
        .locks()
        .unwrap()
        .acquire("tls-lock", Duration::from_secs(5), Duration::ZERO)
        .await
        .unwrap();
    assert!(g.fencing_token().get() > 0);
    g.release().await.unwrap();

    // Not trusting the test CA (system roots only): refused.
    let untrusted = format!(
        "etcds://{}?timeout_ms=2000&connect_timeout_ms=1000",
        server.endpoint()
    );
    let e = coord_etcd::connect(&untrusted)
        .await
        .expect_err("an untrusted server certificate must be refused");
    assert!(
        matches!(e, Error::Unavailable { .. } | Error::Store { .. }),
        "{e}"
    );

    // Plain text against the TLS port: refused.
    let plain = format!(
        "etcd://{}?timeout_ms=2000&connect_timeout_ms=1000",
        server.endpoint()
    );
    assert!(coord_etcd::connect(&plain).await.is_err());

    // Unreadable CA file: a configuration error before any I/O.
    let e = coord_etcd::connect(&format!(
        "etcds://{}?ca_file=/nonexistent.pem",
        server.endpoint()
    ))
    .await
    .unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e}");
}
