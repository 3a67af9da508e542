//! Lock handoff without reading the queue again (src/claim/handoff.rs): a waiter
//! whose predecessor was the holder holds once that key is deleted. These
//! tests pin its limits, against a real etcd and separate clients: a
//! predecessor that was only a waiter (and gave up) hands nothing over; a
//! head marker wakes nobody; a handoff grant's validity ends before the
//! server's expiry; a holder removed by lease revocation hands over with
//! rising tokens.

use std::sync::Arc;
use std::time::Duration;

use conformance::testkit::etcd::EtcdServer;
use coord_core::wake::Waiter;
use coord_core::{Attempt, Lock, OwnerToken};
use coord_etcd::{EtcdBackend, EtcdOptions};
use etcd_client::GetOptions;
use tokio::time::{Instant, sleep, timeout};

async fn backend(server: &EtcdServer) -> Arc<EtcdBackend> {
    EtcdBackend::connect(EtcdOptions::parse(&server.url()).unwrap())
        .await
        .unwrap()
}

async fn raw(server: &EtcdServer) -> etcd_client::Client {
    etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap()
}

fn granted(a: Attempt) -> u64 {
    match a {
        Attempt::Granted(t) => t.get(),
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// Queue `o` on `b` as coord-core's wait loop does: attempt (refused),
/// subscribe, attempt again (queued).
async fn queue(b: &EtcdBackend, name: &str, o: &OwnerToken, ttl: Duration) -> Waiter {
    assert!(matches!(
        b.try_acquire(name, o.step(), ttl).await.unwrap(),
        Attempt::Held { .. }
    ));
    let w = Lock::subscribe(b, name, o).await.unwrap();
    assert!(matches!(
        b.try_acquire(name, o.step(), ttl).await.unwrap(),
        Attempt::Held { .. }
    ));
    w
}

/// The key of owner `o` under lock `name` (prefix `coord:`), as the
/// server has it: claim keys are named by their lease, the owner's hex
/// begins the value.
async fn key_of(
    raw: &mut etcd_client::Client,
    name: &str,
    o: &OwnerToken,
) -> Option<etcd_client::KeyValue> {
    let hex = o.to_hex().into_bytes();
    raw.get(
        format!("coord:lock/{name}/"),
        Some(etcd_client::GetOptions::new().with_prefix()),
    )
    .await
    .unwrap()
    .take_kvs()
    .into_iter()
    .find(|kv| {
        let v = kv.value();
        v.starts_with(&hex) && matches!(v.get(hex.len()), None | Some(b' '))
    })
}

/// Wait for `w` to be woken, at most `limit`.
async fn woken(w: &Waiter, limit: Duration) -> bool {
    timeout(limit, w.notified()).await.is_ok()
}

/// H holds; W1 (client b) queues behind H, W2 (client c) behind W1. W1
/// gives up (its release revokes its key's lease): W2's predecessor is
/// gone, but it was never the holder, so W2 must not hold while H holds.
/// Then H releases and W2 holds, with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_a_waiter_that_gave_up_does_not_hold_while_the_holder_holds() {
    let server = EtcdServer::start();
    let (a, b, c) = (
        backend(&server).await,
        backend(&server).await,
        backend(&server).await,
    );
    let name = "gave-up";
    let ttl = Duration::from_secs(10);
    let (oh, o1, o2) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let th = granted(a.try_acquire(name, oh.step(), ttl).await.unwrap());
    let _w1 = queue(&b, name, &o1, ttl).await;
    let w2 = queue(&c, name, &o2, ttl).await;
    assert!(!b.release(name, o1.step()).await.unwrap());
    assert!(woken(&w2, Duration::from_secs(3)).await, "W2 was not woken");
    let got = c.try_acquire(name, o2.step(), ttl).await.unwrap();
    assert!(
        matches!(got, Attempt::Held { .. }),
        "W2 holds while H holds: {got:?}"
    );
    // Again, once its (new) predecessor's key has been watched a while.
    sleep(Duration::from_millis(200)).await;
    let got = c.try_acquire(name, o2.step(), ttl).await.unwrap();
    assert!(matches!(got, Attempt::Held { .. }), "W2 holds: {got:?}");
    assert!(a.release(name, oh.step()).await.unwrap());
    assert!(woken(&w2, Duration::from_secs(3)).await, "W2 was not woken");
    let t2 = granted(c.try_acquire(name, o2.step(), ttl).await.unwrap());
    assert!(t2 > th, "token {t2} after {th}");
    assert!(c.release(name, o2.step()).await.unwrap());
}

/// H holds; W1 (b) and W2 (c) queue. H releases: W1 is woken and holds,
/// and writes its head marker; W2 must not be woken by it (one wake per
/// release). W1's release then wakes W2, which holds by the handoff;
/// the handoff grant's validity (reported to a refused owner of the same
/// client) ends before the server expires the key, and before the
/// server's lease TTL says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_marker_wakes_nobody_and_a_handoff_grant_ends_before_the_server_expiry() {
    let server = EtcdServer::start();
    let (a, b, c) = (
        backend(&server).await,
        backend(&server).await,
        backend(&server).await,
    );
    let mut raw = raw(&server).await;
    let name = "marker";
    let ttl = Duration::from_secs(3);
    let (oh, o1, o2) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let th = granted(a.try_acquire(name, oh.step(), ttl).await.unwrap());
    let w1 = queue(&b, name, &o1, ttl).await;
    let w2 = queue(&c, name, &o2, ttl).await;
    let n2 = w2.notified();
    tokio::pin!(n2);
    n2.as_mut().enable();
    assert!(a.release(name, oh.step()).await.unwrap());
    assert!(woken(&w1, Duration::from_secs(3)).await, "W1 was not woken");
    let t1 = granted(b.try_acquire(name, o1.step(), ttl).await.unwrap());
    assert!(t1 > th);
    // The marker lands (W1's key written a second time)...
    let start = Instant::now();
    loop {
        let kv = key_of(&mut raw, name, &o1).await.expect("W1's key");
        if kv.version() > 1 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(3), "no head marker");
        sleep(Duration::from_millis(10)).await;
    }
    // ...and wakes nobody.
    let woke = timeout(Duration::from_millis(500), n2.as_mut())
        .await
        .is_ok();
    assert!(!woke, "W2 was woken by W1's head marker");
    sleep(Duration::from_millis(100)).await;
    assert!(b.release(name, o1.step()).await.unwrap());
    timeout(Duration::from_secs(3), n2.as_mut())
        .await
        .expect("W2 was not woken by W1's release");
    let t2 = granted(c.try_acquire(name, o2.step(), ttl).await.unwrap());
    assert!(t2 > t1);
    let other = OwnerToken::random();
    let t_d0 = Instant::now();
    let Attempt::Held {
        expires_in: Some(d),
    } = c.try_acquire(name, other.step(), ttl).await.unwrap()
    else {
        panic!("the refused attempt did not report the local holder");
    };
    let deadline = t_d0 + d;
    let kv = key_of(&mut raw, name, &o2).await.expect("W2's key");
    let server_left = raw
        .lease_time_to_live(kv.lease(), None)
        .await
        .unwrap()
        .ttl();
    assert!(
        deadline.saturating_duration_since(Instant::now())
            <= Duration::from_secs(server_left as u64 + 1),
        "the handoff grant's validity exceeds the server's lease TTL ({server_left} s)"
    );
    // Nobody renews W2 now: the server removes its key at its expiry,
    // which must not come before the local deadline.
    loop {
        if key_of(&mut raw, name, &o2).await.is_none() {
            break;
        }
        sleep(Duration::from_millis(20)).await;
    }
    let gone = Instant::now();
    assert!(
        gone >= deadline,
        "the server removed the key {:?} before the handoff grant's deadline",
        deadline - gone
    );
}

/// H holds and W1 (b), W2 (c) wait in coord's wait loop; H's lease is
/// revoked directly through etcd (an operator, or H's expiry): W1 holds,
/// then W2 after W1, tokens rising; W2 never holds while W1 does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_removed_by_lease_revocation_hands_over_with_rising_tokens() {
    let server = EtcdServer::start();
    let mut raw = raw(&server).await;
    let ca = coord_etcd::connect(&server.url()).await.unwrap();
    let cb = coord_etcd::connect(&server.url()).await.unwrap();
    let cc = coord_etcd::connect(&server.url()).await.unwrap();
    let (la, lb, lc) = (
        ca.locks().unwrap(),
        cb.locks().unwrap(),
        cc.locks().unwrap(),
    );
    let name = "revoked-holder";
    let ttl = Duration::from_secs(10);
    let h = la.acquire(name, ttl, Duration::ZERO).await.unwrap();
    let th = h.fencing_token().get();
    let wait = Duration::from_secs(10);
    let t1 = tokio::spawn(async move { lb.acquire(name, ttl, wait).await.unwrap() });
    sleep(Duration::from_millis(300)).await;
    let t2 = tokio::spawn(async move { lc.acquire(name, ttl, wait).await.unwrap() });
    sleep(Duration::from_millis(300)).await;
    let hk = raw
        .get(
            format!("coord:lock/{name}/"),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .unwrap()
        .take_kvs()
        .into_iter()
        .find(|kv| kv.create_revision() == th as i64)
        .expect("the holder's key");
    raw.lease_revoke(hk.lease()).await.unwrap();
    let g1 = timeout(Duration::from_secs(3), t1)
        .await
        .expect("W1 did not hold after the holder's lease was revoked")
        .unwrap();
    let t1 = g1.fencing_token();
    assert!(t1.get() > th);
    sleep(Duration::from_millis(300)).await;
    assert!(!t2.is_finished(), "W2 holds while W1 does");
    g1.release().await.unwrap();
    let g2 = timeout(Duration::from_secs(3), t2)
        .await
        .expect("W2 did not hold after W1's release")
        .unwrap();
    assert!(g2.fencing_token() > t1);
    g2.release().await.unwrap();
    drop(h);
}

/// Keepalive messages the server received (streams count when they end).
fn keepalives(server: &EtcdServer) -> f64 {
    server.metric(
        "grpc_server_msg_received_total",
        &["grpc_method=\"LeaseKeepAlive\""],
    )
}

/// A handoff right after the waiter queued (its lease's grant or
/// keepalive is recent): no request at all (no keepalive, which the full
/// attempt always sends), and the grant's validity, as a refused owner of
/// the same client is told, does not exceed the server's lease TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_on_a_fresh_lease_sends_nothing_and_stays_within_the_server_ttl() {
    let server = EtcdServer::start();
    let (a, b) = (backend(&server).await, backend(&server).await);
    let mut raw = raw(&server).await;
    let ttl = Duration::from_secs(30);
    let mut checked = 0;
    // A handoff is fresh when it comes within the reuse slack (50 ms) of
    // the waiter's queueing: on a loaded machine many are not, so try
    // until three were, for at most 60 rounds.
    for i in 0..60 {
        if checked == 3 {
            break;
        }
        let name = format!("fresh-{i}");
        let (oh, o1) = (OwnerToken::random(), OwnerToken::random());
        granted(a.try_acquire(&name, oh.step(), ttl).await.unwrap());
        let w1 = queue(&b, &name, &o1, ttl).await;
        assert!(a.release(&name, oh.step()).await.unwrap());
        assert!(woken(&w1, Duration::from_secs(3)).await, "W1 was not woken");
        let k = keepalives(&server);
        let t1 = granted(b.try_acquire(&name, o1.step(), ttl).await.unwrap());
        let sent = keepalives(&server) - k;
        let other = OwnerToken::random();
        let held = b.try_acquire(&name, other.step(), ttl).await.unwrap();
        let kv = key_of(&mut raw, &name, &o1).await.expect("W1's key");
        assert_eq!(kv.create_revision() as u64, t1);
        let server_left = raw
            .lease_time_to_live(kv.lease(), None)
            .await
            .unwrap()
            .ttl();
        assert!(b.release(&name, o1.step()).await.unwrap());
        if sent > 0.0 {
            // Past the slack on this machine: the handoff refreshed.
            continue;
        }
        let Attempt::Held {
            expires_in: Some(d),
        } = held
        else {
            panic!("the refused attempt did not report the local holder: {held:?}");
        };
        assert!(
            d <= Duration::from_secs(server_left as u64 + 1),
            "the handoff grant's validity {d:?} exceeds the server's lease TTL ({server_left} s)"
        );
        checked += 1;
    }
    assert!(checked > 0, "no handoff without a request was seen");
}
