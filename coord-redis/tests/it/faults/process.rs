//! A client PROCESS frozen past its TTL while it holds the lock (the
//! GC-pause story of fencing tokens), on Redis: the scenario is
//! `conformance::faults::process`; the child is this test binary,
//! re-executed.

use conformance::faults::process;
use conformance::testkit::redis::RedisServer;
use tokio::time::Duration;

use super::{BACKEND, SLACK, TTL, client};

/// The child's side (does nothing unless re-executed as the child).
#[test]
fn child_process_role() {
    process::run_child(
        |port| async move { client(port.parse().expect("a port")).await },
        TTL,
    );
}

/// The child holds the lock and is frozen past its TTL; its stale write
/// is refused and its release reports `NotHeld`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_process_paused_past_its_ttl() {
    let server = RedisServer::start();
    process::client_process_paused_past_its_ttl(
        &server.port().to_string(),
        &process::test_name(module_path!(), "child_process_role"),
        |port| async move { client(port.parse().expect("a port")).await },
        TTL,
        Duration::from_secs(3),
        BACKEND,
        TTL + SLACK,
    )
    .await;
}
