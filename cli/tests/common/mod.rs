//! What every test of the `coord` binary shares: the stores it runs
//! against (real servers started by the test kit), unique names, and
//! running the binary as a user would.
#![allow(dead_code)]

use std::process::{Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use conformance::testkit::{etcd, postgres, redis};
use tokio::process::Command;

/// Exit code: busy (not acquired, no message, denied).
pub const BUSY: i32 = 75;
/// Exit code: the lock, leadership or delivery was lost.
pub const LOST: i32 = 76;
/// Exit code: bad input or configuration.
pub const USAGE: i32 = 64;
/// Exit code: the store is unavailable.
pub const UNAVAILABLE: i32 = 69;

/// The URLs of a real Redis, PostgreSQL and etcd.
pub fn stores() -> Vec<String> {
    vec![
        redis::server().url(),
        postgres::cluster().url(),
        etcd::shared().url(),
    ]
}

/// A name unique to this process and call.
pub fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "cli-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The `coord` binary with `COORD_URL` set, no stdin, killed when dropped.
pub fn coord(url: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_coord"));
    c.env("COORD_URL", url)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    c
}

/// Run `coord ARGS…` to completion (at most 60 s).
pub async fn run(url: &str, args: &[&str]) -> Output {
    tokio::time::timeout(Duration::from_secs(60), coord(url).args(args).output())
        .await
        .expect("coord did not finish in 60 s")
        .expect("run coord")
}

/// Output bytes as trimmed text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim().to_string()
}
