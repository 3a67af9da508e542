//! A client PROCESS frozen past its TTL while it holds the lock (the
//! seed's GC-pause story), on etcd: the scenario is
//! `conformance::faults::process`; the child is this test binary,
//! re-executed.

use conformance::faults::process;
use conformance::testkit::etcd::EtcdServer;
use tokio::time::Duration;

use super::common::{BACKEND, SLACK, TTL, client};

/// The child's side (does nothing unless re-executed as the child).
#[test]
fn child_process_role() {
    process::run_child(
        |port| async move { client(&[format!("127.0.0.1:{port}")]).await },
        TTL,
    );
}

/// The child holds the lock and is frozen past its TTL; its stale write
/// is refused and its release reports `NotHeld`. The new holder may wait
/// up to 4 s: etcd expires the frozen child's lease up to ~1.5 s late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_process_paused_past_its_ttl() {
    let server = EtcdServer::start();
    process::client_process_paused_past_its_ttl(
        &server.client_port().to_string(),
        &process::test_name(module_path!(), "child_process_role"),
        |port| async move { client(&[format!("127.0.0.1:{port}")]).await },
        TTL,
        Duration::from_secs(4),
        BACKEND,
        TTL + SLACK,
    )
    .await;
}
