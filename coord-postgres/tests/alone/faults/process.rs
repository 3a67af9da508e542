//! A client PROCESS frozen past its TTL while it holds the lock (the
//! GC-pause story of fencing tokens), on PostgreSQL: the scenario is
//! `conformance::faults::process`; the child is this test binary,
//! re-executed.

use conformance::faults::process;
use tokio::time::Duration;

use super::{BACKEND, SERIAL, SLACK, TTL, client, database};

/// The child's side (does nothing unless re-executed as the child).
#[test]
fn child_process_role() {
    process::run_child(|url| async move { client(&url).await }, TTL);
}

/// The child holds the lock and is frozen past its TTL; its stale write
/// is refused and its release reports `NotHeld`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_process_paused_past_its_ttl() {
    let _serial = SERIAL.lock().await;
    let (url, _) = database("gc_pause").await;
    process::client_process_paused_past_its_ttl(
        &url,
        &process::test_name(module_path!(), "child_process_role"),
        |url| async move { client(&url).await },
        TTL,
        Duration::from_secs(3),
        BACKEND,
        TTL + SLACK,
    )
    .await;
}
