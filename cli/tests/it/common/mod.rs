//! What every test of the `coord` binary shares: the stores it runs
//! against (real servers started by the test kit), unique names, and
//! running the binary as a user would.
#![allow(dead_code)]

pub mod browser;
pub mod http;

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

/// Whether process `pid` still runs: it has a `/proc` entry and is not a
/// zombie (an orphan's zombie may stay when the system's init does not
/// reap it).
pub fn running(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "pid (comm) S ...": the state follows the last ')'.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, None | Some("Z") | Some("X"))
}

/// Whether process `pid` is stopped (state `T`, e.g. by SIGTSTP).
pub fn stopped(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let state = s.rsplit_once(')')?.1.split_whitespace().next()?;
            Some(state == "T")
        })
        .unwrap_or(false)
}

/// Wait up to `limit` until `check()` holds; whether it did.
pub async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let end = tokio::time::Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Process ids the test caused to exist (commands and what they started):
/// each one still running is sent SIGKILL when this is dropped, so a
/// failing test leaves nothing behind.
#[derive(Default)]
pub struct Reaper(pub std::sync::Mutex<Vec<i32>>);

impl Reaper {
    /// Remember `pid` to kill at the end.
    pub fn add(&self, pid: i32) {
        self.0.lock().unwrap().push(pid);
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        for &pid in self.0.lock().unwrap().iter() {
            if running(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

/// Send `sig` to process `pid`.
pub fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).expect("kill");
}

/// Whether lock `name` is free: a try-acquire gets it (and releases it).
pub async fn lock_is_free(url: &str, name: &str) -> bool {
    let c = coord::connect(url).await.unwrap();
    match c
        .locks()
        .unwrap()
        .try_acquire(name, Duration::from_secs(5))
        .await
        .unwrap()
    {
        Some(g) => {
            g.release().await.unwrap();
            true
        }
        None => false,
    }
}

/// The next line `lines` gives, within 20 s.
pub async fn next_line<R: tokio::io::AsyncBufRead + Unpin>(
    lines: &mut tokio::io::Lines<R>,
) -> String {
    tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("no line within 20 s")
        .expect("read a line")
        .expect("a line, not the end")
}

/// Wait up to 30 s for a `coord` process to exit.
pub async fn exited(child: &mut tokio::process::Child) -> std::process::ExitStatus {
    tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("coord did not exit within 30 s")
        .expect("wait for coord")
}
