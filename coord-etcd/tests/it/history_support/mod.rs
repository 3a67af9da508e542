//! Shared by `key_history.rs` and `sem_key_history.rs`: what etcd's
//! history says was written, read with a watch from a revision on.

use std::time::Duration;

use conformance::testkit::etcd::EtcdServer;

/// The distinct keys written under `prefix` from revision `from` to
/// `to`, read back from etcd's history with a watch.
pub async fn distinct_keys(server: &EtcdServer, prefix: &str, from: i64, to: i64) -> usize {
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let mut events = raw
        .watch(
            prefix,
            Some(
                etcd_client::WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(from),
            ),
        )
        .await
        .unwrap();
    let mut keys = std::collections::HashSet::new();
    let mut last = 0;
    while last < to {
        let resp = tokio::time::timeout(Duration::from_secs(5), events.message())
            .await
            .expect("the watch answers")
            .unwrap()
            .expect("the watch is open");
        for e in resp.events() {
            if let Some(kv) = e.kv() {
                keys.insert(kv.key().to_vec());
                last = last.max(kv.mod_revision());
            }
        }
    }
    keys.len()
}

/// The server's current revision.
pub async fn revision(server: &EtcdServer) -> i64 {
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    raw.get("x", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision()
}
