//! What the tests of semaphore keys named by leases
//! (`semaphore_keys_by_lease.rs`, `semaphore_queue_by_lease.rs`,
//! `semaphore_adopted_grants.rs`, `semaphore_grant_revisions/`,
//! `semaphore_moving_retry.rs`, `semaphore_extend_racing_release.rs`,
//! `semaphore_same_owner_one_client/`, `same_owner_one_client.rs`)
//! share: clients of the binary's shared etcd with a key prefix of their
//! own, the name's grants and places as etcd holds them, an observer
//! that checks etcd's view of a name never exceeds its total, and the
//! lost reply of a moving extend (`semaphore_grant_revisions/`,
//! `semaphore_moving_retry.rs`).

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use conformance::testkit::etcd;
use conformance::testkit::proxy::{FaultProxy, Mode};
use coord_core::{Attempt, Coord, OwnerToken, PermitRequest, Semaphore};
use coord_etcd::EtcdOptions;
use etcd_client::{GetOptions, KeyValue};
use tokio::time::sleep;

pub const LONG: Duration = Duration::from_secs(30);
/// A TTL a test lets run out.
pub const SHORT: Duration = Duration::from_secs(3);
/// Past SHORT plus a leader-change slack and the test's own delays.
pub const PAST_SHORT: Duration = Duration::from_secs(6);

/// A key prefix of its own per test (ends with `/`).
pub fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "rsk-{tag}-{}-{}/",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub async fn coord_at(port: u16, prefix: &str, timeout_ms: u64) -> Coord {
    let url = format!("etcd://127.0.0.1:{port}?prefix={prefix}&timeout_ms={timeout_ms}");
    coord_etcd::connect_with(EtcdOptions::parse(&url).unwrap())
        .await
        .expect("connect to the test etcd")
}

/// A client of the shared server, straight (no proxy).
pub async fn coord(prefix: &str) -> Coord {
    coord_at(etcd::shared().client_port(), prefix, 5000).await
}

pub fn raw(c: &Coord) -> Arc<dyn Semaphore> {
    c.raw_semaphore().unwrap()
}

pub async fn raw_etcd() -> etcd_client::Client {
    etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap()
}

/// Every key under `<prefix>sem/<name>/`.
pub async fn sem_keys(prefix: &str, name: &str) -> Vec<KeyValue> {
    let dir = format!("{prefix}sem/{name}/");
    let mut r = raw_etcd().await;
    let mut kvs = r
        .get(dir.as_bytes(), Some(GetOptions::new().with_prefix()))
        .await
        .unwrap()
        .take_kvs();
    kvs.sort_by_key(|kv| kv.create_revision());
    kvs
}

/// A grant or place as etcd holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Rec {
    pub key: String,
    pub owner: String,
    pub permits: u32,
    pub total: u32,
    pub create: i64,
    pub modr: i64,
    pub lease: i64,
}

pub fn parse(kv: &KeyValue) -> Rec {
    let v = kv.value_str().unwrap();
    let mut it = v.split(' ');
    let owner = it.next().unwrap().to_string();
    let permits = it.next().unwrap().parse().unwrap();
    let total = it.next().unwrap().parse().unwrap();
    Rec {
        key: kv.key_str().unwrap().to_string(),
        owner,
        permits,
        total,
        create: kv.create_revision(),
        modr: kv.mod_revision(),
        lease: kv.lease(),
    }
}

/// (grants, places, slot count) of `name`, one snapshot.
pub async fn state(prefix: &str, name: &str) -> (Vec<Rec>, Vec<Rec>, usize) {
    let kvs = sem_keys(prefix, name).await;
    let dir = format!("{prefix}sem/{name}/");
    let (mut h, mut w, mut s) = (Vec::new(), Vec::new(), 0);
    for kv in &kvs {
        let rest = &kv.key_str().unwrap()[dir.len()..];
        if rest.starts_with("h/") {
            h.push(parse(kv));
        } else if rest.starts_with("w/") {
            w.push(parse(kv));
        } else if rest.starts_with("s/") {
            s += 1;
        } else {
            panic!("unexpected key {rest:?}");
        }
    }
    (h, w, s)
}

pub fn req(permits: u32, total: u32, ttl: Duration, queue: bool) -> PermitRequest {
    PermitRequest {
        permits,
        total,
        ttl,
        queue,
    }
}

pub fn granted(a: coord_core::Result<Attempt>) -> u64 {
    match a {
        Ok(Attempt::Granted(t)) => t.get(),
        a => panic!("expected a grant: {a:?}"),
    }
}

/// The grant of an attempt sent again while the store answers "again
/// soon" (`Held` with at most 20 ms to wait: every compare-and-swap round
/// lost, or the name changed under the place's write), as the core's
/// acquire loop does, at most 50 times; any other answer is final.
pub async fn granted_soon<F, Fut>(attempt: F) -> u64
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = coord_core::Result<Attempt>>,
{
    for _ in 0..50 {
        match attempt().await {
            Ok(Attempt::Held {
                expires_in: Some(d),
            }) if d <= std::time::Duration::from_millis(20) => {
                tokio::time::sleep(d).await;
            }
            a => return granted(a),
        }
    }
    panic!("expected a grant: the store answered \"again soon\" 50 times");
}

pub fn held(a: coord_core::Result<Attempt>, what: &str) {
    match a {
        Ok(Attempt::Held { .. }) => {}
        a => panic!("{what}: expected a refusal, got {a:?}"),
    }
}

/// Wait until a condition holds (checked every 20 ms), at most a limit.
pub use conformance::testkit::wait::until;

/// A small deterministic generator per task.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Checks etcd's view of `name` until `stop`: the grants' permits never
/// sum above `total`, each grant's value names `total`, slots match the
/// granted permits, no owner has two grants. Returns the observations.
pub fn observer(
    prefix: String,
    name: String,
    total: u32,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            let (h, _w, s) = state(&prefix, &name).await;
            let sum: u32 = h.iter().map(|r| r.permits).sum();
            assert!(sum <= total, "etcd holds {sum} > {total} permits: {h:#?}");
            assert!(s as u32 <= total, "{s} slot keys > {total}");
            assert_eq!(s as u32, sum, "slots {s} != granted permits {sum}: {h:#?}");
            let mut owners: Vec<&str> = h.iter().map(|r| r.owner.as_str()).collect();
            owners.sort();
            owners.dedup();
            assert_eq!(owners.len(), h.len(), "an owner with two grants: {h:#?}");
            for r in &h {
                assert_eq!(r.total, total, "{r:?}");
                let lease_hex = r.key.rsplit('/').next().unwrap();
                assert!(
                    i64::from_str_radix(lease_hex, 16).is_ok(),
                    "a grant key not named by a lease: {r:?}"
                );
            }
            n += 1;
            sleep(Duration::from_millis(5)).await;
        }
        n
    })
}

/// Whether `owner` has a grant key in etcd.
pub async fn has_grant(p: &str, n: &str, owner: &OwnerToken) -> bool {
    state(p, n)
        .await
        .0
        .iter()
        .any(|r| r.owner == owner.to_hex())
}

/// Drop the proxy's replies from the moment etcd applies a put of `key`
/// onto a lease other than `old` (a move, seen by a watch straight to
/// etcd), so that the moving transaction is applied while its reply (held
/// back by the proxy's latency) is lost. Answers whether it saw the move.
pub fn drop_reply_of_move(
    proxy: Arc<FaultProxy>,
    key: String,
    old: i64,
) -> tokio::task::JoinHandle<bool> {
    tokio::spawn(async move {
        let mut c = raw_etcd().await;
        let mut stream = c.watch(key.as_bytes(), None).await.unwrap();
        while let Ok(Some(resp)) = stream.message().await {
            for ev in resp.events() {
                if let Some(kv) = ev.kv() {
                    if ev.event_type() == etcd_client::EventType::Put && kv.lease() != old {
                        proxy.set(Mode::DropReplies);
                        return true;
                    }
                }
            }
        }
        false
    })
}
