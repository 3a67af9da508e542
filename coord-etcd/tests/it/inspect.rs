//! Holder metadata and inspection on etcd, on the raw traits and the keys
//! they write, against a real single-node etcd: the metadata lives in the
//! grant's own key (so it goes with a release, an expiry or a force
//! release, and a later grant without it shows none), a retry by the same
//! owner keeps the grant as it is, semaphore grants are listed with their
//! permits, and queued lock and semaphore waiters are counted.

use std::sync::Arc;
use std::time::Duration;

use conformance::testkit::etcd;
use coord_core::inspect::ClaimRecord;
use coord_core::{Attempt, FencingToken, Lease, Lock, OwnerToken, PermitRequest, Semaphore};
use coord_etcd::{EtcdBackend, EtcdOptions};
use etcd_client::GetOptions;
use tokio::time::sleep;

const LONG: Duration = Duration::from_secs(30);

async fn backend(prefix: &str) -> Arc<EtcdBackend> {
    let url = format!("{}?prefix={prefix}", etcd::shared().url());
    EtcdBackend::connect(EtcdOptions::parse(&url).unwrap())
        .await
        .expect("connect to the test etcd")
}

fn prefix(case: &str) -> String {
    format!("inspect-{case}-{}/", std::process::id())
}

/// The value of owner `o`'s key in the queue `dir` (under no prefix): a
/// claim key is named by its lease, its value is `<owner hex>` and then
/// ` <metadata>` if any.
async fn owner_value(dir: &str, o: &OwnerToken) -> Option<Vec<u8>> {
    let mut raw = etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap();
    let mut resp = raw
        .get(dir, Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let hex = o.to_hex().into_bytes();
    resp.take_kvs()
        .into_iter()
        .map(|kv| kv.value().to_vec())
        .find(|v| v.starts_with(&hex) && matches!(v.get(hex.len()), None | Some(b' ')))
}

/// The raw value of `key` (under no prefix).
async fn raw_value(key: &str) -> Option<Vec<u8>> {
    let mut raw = etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap();
    let mut resp = raw.get(key, None::<GetOptions>).await.unwrap();
    resp.take_kvs()
        .into_iter()
        .next()
        .map(|kv| kv.value().to_vec())
}

/// The values of every key under `prefix`.
async fn raw_prefix_values(prefix: &str) -> Vec<Vec<u8>> {
    let mut raw = etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap();
    let mut resp = raw
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    resp.take_kvs()
        .into_iter()
        .map(|kv| kv.value().to_vec())
        .collect()
}

fn granted(a: Attempt) -> FencingToken {
    match a {
        Attempt::Granted(t) => t,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn one(r: &ClaimRecord) -> &coord_core::inspect::HolderRecord {
    assert_eq!(r.holders.len(), 1, "{r:?}");
    &r.holders[0]
}

#[tokio::test]
async fn lock_metadata_lives_in_the_key_and_goes_with_release_expiry_and_force_release() {
    let p = prefix("lock");
    let b = backend(&p).await;
    let other = backend(&p).await;
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let m1 = br#"{"host":"web-3"}"#;

    // Free: no holder, no waiter.
    let r = Lock::inspect(&*other, "l").await.unwrap();
    assert!(r.holders.is_empty() && r.waiters == Some(0), "{r:?}");

    // Held with metadata: the key's value is the owner's hex, then the
    // metadata.
    let t = granted(
        Lock::try_acquire_with_metadata(&*b, "l", &a, LONG, m1)
            .await
            .unwrap(),
    );
    assert_eq!(
        owner_value(&format!("{p}lock/l/"), &a).await,
        Some([format!("{} ", a.to_hex()).as_bytes(), &m1[..]].concat())
    );
    let r = Lock::inspect(&*other, "l").await.unwrap();
    let h = one(&r);
    assert_eq!(
        (h.owner, h.token, h.permits, h.metadata.as_deref()),
        (a, t, 1, Some(&m1[..]))
    );
    let left = h.remaining.expect("etcd tells a lease's TTL");
    assert!(left <= LONG && left > LONG / 2, "{left:?}");
    assert_eq!(r.waiters, Some(0));

    // A retry by the same owner (other metadata) keeps the grant as it is.
    let again = Lock::try_acquire_with_metadata(&*b, "l", &a, LONG, br#"{"host":"other"}"#)
        .await
        .unwrap();
    assert_eq!(granted(again), t);
    let r = Lock::inspect(&*other, "l").await.unwrap();
    assert_eq!(one(&r).metadata.as_deref(), Some(&m1[..]));

    // Released: gone, and a later grant without metadata shows none.
    assert!(Lock::release(&*b, "l", &a).await.unwrap());
    assert!(
        Lock::inspect(&*other, "l")
            .await
            .unwrap()
            .holders
            .is_empty()
    );
    let t2 = granted(Lock::try_acquire(&*b, "l", &c, LONG).await.unwrap());
    let r = Lock::inspect(&*other, "l").await.unwrap();
    assert_eq!((one(&r).owner, one(&r).token), (c, t2));
    assert_eq!(
        one(&r).metadata,
        None,
        "an earlier grant's metadata was kept"
    );

    // Force released: gone.
    assert!(Lock::force_release(&*other, "l").await.unwrap());
    assert!(
        Lock::inspect(&*other, "l")
            .await
            .unwrap()
            .holders
            .is_empty()
    );
    let _ = Lock::release(&*b, "l", &c).await;

    // Expired: gone with its lease.
    let short = b.capabilities().min_ttl;
    granted(
        Lock::try_acquire_with_metadata(&*b, "x", &a, short, m1)
            .await
            .unwrap(),
    );
    assert_eq!(Lock::inspect(&*other, "x").await.unwrap().holders.len(), 1);
    sleep(short + Duration::from_millis(1500)).await;
    let r = Lock::inspect(&*other, "x").await.unwrap();
    assert!(r.holders.is_empty(), "expired, still shown: {r:?}");
    let _ = Lock::release(&*b, "x", &a).await;
}

#[tokio::test]
async fn lock_waiters_are_counted_and_a_waiter_keeps_its_metadata_once_granted() {
    let p = prefix("waiters");
    let b = backend(&p).await;
    let (a, w1, w2) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    granted(Lock::try_acquire(&*b, "l", &a, LONG).await.unwrap());
    // A waiter's first attempt writes nothing; its next one queues a key.
    for w in [&w1, &w2] {
        for _ in 0..2 {
            let r = Lock::try_acquire_with_metadata(&*b, "l", w, LONG, br#"{"waiter":true}"#)
                .await
                .unwrap();
            assert!(matches!(r, Attempt::Held { .. }), "{r:?}");
        }
    }
    let r = Lock::inspect(&*b, "l").await.unwrap();
    assert_eq!(one(&r).owner, a);
    assert_eq!(one(&r).metadata, None);
    assert_eq!(r.waiters, Some(2), "{r:?}");

    // The holder goes: the first waiter holds, with the metadata it queued
    // with (its later attempts keep its key as it is).
    assert!(Lock::release(&*b, "l", &a).await.unwrap());
    let t = granted(
        Lock::try_acquire_with_metadata(&*b, "l", &w1, LONG, br#"{"later":1}"#)
            .await
            .unwrap(),
    );
    let r = Lock::inspect(&*b, "l").await.unwrap();
    let h = one(&r);
    assert_eq!(
        (h.owner, h.token, h.metadata.as_deref()),
        (w1, t, Some(&br#"{"waiter":true}"#[..]))
    );
    assert_eq!(r.waiters, Some(1));
    for o in [&w1, &w2] {
        let _ = Lock::release(&*b, "l", o).await;
    }
    let r = Lock::inspect(&*b, "l").await.unwrap();
    assert!(r.holders.is_empty() && r.waiters == Some(0), "{r:?}");
}

#[tokio::test]
async fn lease_metadata_follows_the_owner_hex_and_goes_with_revoke_and_expiry() {
    let p = prefix("lease");
    let b = backend(&p).await;
    let other = backend(&p).await;
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let m = br#"{"worker": 7}"#;
    assert!(
        Lease::inspect(&*other, "n")
            .await
            .unwrap()
            .holders
            .is_empty()
    );
    let t = granted(
        Lease::grant_with_metadata(&*b, "n", &a, LONG, m)
            .await
            .unwrap(),
    );
    let mut want = format!("{} ", a.to_hex()).into_bytes();
    want.extend_from_slice(m);
    assert_eq!(raw_value(&format!("{p}lease/n")).await, Some(want));
    let r = Lease::inspect(&*other, "n").await.unwrap();
    let h = one(&r);
    assert_eq!(
        (h.owner, h.token, h.permits, h.metadata.as_deref()),
        (a, t, 1, Some(&m[..]))
    );
    assert!(
        h.remaining.is_some_and(|r| r <= LONG && r > LONG / 2),
        "{h:?}"
    );
    assert_eq!(r.waiters, None);
    // Another owner is refused; the holder's own retry keeps its grant.
    assert!(matches!(
        Lease::grant(&*other, "n", &c, LONG).await.unwrap(),
        Attempt::Held { .. }
    ));
    assert_eq!(
        granted(
            Lease::grant_with_metadata(&*b, "n", &a, LONG, b"2")
                .await
                .unwrap()
        ),
        t
    );
    assert_eq!(
        one(&Lease::inspect(&*other, "n").await.unwrap())
            .metadata
            .as_deref(),
        Some(&m[..])
    );
    // A renewal of another TTL moves the key, keeping its value.
    assert!(Lease::renew(&*b, "n", &a, LONG * 2).await.unwrap());
    assert_eq!(
        one(&Lease::inspect(&*other, "n").await.unwrap())
            .metadata
            .as_deref(),
        Some(&m[..])
    );
    // remaining() and an owner-checked revoke still read the value.
    assert!(Lease::remaining(&*other, "n").await.unwrap().is_some());
    assert!(Lease::revoke(&*other, "n", &a).await.unwrap());
    assert!(
        Lease::inspect(&*other, "n")
            .await
            .unwrap()
            .holders
            .is_empty()
    );

    // Without metadata: the hex alone, none shown.
    granted(Lease::grant(&*b, "n", &c, LONG).await.unwrap());
    assert_eq!(
        raw_value(&format!("{p}lease/n")).await,
        Some(c.to_hex().into_bytes())
    );
    assert_eq!(
        one(&Lease::inspect(&*other, "n").await.unwrap()).metadata,
        None
    );
    assert!(Lease::revoke(&*b, "n", &c).await.unwrap());

    // Expired: gone.
    let short = b.capabilities().min_ttl;
    granted(
        Lease::grant_with_metadata(&*b, "e", &a, short, m)
            .await
            .unwrap(),
    );
    sleep(short + Duration::from_millis(1500)).await;
    assert!(
        Lease::inspect(&*other, "e")
            .await
            .unwrap()
            .holders
            .is_empty()
    );
}

fn req(permits: u32, queue: bool) -> PermitRequest {
    PermitRequest {
        permits,
        total: 3,
        ttl: LONG,
        queue,
    }
}

#[tokio::test]
async fn semaphore_grants_are_listed_with_permits_and_waiters_counted() {
    let p = prefix("sem");
    let b = backend(&p).await;
    let other = backend(&p).await;
    let (a, c, w) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let r = Semaphore::inspect(&*other, "s").await.unwrap();
    assert!(r.holders.is_empty() && r.waiters == Some(0), "{r:?}");
    let m = br#"{"job": "a b c"}"#;
    let ta = granted(
        Semaphore::try_acquire_with_metadata(&*b, "s", &a, &req(2, false), m)
            .await
            .unwrap(),
    );
    // The grant's value: owner, permits, total, slots, then the metadata
    // (its key is named by its lease: the one holder's key under `h/`).
    let v = raw_prefix_values(&format!("{p}sem/s/h/")).await;
    assert_eq!(v.len(), 1, "{v:?}");
    let v = String::from_utf8(v[0].clone()).unwrap();
    assert!(
        v.starts_with(&format!("{} 2 3 ", a.to_hex())) && v.ends_with(r#" {"job": "a b c"}"#),
        "{v}"
    );
    let tc = granted(
        Semaphore::try_acquire(&*b, "s", &c, &req(1, false))
            .await
            .unwrap(),
    );
    // A retry by the same owner keeps the grant as it is.
    assert_eq!(
        granted(
            Semaphore::try_acquire_with_metadata(&*b, "s", &a, &req(2, false), b"1")
                .await
                .unwrap()
        ),
        ta
    );
    // A waiter that does not fit queues.
    let r = Semaphore::try_acquire_with_metadata(&*b, "s", &w, &req(1, true), b"3")
        .await
        .unwrap();
    assert!(matches!(r, Attempt::Held { .. }), "{r:?}");

    let mut r = Semaphore::inspect(&*other, "s").await.unwrap();
    r.holders.sort_by_key(|h| h.token);
    assert_eq!(r.holders.len(), 2, "{r:?}");
    assert_eq!(r.waiters, Some(1));
    let (h0, h1) = (&r.holders[0], &r.holders[1]);
    assert_eq!(
        (h0.owner, h0.token, h0.permits, h0.metadata.as_deref()),
        (a, ta, 2, Some(&m[..]))
    );
    assert_eq!(
        (h1.owner, h1.token, h1.permits, h1.metadata.as_deref()),
        (c, tc, 1, None)
    );
    assert!(
        h0.remaining.is_some_and(|d| d <= LONG && d > LONG / 2),
        "{h0:?}"
    );

    // Released: that grant goes; the waiter, once granted, has the
    // metadata of its granting attempt.
    assert!(Semaphore::release(&*b, "s", &a).await.unwrap());
    let tw = granted(
        Semaphore::try_acquire_with_metadata(&*b, "s", &w, &req(1, true), b"4")
            .await
            .unwrap(),
    );
    let mut r = Semaphore::inspect(&*other, "s").await.unwrap();
    r.holders.sort_by_key(|h| h.token);
    assert_eq!(r.waiters, Some(0));
    assert_eq!(
        r.holders
            .iter()
            .map(|h| (h.owner, h.token, h.metadata.clone()))
            .collect::<Vec<_>>(),
        vec![(c, tc, None), (w, tw, Some(b"4".to_vec()))]
    );
    // A renewal of another TTL moves the grant, keeping its value.
    assert!(Semaphore::extend(&*b, "s", &w, LONG * 2).await.unwrap());
    let r = Semaphore::inspect(&*other, "s").await.unwrap();
    let hw = r.holders.iter().find(|h| h.owner == w).unwrap();
    assert_eq!((hw.token, hw.metadata.as_deref()), (tw, Some(&b"4"[..])));

    // Force released: nothing left.
    assert!(Semaphore::force_release(&*other, "s").await.unwrap());
    assert!(
        Semaphore::inspect(&*other, "s")
            .await
            .unwrap()
            .holders
            .is_empty()
    );
    for o in [&c, &w] {
        let _ = Semaphore::release(&*b, "s", o).await;
    }
}

/// Metadata costs no call: an uncontended acquire + release with it is
/// still one transaction and one delete, and at most one keepalive message
/// per cycle (as `server.rs`'s
/// `acquire_release_is_a_txn_a_delete_and_a_keepalive_per_slack` without
/// it), and `inspect` of a held lock is one range read and one
/// `LeaseTimeToLive`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_costs_no_call_and_inspect_is_one_range() {
    use conformance::testkit::etcd::EtcdServer;
    let server = EtcdServer::start();
    let b = EtcdBackend::connect(EtcdOptions::parse(&server.url()).unwrap())
        .await
        .unwrap();
    let ttl = Duration::from_secs(5);
    let who = br#"{"host":"web-3"}"#;
    let cycle = |owner: OwnerToken| {
        let b = b.clone();
        async move {
            granted(
                Lock::try_acquire_with_metadata(&*b, "cycle", &owner, ttl, who)
                    .await
                    .unwrap(),
            );
            assert!(Lock::release(&*b, "cycle", &owner).await.unwrap());
        }
    };
    cycle(OwnerToken::random()).await;
    sleep(Duration::from_millis(300)).await;
    let methods = [
        "LeaseGrant",
        "Txn",
        "LeaseRevoke",
        "LeaseKeepAlive",
        "Range",
        "LeaseTimeToLive",
        "DeleteRange",
    ];
    let count = |server: &EtcdServer| -> Vec<f64> {
        methods
            .iter()
            .map(|m| {
                let method = format!("grpc_method=\"{m}\"");
                if *m == "LeaseKeepAlive" {
                    // Streams are counted when they end: count messages.
                    server.metric("grpc_server_msg_received_total", &[&method])
                } else {
                    server.metric("grpc_server_handled_total", &[&method, "grpc_code=\"OK\""])
                }
            })
            .collect()
    };
    let diff = |before: &[f64], server: &EtcdServer| -> Vec<f64> {
        count(server)
            .iter()
            .zip(before)
            .map(|(a, b)| a - b)
            .collect()
    };
    let before = count(&server);
    const CYCLES: u32 = 20;
    for _ in 0..CYCLES {
        cycle(OwnerToken::random()).await;
    }
    let n = f64::from(CYCLES);
    let mut calls = diff(&before, &server);
    // Keepalives: only for a reuse past the slack (see server.rs).
    let sent = std::mem::take(&mut calls[3]);
    assert!(sent <= n, "{sent} keepalives in {CYCLES} cycles");
    assert_eq!(
        calls,
        vec![0.0, n, 0.0, 0.0, 0.0, 0.0, n],
        "calls per {CYCLES} cycles with metadata: {methods:?}"
    );
    let owner = OwnerToken::random();
    granted(
        Lock::try_acquire_with_metadata(&*b, "cycle", &owner, ttl, who)
            .await
            .unwrap(),
    );
    let before = count(&server);
    let info = Lock::inspect(&*b, "cycle").await.unwrap();
    assert_eq!(one(&info).metadata.as_deref(), Some(&who[..]));
    assert_eq!(
        diff(&before, &server),
        vec![0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0],
        "calls of one inspect: {methods:?}"
    );
    assert!(Lock::release(&*b, "cycle", &owner).await.unwrap());
}
