//! Shared by the etcd claim tests that drive the shared test server with
//! clients of their own and read its keys directly
//! (`claim_keys_named_by_lease/`, `owner_queued_through_another_client/`,
//! `cross_client_owner.rs`, `same_owner_one_client.rs`): a key prefix per
//! test, clients, a raw etcd client, and the claim keys as stored.

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use conformance::testkit::etcd;
use coord_core::Attempt;
use coord_etcd::{EtcdBackend, EtcdOptions};
use etcd_client::{GetOptions, KeyValue};

/// A key prefix of its own per test: `<tag>-<pid>-<n>/`.
pub fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}-{}-{}/",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A client of the etcd on `port` (the shared server's, or a proxy's),
/// keys under `prefix`, calls bounded by `timeout_ms`.
pub async fn client_at(port: u16, prefix: &str, timeout_ms: u64) -> Arc<EtcdBackend> {
    let url = format!("etcd://127.0.0.1:{port}?prefix={prefix}&timeout_ms={timeout_ms}");
    EtcdBackend::connect(EtcdOptions::parse(&url).unwrap())
        .await
        .expect("connect to the test etcd")
}

/// A client of the shared server, straight (no proxy).
pub async fn client(prefix: &str) -> Arc<EtcdBackend> {
    client_at(etcd::shared().client_port(), prefix, 5000).await
}

/// A raw etcd client of the shared server.
pub async fn raw_etcd() -> etcd_client::Client {
    etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap()
}

/// How coord-etcd escapes a name in a key (`%` -> `%25`, `/` -> `%2F`).
pub fn esc(name: &str) -> String {
    name.replace('%', "%25").replace('/', "%2F")
}

/// The keys under `<prefix><kind>/<escaped name>/` now, in create order.
pub async fn claim_keys(prefix: &str, kind: &str, name: &str) -> Vec<KeyValue> {
    let dir = format!("{prefix}{kind}/{}/", esc(name));
    let mut kvs = raw_etcd()
        .await
        .get(dir.as_bytes(), Some(GetOptions::new().with_prefix()))
        .await
        .unwrap()
        .take_kvs();
    kvs.sort_by_key(|kv| kv.create_revision());
    kvs
}

/// Every key under `prefix`, whatever the primitive.
pub async fn all_keys(prefix: &str) -> Vec<KeyValue> {
    raw_etcd()
        .await
        .get(prefix.as_bytes(), Some(GetOptions::new().with_prefix()))
        .await
        .unwrap()
        .take_kvs()
}

/// The owner's hex in a claim key's value.
pub fn owner_of(kv: &KeyValue) -> Vec<u8> {
    kv.value().split(|b| *b == b' ').next().unwrap().to_vec()
}

/// The token of a grant; panics on anything else.
pub fn granted(a: coord_core::Result<Attempt>) -> u64 {
    match a {
        Ok(Attempt::Granted(t)) => t.get(),
        a => panic!("expected a grant, got {a:?}"),
    }
}
