//! Tests that need an etcd of their own: counting the server's gRPC calls,
//! authentication, what happens when the client is dropped or the server
//! goes away.

use std::time::Duration;

use conformance::testkit::etcd::EtcdServer;
use coord_core::{Error, Lock, OwnerToken};
use coord_etcd::{EtcdBackend, EtcdOptions};
use tokio::time::{Instant, sleep, timeout};

fn handled(server: &EtcdServer, method: &str) -> f64 {
    server.metric(
        "grpc_server_handled_total",
        &[&format!("grpc_method=\"{method}\""), "grpc_code=\"OK\""],
    )
}

fn received(server: &EtcdServer, method: &str) -> f64 {
    server.metric(
        "grpc_server_msg_received_total",
        &[&format!("grpc_method=\"{method}\"")],
    )
}

/// An uncontended acquire + release, once the client has a lease of that
/// TTL to spare, is one transaction (the create) and one plain delete of
/// the owner's own key (its previous value tells whether it was this
/// claim's), and no lease grant, revocation or read. A keepalive message (on
/// a stream already open) is sent only when the spare's last answered
/// keepalive is older than the reuse slack (a fortieth of the TTL, half
/// the drift margin, at most 50 ms): at most one per slack, exactly one
/// for a reuse after a longer pause, none for a reuse right after one.
/// Each claim still has a lease of its own (a released claim's lease, now
/// without keys, serves the next claim).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_release_is_a_txn_a_delete_and_a_keepalive_per_slack() {
    let server = EtcdServer::start();
    let coord = coord_etcd::connect(&server.url()).await.unwrap();
    let locks = coord.locks().unwrap();
    let ttl = Duration::from_secs(5);
    locks
        .acquire("cycle", ttl, Duration::ZERO)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // Let the connect's background revocation finish.
    sleep(Duration::from_millis(300)).await;
    let methods = [
        "LeaseGrant",
        "Txn",
        "LeaseRevoke",
        "LeaseKeepAlive",
        "Range",
        "DeleteRange",
    ];
    let count = |server: &EtcdServer| -> Vec<f64> {
        let mut v: Vec<f64> = methods.iter().map(|m| handled(server, m)).collect();
        // Streams are counted when they end: count keepalive messages.
        v[3] = received(server, "LeaseKeepAlive");
        v
    };
    let before = count(&server);
    assert!(before[0] >= 1.0, "the metric is missing");
    const CYCLES: u32 = 50;
    let started = Instant::now();
    for i in 0..CYCLES {
        let g = locks
            .acquire(&format!("cycle-{}", i % 3), ttl, Duration::ZERO)
            .await
            .unwrap();
        g.release().await.unwrap();
    }
    let elapsed = started.elapsed();
    let mut calls: Vec<f64> = count(&server)
        .iter()
        .zip(&before)
        .map(|(a, b)| a - b)
        .collect();
    eprintln!("{CYCLES} acquire+release cycles in {elapsed:?}: calls {methods:?} = {calls:?}");
    let n = f64::from(CYCLES);
    // The slack for this TTL (5 s): min(125 ms, 26 ms, 50 ms).
    let slack = Duration::from_millis(26);
    let sent = std::mem::take(&mut calls[3]);
    let bound = (elapsed.as_secs_f64() / slack.as_secs_f64()).floor() + 1.0;
    assert!(
        sent <= bound && sent < n,
        "{sent} keepalives in {CYCLES} cycles over {elapsed:?} (at most one per {slack:?})"
    );
    assert_eq!(
        calls,
        vec![0.0, n, 0.0, 0.0, 0.0, n],
        "calls per {CYCLES} cycles: {methods:?} (LeaseKeepAlive: counted above)"
    );
    // A reuse after a pause longer than the slack: exactly one keepalive.
    sleep(slack * 3).await;
    let k = received(&server, "LeaseKeepAlive");
    locks
        .acquire("cycle-0", ttl, Duration::ZERO)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert_eq!(
        received(&server, "LeaseKeepAlive") - k,
        1.0,
        "a reuse past the slack sent no keepalive"
    );
    // The lease-per-claim rule still holds: a held lock's key is on a
    // lease of its own, with the claim's TTL.
    let a = locks.acquire("cycle-a", ttl, Duration::ZERO).await.unwrap();
    let b = locks.acquire("cycle-b", ttl, Duration::ZERO).await.unwrap();
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let keys = raw
        .get(
            "coord:lock/cycle-",
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let leases: Vec<i64> = keys.kvs().iter().map(|kv| kv.lease()).collect();
    assert_eq!(leases.len(), 2);
    assert_ne!(leases[0], leases[1]);
    for l in leases {
        let t = raw.lease_time_to_live(l, None).await.unwrap();
        assert_eq!(t.granted_ttl(), 5);
    }
    a.release().await.unwrap();
    b.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_with_right_and_wrong_password() {
    let server = EtcdServer::start();
    let pw = "s3cret-Pa55";
    let mut admin = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let _ = admin.role_add("root").await;
    admin.user_add("root", pw, None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();

    // Right password: everything works.
    let url = format!("etcd://root:{pw}@{}", server.endpoint());
    let coord = coord_etcd::connect(&url)
        .await
        .expect("login with the right password");
    assert!(!format!("{coord:?}").contains(pw));
    let g = coord
        .locks()
        .unwrap()
        .acquire("auth-lock", Duration::from_secs(5), Duration::ZERO)
        .await
        .unwrap();
    g.release().await.unwrap();
    let opts = EtcdOptions::parse(&url).unwrap();
    assert!(!format!("{opts:?}").contains(pw));

    // Wrong password: refused, and the password appears nowhere.
    let wrong = "wr0ng-Pa55";
    let e = coord_etcd::connect(&format!("etcd://root:{wrong}@{}", server.endpoint()))
        .await
        .expect_err("login with a wrong password must fail");
    let shown = format!("{e} {e:?}");
    assert!(matches!(e, Error::Store { .. }), "{shown}");
    assert!(shown.contains("auth"), "{shown}");
    assert!(!shown.contains(wrong) && !shown.contains(pw), "{shown}");

    // No credentials at all: nothing can be written.
    if let Ok(anon) = coord_etcd::connect(&server.url()).await {
        let r = anon
            .locks()
            .unwrap()
            .acquire("auth-lock", Duration::from_secs(5), Duration::ZERO)
            .await;
        assert!(r.is_err(), "an anonymous client took a lock: {r:?}");
    }
}

/// Dropping the client ends its background tasks: its watch streams close
/// and no lease of its claims is kept alive, so the server expires them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_client_ends_its_tasks() {
    let server = EtcdServer::start();
    let backend = EtcdBackend::connect(EtcdOptions::parse(&server.url()).unwrap())
        .await
        .unwrap();
    let coord = backend.coord();
    let ttl = backend.capabilities().min_ttl;
    // Some activity with watches: a queued waiter and an election observer.
    let other = coord_etcd::connect(&server.url()).await.unwrap();
    let held = other
        .locks()
        .unwrap()
        .acquire("drop-lock", ttl * 5, Duration::ZERO)
        .await
        .unwrap();
    let waiting = coord
        .locks()
        .unwrap()
        .acquire("drop-lock", ttl, Duration::from_millis(300))
        .await;
    assert!(matches!(waiting, Err(Error::Timeout { .. })), "{waiting:?}");
    let w = coord_core::Election::subscribe(&*backend, "drop-election")
        .await
        .unwrap();
    // A lock held (raw, no guard) when the client goes.
    let o = OwnerToken::random();
    assert!(matches!(
        backend
            .try_acquire("drop-held", o.step(), ttl)
            .await
            .unwrap(),
        coord_core::Attempt::Granted(_)
    ));
    let leases = backend.claim_leases();
    assert!(!leases.is_empty());
    assert!(server.metric("etcd_debugging_mvcc_watch_stream_total", &[]) >= 1.0);
    drop(w);
    drop(coord);
    drop(backend);
    held.release().await.unwrap();
    drop(other);

    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let until = Instant::now() + ttl + Duration::from_secs(5);
    for id in leases {
        loop {
            let left = raw.lease_time_to_live(id, None).await.unwrap().ttl();
            if left < 0 {
                break;
            }
            assert!(
                Instant::now() < until,
                "lease {id} still alive ({left} s): a keepalive task outlived the client"
            );
            sleep(Duration::from_millis(200)).await;
        }
    }
    let streams = server.metric("etcd_debugging_mvcc_watch_stream_total", &[]);
    assert_eq!(
        streams, 0.0,
        "watch streams left open after the client was dropped"
    );
}

/// Keepalives failing until the validity deadline fire the guard's lost
/// signal, before the server would expire the lock, and `extend` fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_signal_fires_when_etcd_goes_away() {
    let server = EtcdServer::start();
    let url = format!("{}?timeout_ms=500", server.url());
    let backend = EtcdBackend::connect(EtcdOptions::parse(&url).unwrap())
        .await
        .unwrap();
    let coord = backend.coord();
    // Long enough that the watchdog's first renewal (at a third of it) is
    // not raced by the freeze below even on a loaded machine: a renewal
    // that got through would rightly move the deadline.
    let ttl = backend.capabilities().min_ttl.max(Duration::from_secs(1)) * 6;
    // Before the grant was sent: the server's expiry is at least a TTL
    // after it.
    let start = Instant::now();
    let g = coord
        .locks()
        .unwrap()
        .acquire_with("gone", coord_core::LockOptions::new(ttl).watchdog(true))
        .await
        .unwrap();
    let owner_check = OwnerToken::random();
    // SIGSTOP: the server stops answering at once.
    server.pause();
    // The signal is a timer, as late as a loaded machine runs it; the
    // deadline it fires at is what must come before the server's expiry.
    timeout(ttl + Duration::from_secs(2), g.lost())
        .await
        .expect("the lost signal did not fire");
    assert!(
        g.valid_until() <= start + ttl,
        "the guard counted itself valid past the TTL: until {:?} after the grant was sent",
        g.valid_until() - start
    );
    assert!(!g.is_valid());
    let r = backend.extend("gone", owner_check.step(), ttl).await;
    assert!(!matches!(r, Ok(true)));
}

/// A claim's lease revoked behind the client's back (as an expiry would):
/// `extend` answers false, so the watchdog reports the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_lease_makes_extend_fail() {
    let server = EtcdServer::start();
    let backend = EtcdBackend::connect(EtcdOptions::parse(&server.url()).unwrap())
        .await
        .unwrap();
    let ttl = backend.capabilities().min_ttl * 3;
    let o = OwnerToken::random();
    assert!(matches!(
        backend.try_acquire("revoked", o.step(), ttl).await.unwrap(),
        coord_core::Attempt::Granted(_)
    ));
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    for id in backend.claim_leases() {
        raw.lease_revoke(id).await.unwrap();
    }
    assert!(!backend.extend("revoked", o.step(), ttl).await.unwrap());
    assert!(!backend.release("revoked", o.step()).await.unwrap());
    // A new lease is granted on demand.
    assert!(matches!(
        backend.try_acquire("revoked", o.step(), ttl).await.unwrap(),
        coord_core::Attempt::Granted(_)
    ));
    assert!(backend.release("revoked", o.step()).await.unwrap());
}

/// See `conformance::crash::tokens_rise_across_a_crash`: etcd killed
/// (`SIGKILL`) and started again on its data directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_token_rises_across_a_crash() {
    let server = std::sync::Arc::new(EtcdServer::start());
    let url = format!("{}?timeout_ms=1000", server.url());
    let connect = |url: String| async move {
        EtcdBackend::connect(EtcdOptions::parse(&url).unwrap())
            .await
            .expect("connect to etcd")
            .coord()
    };
    let before = connect(url.clone()).await;
    let s = server.clone();
    conformance::crash::tokens_rise_across_a_crash(&before, "crash", || async move {
        tokio::task::spawn_blocking(move || {
            s.kill();
            s.start_again();
        })
        .await
        .unwrap();
        connect(url).await
    })
    .await;
}

/// A crashed etcd's pid is free for any process to take; stopping the
/// server afterwards (its wrapper ends when the test drops it) signals the
/// etcd it started only, never the process that took the pid since.
#[test]
fn stopping_a_crashed_server_spares_the_process_that_took_its_pid() {
    let server = EtcdServer::start();
    let pid = server.pid();
    server.kill();
    assert!(
        conformance::testkit::pid_taker_survives(pid, || drop(server)),
        "stopping the crashed server killed pid {pid}, another process's by then"
    );
}
