//! `coord lock` running a command: with the lock's token and the
//! command's exit code, waiting in line with `--fair`, exit 75 without
//! running it when the lock is busy, and a lost lock stopping the command
//! (SIGTERM first).

use crate::common;
use common::*;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};

/// The command runs with the lock's fencing token in its environment, its
/// exit code is passed through, and each run's token is above the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_runs_the_command_with_its_token_and_exit_code() {
    for url in stores() {
        let name = unique("lock");
        let script = "echo $COORD_FENCING_TOKEN $COORD_LOCK; exit 7";
        let mut last = 0u64;
        for _ in 0..2 {
            let out = run(
                &url,
                &["lock", &name, "--ttl", "5s", "--", "sh", "-c", script],
            )
            .await;
            assert_eq!(out.status.code(), Some(7), "{url}: {out:?}");
            let stdout = text(&out.stdout);
            let (token, lock) = stdout.split_once(' ').expect("token and name");
            let token: u64 = token.parse().expect("a numeric token");
            assert_eq!(lock, name);
            assert!(token > last, "{url}: token {token} after {last}");
            last = token;
        }
        // Released after the command: the name is free again.
        let c = coord::connect(&url).await.unwrap();
        let g = c
            .locks()
            .unwrap()
            .try_acquire(&name, Duration::from_secs(5))
            .await;
        assert!(g.unwrap().is_some(), "{url}: the CLI left the lock held");
    }
}

/// `coord lock --fair` waits in line behind a fair holder (a library
/// client here) and runs its command once the holder lets go, with a
/// token above the holder's. (The order among fair waiters is the
/// conformance case `lock_fair_grants_waiters_in_arrival_order`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_lock_waits_in_line_then_runs() {
    for url in stores() {
        let name = unique("fair");
        let c = coord::connect(&url).await.unwrap();
        let opts = coord::LockOptions::new(Duration::from_secs(30)).fair(true);
        let held = c.locks().unwrap().acquire_with(&name, opts).await.unwrap();
        let before = held.fencing_token().0;
        let args = ["lock", &name, "--fair", "--wait", "20s", "--", "sh", "-c"];
        let run = coord(&url)
            .args(args)
            .arg("echo $COORD_FENCING_TOKEN")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        held.release().await.unwrap();
        let out = run.wait_with_output().await.unwrap();
        assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
        let token: u64 = text(&out.stdout).trim().parse().expect("a token");
        assert!(token > before, "{url}: token {token} after {before}");
    }
}

/// A held lock: `--wait` passes and the tool exits 75 without running the
/// command, saying who holds it (owner id and metadata).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_lock_exits_75_without_running_the_command() {
    for url in stores() {
        let name = unique("busy");
        let c = coord::connect(&url).await.unwrap();
        let who = serde_json::json!({"host": "batch-9", "job": "backfill"});
        let held = c
            .locks()
            .unwrap()
            .acquire_with_metadata(
                &name,
                coord::LockOptions::new(Duration::from_secs(30)),
                &who,
            )
            .await
            .unwrap();
        let started = Instant::now();
        let out = run(
            &url,
            &["lock", &name, "--wait", "300ms", "--", "echo", "ran"],
        )
        .await;
        assert_eq!(out.status.code(), Some(BUSY), "{url}: {out:?}");
        assert!(text(&out.stdout).is_empty(), "{url}: the command ran");
        assert!(started.elapsed() >= Duration::from_millis(300));
        let err = text(&out.stderr);
        assert!(
            err.contains(&format!("held by {}", held.owner_id()))
                && err.contains(r#""job":"backfill""#),
            "{url}: the busy message does not name the holder: {err}"
        );
        held.release().await.unwrap();
    }
}

/// The lock is force-released under the running command: the watchdog's
/// next renewal finds it gone, the command gets SIGTERM, and one that
/// ignores it gets SIGKILL after `--grace`; the tool exits 76.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_stops_the_command() {
    for url in stores() {
        for ignores_term in [false, true] {
            let name = unique("lost");
            let script = if ignores_term {
                "echo started; trap '' TERM; exec sleep 30"
            } else {
                "echo started; exec sleep 30"
            };
            let mut child = coord(&url)
                .args([
                    "lock", &name, "--ttl", "2s", "--grace", "1500ms", "--", "sh", "-c", script,
                ])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
                .await
                .expect("the command did not start")
                .unwrap();
            assert_eq!(first.as_deref(), Some("started"));
            let c = coord::connect(&url).await.unwrap();
            assert!(c.locks().unwrap().force_release(&name).await.unwrap());
            let released = Instant::now();
            let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
                .await
                .expect("the command was not stopped")
                .unwrap();
            let took = released.elapsed();
            assert_eq!(status.code(), Some(LOST), "{url}");
            if ignores_term {
                assert!(
                    took >= Duration::from_millis(1500),
                    "{url}: SIGKILL before the grace: {took:?}"
                );
            }
            // Renewal at a third of the TTL, then the grace: well within 8 s.
            assert!(
                took < Duration::from_secs(8),
                "{url}: stopped after {took:?}"
            );
        }
    }
}

/// A lost lock stops the command with SIGTERM first: a command that traps
/// TERM writes a marker and exits by itself long before `--grace` (so no
/// SIGKILL was needed), and the tool exits 76 (LOST, documented), not the
/// command's own code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_sends_sigterm_first() {
    let dir = conformance::testkit::scratch_dir().join(unique("term-marker"));
    std::fs::create_dir_all(&dir).unwrap();
    for url in stores() {
        let name = unique("lost-term");
        let marker = dir.join(&name);
        let script = format!(
            "trap 'echo TERM > {m}; kill $! 2>/dev/null; exit 3' TERM; \
             echo started; sleep 30 </dev/null >/dev/null 2>&1 & wait",
            m = marker.display()
        );
        let mut child = coord(&url)
            .args([
                "lock", &name, "--ttl", "2s", "--grace", "20s", "--", "sh", "-c", &script,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("the command did not start")
            .unwrap();
        assert_eq!(first.as_deref(), Some("started"), "{url}");
        assert!(!marker.exists(), "{url}: TERM before the lock was lost");
        let c = coord::connect(&url).await.unwrap();
        assert!(c.locks().unwrap().force_release(&name).await.unwrap());
        let released = Instant::now();
        let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
            .await
            .expect("the command was not stopped")
            .unwrap();
        let took = released.elapsed();
        assert_eq!(out.status.code(), Some(LOST), "{url}: {out:?}");
        let got = std::fs::read_to_string(&marker)
            .unwrap_or_else(|e| panic!("{url}: no marker, so no SIGTERM: {e}; {out:?}"));
        assert_eq!(got.trim(), "TERM", "{url}");
        // SIGKILL would have come only 20 s after the TERM.
        assert!(
            took < Duration::from_secs(10),
            "{url}: stopped after {took:?}"
        );
        assert!(
            text(&out.stderr).contains("SIGTERM"),
            "{url}: the tool does not say what it did: {out:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
