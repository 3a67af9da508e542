//! What metadata and inspection cost: no extra call for metadata, and one
//! range read for an inspect.

use std::time::Duration;

use coord_core::{Lock, OwnerToken};
use coord_etcd::{EtcdBackend, EtcdOptions};
use tokio::time::sleep;

use super::{granted, one};

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
                Lock::try_acquire_with_metadata(&*b, "cycle", owner.step(), ttl, who)
                    .await
                    .unwrap(),
            );
            assert!(Lock::release(&*b, "cycle", owner.step()).await.unwrap());
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
        Lock::try_acquire_with_metadata(&*b, "cycle", owner.step(), ttl, who)
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
    assert!(Lock::release(&*b, "cycle", owner.step()).await.unwrap());
}
