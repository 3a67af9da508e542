//! What every etcd fault scenario shares: the workload's shape, how its
//! clients connect, and how a run is judged.

use std::time::Duration;

use conformance::faults::{FaultLog, LockReport, LockWorkload, schedule};
use coord_core::Coord;
use coord_etcd::EtcdOptions;
use tokio::time::Instant;

pub const BACKEND: &str = "etcd";
/// The lock TTL (etcd TTLs are whole seconds; a 3-node cluster with the
/// default election timeout refuses leases under 2 s).
pub const TTL: Duration = Duration::from_secs(2);
/// How long after a heal the workload (and each client) may take to make
/// progress, beyond the TTL: etcd checks lease expiry every ~500 ms and
/// revokes an expired lease up to ~1.5 s after its TTL, plus a call
/// timeout (500 ms) and a reconnect or a wake-up.
pub const SLACK: Duration = Duration::from_secs(3);
/// The call timeout of every client (and the connect timeout).
pub const CALL_TIMEOUT: Duration = Duration::from_millis(500);

pub fn workload(watchdog: bool) -> LockWorkload {
    LockWorkload {
        ttl: TTL,
        // At most half the recovery bound (see `LockWorkload::wait`).
        wait: Duration::from_secs(2),
        watchdog,
        work: Duration::from_millis(20),
        duration: schedule(Duration::from_secs(8)),
    }
}

/// A client of the etcd members at `endpoints` (`127.0.0.1:PORT`) with
/// short call timeouts, as a service with a 2 s lock TTL would configure it.
pub async fn client(endpoints: &[String]) -> Coord {
    let opts = EtcdOptions::new(endpoints.iter().cloned())
        .with_call_timeout(CALL_TIMEOUT)
        .with_connect_timeout(CALL_TIMEOUT);
    coord_etcd::connect_with(opts)
        .await
        .expect("connect to the test etcd")
}

/// One client per proxy port (each alone behind its own proxy).
pub async fn clients_via(ports: &[u16]) -> Vec<Coord> {
    let mut out = Vec::new();
    for p in ports {
        out.push(client(&[format!("127.0.0.1:{p}")]).await);
    }
    out
}

/// `n` clients of the same endpoints.
pub async fn clients(endpoints: &[String], n: usize) -> Vec<Coord> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(client(endpoints).await);
    }
    out
}

/// Run `f` (a blocking kit call) off the async workers.
pub async fn blocking<T: Send + 'static, F: FnOnce() -> T + Send + 'static>(f: F) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("a kit call panicked")
}

/// 0 violations, progress and every client recovered within TTL + `slack`
/// of the heal.
pub fn judge(report: &LockReport, log: &FaultLog, scenario: &str, slack: Duration) {
    println!(
        "{scenario}: {} grants, longest stall {:?}, recovery {:?} (bound {:?})",
        report.grants.len(),
        report.longest_stall,
        report.recovery,
        TTL + slack
    );
    report.assert_ok(scenario, BACKEND, log.injected, TTL + slack);
    report.assert_every_client_recovered(scenario, BACKEND, TTL + slack);
}

/// The longest gap between two grants over the whole run (faults
/// included).
pub fn longest_gap(report: &LockReport) -> Duration {
    let mut times: Vec<Instant> = report.grants.iter().map(|g| g.granted).collect();
    times.sort();
    times
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default()
}
