//! Authentication and TLS: the right password works and a wrong one is a
//! clear error, no password shows in errors or `Debug`, and `rediss://`
//! with a trusted certificate or certificate files named in the URL.

use crate::common;
use std::time::Duration;

use common::{SEC, backend, granted, unique};
use conformance::testkit::redis::{self as kit, RedisServer, Resp};
use coord_core::util::Secret;
use coord_core::{Attempt, Error, FencingSource, Lock, OwnerToken};
use coord_redis::{RedisBackend, RedisOptions};

#[tokio::test]
async fn password_server_right_password_works_wrong_one_is_a_clear_auth_error() {
    let password = "s3cr3t-Pa55w0rd-for-coord";
    let wrong = "wr0ng-Pa55w0rd-for-coord";
    let server = RedisServer::start_with_password(password);

    // Right password, in the URL.
    let b = backend(&server.url()).await;
    let me = OwnerToken::random();
    let name = unique("auth");
    granted(b.try_acquire(&name, me.step(), SEC).await.unwrap());
    assert!(b.release(&name, me.step()).await.unwrap());
    let shown = format!("{b:?}");
    assert!(!shown.contains(password), "{shown}");

    // Right password given apart from the URL.
    let opts = RedisOptions::new(&server.url_without_password()).password(Secret::new(password));
    assert!(!format!("{opts:?}").contains(password));
    let coord = opts.connect().await.expect("password option works");
    assert!(!format!("{coord:?}").contains(password));

    // Wrong password: a clear authentication error without the password.
    let url = format!("redis://:{wrong}@127.0.0.1:{}", server.port());
    let opts = RedisOptions::new(&url).connect_timeout(Duration::from_secs(5));
    assert!(!format!("{opts:?}").contains(wrong));
    let err = RedisBackend::connect(opts).await.unwrap_err();
    let (display, debug) = (err.to_string(), format!("{err:?}"));
    eprintln!("wrong password -> {display}");
    for text in [&display, &debug] {
        assert!(!text.contains(wrong), "{text}");
        assert!(!text.contains(password), "{text}");
    }
    assert!(
        display.to_lowercase().contains("authentication failed"),
        "{display}"
    );
    assert!(matches!(err, Error::Store { .. }), "{err:?}");
    // The client library's error is kept as the source, shown (and
    // printed in an error chain) without the password; the original is
    // there to inspect.
    let source = std::error::Error::source(&err).expect("the client library's error");
    let shown = format!("{source} {source:?}");
    assert!(!shown.contains(wrong), "{shown}");
    let source = source
        .downcast_ref::<coord_core::StoreSource>()
        .expect("a StoreSource");
    assert!(
        source.inner().downcast_ref::<redis::RedisError>().is_some(),
        "{source:?}"
    );

    // Wrong password given as an option.
    let opts = RedisOptions::new(&server.url_without_password()).password(Secret::new(wrong));
    let err = RedisBackend::connect(opts).await.unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(!text.contains(wrong), "{text}");
    assert!(text.to_lowercase().contains("authentication"), "{text}");

    // An ACL user with its own password.
    let acl = server.command(&[
        "ACL",
        "SETUSER",
        "alice",
        "on",
        ">alice-Pa55",
        "~*",
        "&*",
        "+@all",
    ]);
    assert_eq!(acl, Resp::Simple("OK".into()));
    let alice = backend(&format!(
        "redis://alice:alice-Pa55@127.0.0.1:{}",
        server.port()
    ))
    .await;
    let shown = format!("{alice:?}");
    assert!(
        shown.contains("alice@") && !shown.contains("alice-Pa55"),
        "{shown}"
    );
    granted(alice.try_acquire(&name, me.step(), SEC).await.unwrap());
    assert!(alice.release(&name, me.step()).await.unwrap());
    let err = RedisBackend::connect(RedisOptions::new(&format!(
        "redis://alice:nope-Pa55@127.0.0.1:{}",
        server.port()
    )))
    .await
    .unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(
        !text.contains("nope-Pa55") && text.contains("authentication"),
        "{text}"
    );

    // No password at all: also an authentication error.
    let err = RedisBackend::connect(RedisOptions::new(&server.url_without_password()))
        .await
        .unwrap_err();
    assert!(
        err.to_string().to_lowercase().contains("authentication"),
        "{err}"
    );
}

#[tokio::test]
async fn malformed_url_is_a_config_error_without_the_password() {
    let err = RedisBackend::connect(RedisOptions::new("http://:hunter2@localhost/"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(!format!("{err} {err:?}").contains("hunter2"));
}

#[tokio::test]
async fn debug_never_shows_the_password() {
    let opts = RedisOptions::new("rediss://alice:hunter2@example.invalid:6380/3")
        .password(Secret::new("hunter3"));
    let shown = format!("{opts:?}");
    assert!(
        !shown.contains("hunter2") && !shown.contains("hunter3"),
        "{shown}"
    );
    assert!(shown.contains("alice"), "{shown}");
}

#[tokio::test]
async fn rediss_tls_with_a_trusted_certificate() {
    let server = RedisServer::start_tls();
    let url = server.url();
    assert!(url.starts_with("rediss://"));
    let opts = || RedisOptions::new(&url).tls_root_certificate(server.tls_ca_certificate_pem());
    let (a, w) = (
        RedisBackend::connect(opts()).await.expect("TLS connect"),
        RedisBackend::connect(opts()).await.expect("TLS connect"),
    );
    assert!(format!("{a:?}").contains("rediss://127.0.0.1"));
    let name = unique("tls");
    let me = OwnerToken::random();
    granted(a.try_acquire(&name, me.step(), 10 * SEC).await.unwrap());
    // Wake-ups travel over TLS too.
    let waiter = Lock::subscribe(&w, &name, &OwnerToken::random())
        .await
        .unwrap();
    let notified = waiter.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    assert!(matches!(
        w.try_acquire(&name, OwnerToken::random().step(), 10 * SEC)
            .await
            .unwrap(),
        Attempt::Held { .. }
    ));
    assert!(a.release(&name, me.step()).await.unwrap());
    tokio::time::timeout(Duration::from_secs(2), notified)
        .await
        .expect("wake-up over TLS");

    // A certificate nobody trusts is refused.
    let err =
        RedisBackend::connect(RedisOptions::new(&url).connect_timeout(Duration::from_secs(3)))
            .await
            .unwrap_err();
    assert!(matches!(err, Error::Store { .. }), "{err:?}");
    assert!(err.to_string().contains("TLS handshake failed"), "{err}");
    // Certificates for a plain URL are a configuration error.
    let err = RedisBackend::connect(
        RedisOptions::new(&kit::url()).tls_root_certificate(server.tls_ca_certificate_pem()),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
}

/// `rediss://...?tls_ca_file=PATH` trusts the CA in that file (read when
/// the options are made), as `tls_root_certificate` does; a client
/// certificate and key from `tls_cert_file` / `tls_key_file` are presented;
/// a missing file is a `Config` error naming the option and the path.
#[tokio::test]
async fn rediss_tls_with_certificate_files_named_in_the_url() {
    let server = RedisServer::start_tls();
    let dir = conformance::testkit::scratch_dir().join(unique("tls-files"));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, server.tls_ca_certificate_pem()).unwrap();
    let url = format!(
        "{}?tls_ca_file={}&prefix=tlsfile:",
        server.url(),
        ca.display()
    );
    let b = RedisBackend::connect(RedisOptions::new(&url))
        .await
        .expect("TLS connect trusting the CA file");
    let name = unique("tls-file");
    let me = OwnerToken::random();
    granted(b.try_acquire(&name, me.step(), 10 * SEC).await.unwrap());
    assert!(b.release(&name, me.step()).await.unwrap());
    // Through the facade, as COORD_URL would be given.
    let c = coord_redis::connect(&url).await.expect("coord over TLS");
    assert!(c.fencing().unwrap().next("tls-file").await.is_ok());
    // A client certificate from files (this server does not ask for one,
    // so it only shows that both files were read and taken by rustls).
    std::fs::create_dir_all(dir.join("client")).unwrap();
    let id = conformance::testkit::etcd::make_tls_files(&dir.join("client"));
    let with_cert = format!(
        "{url}&tls_cert_file={}&tls_key_file={}",
        id.cert.display(),
        id.key.display()
    );
    let b = RedisBackend::connect(RedisOptions::new(&with_cert))
        .await
        .expect("TLS connect with a client certificate from files");
    FencingSource::next(&b, "tls-file").await.unwrap();
    // Without the CA file the server's certificate is not trusted.
    let err = RedisBackend::connect(
        RedisOptions::new(&server.url()).connect_timeout(Duration::from_secs(3)),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("TLS handshake failed"), "{err}");
    // A missing file: Config, naming the option and the path, before any
    // connection is tried.
    let missing = dir.join("nope.pem");
    let err = coord_redis::connect(&format!(
        "{}?tls_ca_file={}",
        server.url(),
        missing.display()
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("`tls_ca_file`") && msg.contains(&missing.display().to_string()),
        "{msg}"
    );
    // The CA file on a plain redis:// URL is a configuration error too.
    let err = RedisBackend::connect(RedisOptions::new(&format!(
        "{}?tls_ca_file={}",
        kit::url(),
        ca.display()
    )))
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
