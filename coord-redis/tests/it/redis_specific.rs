//! Redis-specific tests: interoperation with the PHP `RedisLock` class,
//! script reloading, authentication, restarts and outages, round-trip
//! counts, and that no password ever shows. (Fencing after data loss is in
//! `fencing.rs`, limiters in `limiter.rs`, key layout in `keys.rs`.)

use crate::common;
use std::time::{Duration, Instant};

use common::{SEC, backend, eventually, granted, php_backend, unique};
use conformance::testkit::redis::{self as kit, CountingProxy, RedisServer, Resp};
use coord_core::util::Secret;
use coord_core::{
    Algorithm, Attempt, Barrier, Election, Error, FencingSource, Lease, Limiter, Lock, OwnerToken,
    Quota,
};
use coord_redis::{RedisBackend, RedisOptions};

#[tokio::test]
async fn php_php_set_nx_blocks_a_coord_lock_and_coord_never_deletes_it() {
    let server = kit::server();
    let b = php_backend(&server.url()).await;
    let name = unique("order_process");
    let php_token = "0123456789abcdef0123456789abcdef";

    // What PHP's RedisLock::acquire sends.
    let reply = server.command(&["SET", &name, php_token, "NX", "EX", "30"]);
    assert_eq!(reply, Resp::Simple("OK".into()));

    let me = OwnerToken::random();
    match b.try_acquire(&name, &me, 10 * SEC).await.unwrap() {
        Attempt::Held { expires_in } => {
            let left = expires_in.expect("the PTTL of the PHP lock");
            assert!(left > 25 * SEC && left <= 30 * SEC, "{left:?}");
        }
        other => panic!("a PHP-held lock must block coord, got {other:?}"),
    }
    // coord's release and extend never touch a lock holding another token.
    assert!(!b.release(&name, &me).await.unwrap());
    assert!(!b.extend(&name, &me, 60 * SEC).await.unwrap());
    assert_eq!(server.command(&["GET", &name]).as_str(), Some(php_token));

    // The PHP release (its compare-and-delete) frees it; then coord gets it.
    let php_release = "if redis.call('get', KEYS[1]) == ARGV[1] then \
                       return redis.call('del', KEYS[1]) else return 0 end";
    let r = server.command(&["EVAL", php_release, "1", &name, php_token]);
    assert_eq!(r, Resp::Int(1));
    let token = granted(b.try_acquire(&name, &me, 10 * SEC).await.unwrap());

    // The key holds coord's owner token as 32 hex digits, as PHP's would,
    // with the TTL set; the fencing counter is the PHP class's key.
    assert_eq!(
        server.command(&["GET", &name]).as_str(),
        Some(me.to_hex().as_str())
    );
    let pttl = server.command(&["PTTL", &name]).as_int().unwrap();
    assert!(pttl > 9_000 && pttl <= 10_000, "{pttl}");
    let counter = server
        .command(&["GET", &format!("fencing_token_{name}")])
        .as_int()
        .unwrap();
    assert_eq!(counter as u64, token);

    // Now PHP is locked out by coord.
    let reply = server.command(&["SET", &name, php_token, "NX", "EX", "30"]);
    assert!(reply.is_nil(), "PHP's SET NX must fail, got {reply:?}");
    // And PHP's release with its own token does not delete coord's lock.
    let r = server.command(&["EVAL", php_release, "1", &name, php_token]);
    assert_eq!(r, Resp::Int(0));
    assert!(b.release(&name, &me).await.unwrap());
    assert!(server.command(&["GET", &name]).is_nil());

    // PHP's `INCR fencing_token_<resource>` and coord's fencing source
    // share the counter and keep it rising.
    let php_next = server
        .command(&["INCR", &format!("fencing_token_{name}")])
        .as_int()
        .unwrap() as u64;
    assert!(php_next > token);
    let next = b.next(&name).await.unwrap().get();
    assert!(next > php_next);
}

#[tokio::test]
async fn release_never_deletes_a_lock_holding_another_token() {
    let b = backend(&kit::url()).await;
    let name = unique("foreign");
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let t = granted(b.try_acquire(&name, &a, 10 * SEC).await.unwrap());
    assert!(matches!(
        b.try_acquire(&name, &c, 10 * SEC).await.unwrap(),
        Attempt::Held {
            expires_in: Some(_)
        }
    ));
    assert!(!b.release(&name, &c).await.unwrap());
    assert!(!b.extend(&name, &c, 20 * SEC).await.unwrap());
    // Idempotent retry by the holder: the same token.
    assert_eq!(
        granted(b.try_acquire(&name, &a, 10 * SEC).await.unwrap()),
        t
    );
    assert!(b.release(&name, &a).await.unwrap());
    assert!(!b.release(&name, &a).await.unwrap());
    // Extend never resurrects.
    assert!(!b.extend(&name, &a, 10 * SEC).await.unwrap());
    let t2 = granted(b.try_acquire(&name, &c, 10 * SEC).await.unwrap());
    assert!(t2 > t);
    assert!(b.force_release(&name).await.unwrap());
    assert!(!b.force_release(&name).await.unwrap());
}

#[tokio::test]
async fn scripts_survive_script_flush() {
    // A private server: flushing the shared one would disturb the
    // round-trip counts of tests running beside this one.
    let server = &RedisServer::start();
    let b = backend(&server.url()).await;
    let name = unique("flush");
    let me = OwnerToken::random();
    granted(b.try_acquire(&name, &me, 10 * SEC).await.unwrap());
    assert_eq!(
        server.command(&["SCRIPT", "FLUSH"]),
        Resp::Simple("OK".into())
    );
    assert!(b.release(&name, &me).await.unwrap());
    server.command(&["SCRIPT", "FLUSH"]);
    let q = Quota::new(5, 10 * SEC, Algorithm::Gcra);
    assert!(b.check(&name, &q, 1).await.unwrap().allowed);
    server.command(&["SCRIPT", "FLUSH"]);
    assert!(b.next(&name).await.unwrap().get() > 0);
}

#[tokio::test]
async fn restart_loses_data_but_scripts_reload_and_tokens_keep_rising() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let name = unique("restart");
    let me = OwnerToken::random();
    let before = granted(b.try_acquire(&name, &me, 10 * SEC).await.unwrap());
    let fence_before = b.next(&name).await.unwrap().get();

    server.restart();

    // The restarted server has no scripts and no data: EVALSHA gets NOSCRIPT
    // and the script is loaded again; the counters are re-seeded from the
    // server clock, above every token issued before.
    let after = eventually("acquire after restart", || {
        b.try_acquire(&name, &me, 10 * SEC)
    })
    .await;
    let after = granted(after);
    assert!(after > before, "{after} > {before}");
    assert!(after > fence_before);
    let fence_after = eventually("fencing after restart", || b.next(&name)).await;
    assert!(fence_after.get() > fence_before);
    assert!(b.release(&name, &me).await.unwrap());

    // Wake-ups work again after the subscriber reconnected.
    let other = backend(&server.url()).await;
    let waiter = Lock::subscribe(&b, &name, &OwnerToken::random())
        .await
        .unwrap();
    let notified = waiter.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    let deadline = Instant::now() + Duration::from_secs(10);
    // The subscriber may still be reconnecting: release repeatedly until a
    // wake-up arrives.
    // (A release publishes only when a client with waiters was refused
    // the claim, so `b` tries once while `other` holds it.)
    let them = OwnerToken::random();
    loop {
        granted(other.try_acquire(&name, &me, 10 * SEC).await.unwrap());
        assert!(matches!(
            b.try_acquire(&name, &them, 10 * SEC).await.unwrap(),
            Attempt::Held { .. }
        ));
        other.release(&name, &me).await.unwrap();
        if tokio::time::timeout(Duration::from_millis(200), &mut notified)
            .await
            .is_ok()
        {
            break;
        }
        assert!(Instant::now() < deadline, "no wake-up after restart");
    }
    // And once settled, a single release's PUBLISH reaches the waiter.
    let notified = waiter.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    granted(other.try_acquire(&name, &me, 10 * SEC).await.unwrap());
    assert!(matches!(
        b.try_acquire(&name, &them, 10 * SEC).await.unwrap(),
        Attempt::Held { .. }
    ));
    assert!(other.release(&name, &me).await.unwrap());
    tokio::time::timeout(Duration::from_secs(2), notified)
        .await
        .expect("a release after the restart wakes the waiter");
}

#[tokio::test]
async fn password_server_right_password_works_wrong_one_is_a_clear_auth_error() {
    let password = "s3cr3t-Pa55w0rd-for-coord";
    let wrong = "wr0ng-Pa55w0rd-for-coord";
    let server = RedisServer::start_with_password(password);

    // Right password, in the URL.
    let b = backend(&server.url()).await;
    let me = OwnerToken::random();
    let name = unique("auth");
    granted(b.try_acquire(&name, &me, SEC).await.unwrap());
    assert!(b.release(&name, &me).await.unwrap());
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
    granted(alice.try_acquire(&name, &me, SEC).await.unwrap());
    assert!(alice.release(&name, &me).await.unwrap());
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
async fn unreachable_server_is_unavailable_and_bounded() {
    let port = conformance::testkit::port::free_port();
    let started = Instant::now();
    let err = RedisBackend::connect(
        RedisOptions::new(&format!("redis://:pw@127.0.0.1:{port}"))
            .connect_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(!format!("{err} {err:?}").contains(":pw@"));
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
async fn uncontended_acquire_and_release_cost_exactly_two_round_trips() {
    let proxy = CountingProxy::start(kit::server().port());
    let b = backend(&proxy.url()).await;
    let name = unique("roundtrips");
    let me = OwnerToken::random();
    // Warm up (first use of the connection).
    granted(b.try_acquire(&name, &me, 10 * SEC).await.unwrap());
    assert!(b.release(&name, &me).await.unwrap());

    for _ in 0..3 {
        let before = proxy.commands();
        let names_before = proxy.command_names().len();
        granted(b.try_acquire(&name, &me, 10 * SEC).await.unwrap());
        assert!(b.release(&name, &me).await.unwrap());
        let sent = proxy.commands() - before;
        let names = proxy.command_names()[names_before..].to_vec();
        assert_eq!(sent, 2, "acquire + release sent {names:?}");
        assert_eq!(names, ["EVALSHA", "EVALSHA"]);
    }
}

#[tokio::test]
async fn release_wakes_a_waiter_of_another_client_by_pubsub() {
    let url = kit::url();
    let (a, w) = (backend(&url).await, backend(&url).await);
    let name = unique("wake");
    let me = OwnerToken::random();
    granted(a.try_acquire(&name, &me, 30 * SEC).await.unwrap());
    let waiter = Lock::subscribe(&w, &name, &OwnerToken::random())
        .await
        .unwrap();
    let notified = waiter.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    assert!(matches!(
        w.try_acquire(&name, &OwnerToken::random(), 30 * SEC)
            .await
            .unwrap(),
        Attempt::Held { .. }
    ));
    assert!(a.release(&name, &me).await.unwrap());
    tokio::time::timeout(Duration::from_secs(2), notified)
        .await
        .expect("the release's PUBLISH wakes the waiter");
}

#[tokio::test]
async fn dropping_the_client_closes_its_connections() {
    let server = RedisServer::start();
    let clients = |s: &RedisServer| {
        let info = s.command(&["INFO", "clients"]);
        let text = info.as_str().unwrap_or_default().to_string();
        text.lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .and_then(|v| v.trim().parse::<i64>().ok())
            .unwrap()
    };
    let base = clients(&server);
    let coord = coord_redis::connect(&server.url()).await.unwrap();
    // Command connection + subscriber connection.
    assert_eq!(clients(&server), base + 2);
    drop(coord);
    let deadline = Instant::now() + Duration::from_secs(5);
    while clients(&server) != base {
        assert!(
            Instant::now() < deadline,
            "connections (subscriber task) outlived the client"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn lease_election_barrier_basics() {
    let b = backend(&kit::url()).await;
    let (x, y) = (OwnerToken::random(), OwnerToken::random());

    let lease = unique("lease");
    let t = granted(b.grant(&lease, &x, 5 * SEC).await.unwrap());
    assert!(matches!(
        b.grant(&lease, &y, 5 * SEC).await.unwrap(),
        Attempt::Held { .. }
    ));
    let left = b.remaining(&lease).await.unwrap().unwrap();
    assert!(left <= 5 * SEC && left > 4 * SEC);
    assert!(Lease::renew(&b, &lease, &x, 8 * SEC).await.unwrap());
    assert!(!Lease::renew(&b, &lease, &y, 8 * SEC).await.unwrap());
    assert!(b.revoke(&lease, &x).await.unwrap());
    assert_eq!(b.remaining(&lease).await.unwrap(), None);
    assert!(granted(b.grant(&lease, &y, 5 * SEC).await.unwrap()) > t);

    let el = unique("election");
    assert_eq!(b.leader(&el).await.unwrap(), None);
    let t1 = granted(b.try_campaign(&el, "alice", &x, 5 * SEC).await.unwrap());
    assert!(matches!(
        b.try_campaign(&el, "bob", &y, 5 * SEC).await.unwrap(),
        Attempt::Held { .. }
    ));
    let l = b.leader(&el).await.unwrap().unwrap();
    assert_eq!((l.candidate.as_str(), l.term.get()), ("alice", t1));
    assert!(Election::renew(&b, &el, &x, 5 * SEC).await.unwrap());
    assert!(!b.resign(&el, &y).await.unwrap());
    assert!(b.resign(&el, &x).await.unwrap());
    let t2 = granted(b.try_campaign(&el, "bob", &y, 5 * SEC).await.unwrap());
    assert!(t2 > t1);
    assert_eq!(b.leader(&el).await.unwrap().unwrap().candidate, "bob");

    let bar = unique("barrier");
    let a1 = b
        .arrive(&bar, 2, "p1", &coord_core::OwnerToken::random())
        .await
        .unwrap();
    assert!(!a1.complete);
    assert_eq!(
        b.arrive(&bar, 2, "p1", &coord_core::OwnerToken::random())
            .await
            .unwrap(),
        a1
    );
    let err = b
        .arrive(&bar, 3, "p2", &coord_core::OwnerToken::random())
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        Error::InvalidArgument {
            field: "parties",
            ..
        }
    ));
    assert!(!b.is_complete(&bar, a1.generation).await.unwrap());
    let a2 = b
        .arrive(&bar, 2, "p2", &coord_core::OwnerToken::random())
        .await
        .unwrap();
    assert!(a2.complete && a2.generation == a1.generation);
    assert!(b.is_complete(&bar, a1.generation).await.unwrap());
    let id3 = coord_core::OwnerToken::random();
    assert!(!b.withdraw(&bar, a1.generation, "p1", &id3).await.unwrap());
    let a3 = b.arrive(&bar, 2, "p1", &id3).await.unwrap();
    assert_eq!(a3.generation, a1.generation + 1);
    assert!(b.withdraw(&bar, a3.generation, "p1", &id3).await.unwrap());
    // After the withdrawal the generation is empty: another party count is fine.
    assert!(
        !b.arrive(&bar, 3, "p1", &coord_core::OwnerToken::random())
            .await
            .unwrap()
            .complete
    );
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
    granted(a.try_acquire(&name, &me, 10 * SEC).await.unwrap());
    // Wake-ups travel over TLS too.
    let waiter = Lock::subscribe(&w, &name, &OwnerToken::random())
        .await
        .unwrap();
    let notified = waiter.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    assert!(matches!(
        w.try_acquire(&name, &OwnerToken::random(), 10 * SEC)
            .await
            .unwrap(),
        Attempt::Held { .. }
    ));
    assert!(a.release(&name, &me).await.unwrap());
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
    granted(b.try_acquire(&name, &me, 10 * SEC).await.unwrap());
    assert!(b.release(&name, &me).await.unwrap());
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

#[tokio::test]
async fn an_outage_gives_bounded_unavailable_errors_then_recovers() {
    let server = RedisServer::start();
    let b = RedisBackend::connect(RedisOptions::new(&server.url()).timeout(Duration::from_secs(1)))
        .await
        .unwrap();
    let name = unique("outage");
    let me = OwnerToken::random();
    granted(b.try_acquire(&name, &me, 10 * SEC).await.unwrap());
    server.stop();
    for _ in 0..3 {
        let started = Instant::now();
        let err = b.try_acquire(&name, &me, 10 * SEC).await.unwrap_err();
        assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
        assert!(err.is_retryable());
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.start_again();
    let t = eventually("acquire after the outage", || {
        b.try_acquire(&name, &me, 10 * SEC)
    })
    .await;
    granted(t);
    assert!(b.release(&name, &me).await.unwrap());
}

/// A wake-up connection that dies without closing (half-open TCP: replies
/// and messages silently dropped) is found by the listener's PING and
/// replaced, so waiters are woken by notifications again instead of
/// sleeping until their polling fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silently_dead_wakeup_connection_is_detected_and_replaced() {
    let proxy = CountingProxy::start(kit::server().port());
    let holder = backend(&kit::url()).await.into_coord();
    let waiter = RedisOptions::new(&proxy.url())
        .timeout(2 * SEC)
        .connect()
        .await
        .unwrap()
        .with_poll_interval(Duration::from_secs(120));
    let name = unique("half-open");
    let held = holder
        .locks()
        .unwrap()
        .try_acquire(&name, 120 * SEC)
        .await
        .unwrap()
        .unwrap();
    let n2 = name.clone();
    let task = tokio::spawn(async move {
        let g = waiter
            .locks()
            .unwrap()
            .acquire(&n2, 30 * SEC, Duration::from_secs(90))
            .await;
        (Instant::now(), g)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.freeze_subscribers();
    // One health check period plus its timeout: the listener has noticed
    // and subscribed again on a fresh connection.
    tokio::time::sleep(coord_redis::HEALTH_CHECK + 4 * SEC).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let (got_at, g) = task.await.unwrap();
    let g = g.expect("the waiter gets the lock");
    let lag = got_at - released_at;
    assert!(
        lag < 2 * SEC,
        "waiter woke {lag:?} after release: the dead subscriber was not replaced"
    );
    g.release().await.unwrap();
}
