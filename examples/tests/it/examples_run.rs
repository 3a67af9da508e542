//! Every example runs to completion on every store this build includes:
//! the in-memory one always, and Redis, etcd and PostgreSQL (real servers
//! started by the conformance test kit) when their features are on.

use std::process::Command;
use std::time::{Duration, Instant};

const EXAMPLES: &[(&str, &str)] = &[
    ("quickstart", env!("CARGO_BIN_EXE_quickstart")),
    ("order_processing", env!("CARGO_BIN_EXE_order_processing")),
    ("inventory", env!("CARGO_BIN_EXE_inventory")),
    ("funds_transfer", env!("CARGO_BIN_EXE_funds_transfer")),
    ("long_job", env!("CARGO_BIN_EXE_long_job")),
    ("fenced_write", env!("CARGO_BIN_EXE_fenced_write")),
    ("leader_election", env!("CARGO_BIN_EXE_leader_election")),
    ("barrier", env!("CARGO_BIN_EXE_barrier")),
    ("rate_limited_api", env!("CARGO_BIN_EXE_rate_limited_api")),
    (
        "metrics_prometheus",
        env!("CARGO_BIN_EXE_metrics_prometheus"),
    ),
    ("connection_cap", env!("CARGO_BIN_EXE_connection_cap")),
    ("config_reload", env!("CARGO_BIN_EXE_config_reload")),
    ("work_queue", env!("CARGO_BIN_EXE_work_queue")),
];

fn run_all(url: &str) {
    run(url, EXAMPLES);
}

fn run(url: &str, examples: &[(&str, &str)]) {
    for (name, path) in examples {
        let start = Instant::now();
        let out = Command::new(path)
            .env("COORD_URL", url)
            .output()
            .unwrap_or_else(|e| panic!("could not start example {name}: {e}"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "example {name} failed on {url}: {}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            out.status
        );
        assert!(
            stdout.contains("connected to"),
            "example {name} printed nothing useful:\n{stdout}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "example {name} took {:?}",
            start.elapsed()
        );
    }
}

#[test]
fn every_example_runs_on_memory() {
    run_all("memory://");
}

#[cfg(feature = "redis")]
#[test]
fn every_example_runs_on_redis() {
    run_all(&conformance::testkit::redis::url());
}

#[cfg(feature = "postgres")]
#[test]
fn every_example_runs_on_postgres() {
    run_all(&conformance::testkit::postgres::url());
}

#[cfg(feature = "etcd")]
#[test]
fn every_example_runs_on_etcd() {
    run_all(&conformance::testkit::etcd::shared().url());
}
