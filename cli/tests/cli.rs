//! The `coord` binary run as a user runs it, against real Redis, PostgreSQL
//! and etcd servers started by the test kit.

mod common;

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

/// `elect` runs the command as leader with its term; `leader` shows it
/// (plain and JSON) and says so when there is none (exit 75).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_and_leader() {
    for url in stores() {
        let name = unique("elect");
        let mut child = coord(&url)
            .args([
                "elect", &name, "--id", "alpha", "--ttl", "5s", "--", "sh", "-c",
            ])
            .arg("echo $COORD_TERM; sleep 4")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let term: u64 = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("not elected")
            .unwrap()
            .expect("a term")
            .parse()
            .expect("a numeric term");
        let out = run(&url, &["leader", &name, "--json"]).await;
        assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["leader"], "alpha", "{url}: {v}");
        assert_eq!(v["term"], term, "{url}: {v}");
        let out = run(&url, &["leader", &name]).await;
        assert_eq!(text(&out.stdout), format!("alpha (term {term})"));
        // A second candidate gives up at --wait, naming the leader.
        let out = run(
            &url,
            &[
                "elect", &name, "--id", "beta", "--wait", "200ms", "--", "true",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(BUSY), "{url}: {out:?}");
        assert!(
            text(&out.stderr).contains(&format!("the leader is alpha (term {term})")),
            "{url}: {out:?}"
        );
        assert_eq!(child.wait().await.unwrap().code(), Some(0));
        // It resigned when the command ended.
        let out = run(&url, &["leader", &name, "--json"]).await;
        assert_eq!(out.status.code(), Some(BUSY), "{url}: {out:?}");
        assert_eq!(text(&out.stdout), r#"{"leader":null}"#);
    }
}

/// Force release asks first (and refuses without a terminal), limits exit
/// 75 once the quota is spent, fencing tokens rise, and two processes meet
/// at a barrier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_limit_fence_and_barrier() {
    for url in stores() {
        let name = unique("force");
        let c = coord::connect(&url).await.unwrap();
        let held = c
            .locks()
            .unwrap()
            .try_acquire(&name, Duration::from_secs(30))
            .await
            .unwrap()
            .expect("free");
        let out = run(&url, &["release", "--force", "lock", &name]).await;
        assert_eq!(out.status.code(), Some(USAGE), "{url}: {out:?}");
        assert!(held.is_valid());
        let out = run(&url, &["release", "--force", "lock", &name, "--yes"]).await;
        assert_eq!(text(&out.stdout), "released", "{url}: {out:?}");
        let out = run(&url, &["release", "--force", "lock", &name, "--yes"]).await;
        assert_eq!(text(&out.stdout), "not held", "{url}: {out:?}");
        drop(held);

        let key = unique("limit");
        let args = ["limit", &key, "--limit", "2", "--window", "1m"];
        let codes = [
            run(&url, &args).await.status.code(),
            run(&url, &args).await.status.code(),
            run(&url, &args).await.status.code(),
        ];
        assert_eq!(codes, [Some(0), Some(0), Some(BUSY)], "{url}");
        let mut json_args = args.to_vec();
        json_args.push("--json");
        let out = run(&url, &json_args).await;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["allowed"], false, "{url}: {v}");
        assert!(v["retry_after_ms"].as_u64().unwrap() > 0, "{url}: {v}");

        let resource = unique("fence");
        let a: u64 = text(&run(&url, &["fence", "next", &resource]).await.stdout)
            .parse()
            .unwrap();
        let b: u64 = text(&run(&url, &["fence", "next", &resource]).await.stdout)
            .parse()
            .unwrap();
        assert!(b > a, "{url}: {a} then {b}");

        let barrier = unique("barrier");
        let one = coord(&url)
            .args([
                "barrier",
                &barrier,
                "--parties",
                "2",
                "--id",
                "p1",
                "--timeout",
                "30s",
            ])
            .output();
        let two = coord(&url)
            .args([
                "barrier",
                &barrier,
                "--parties",
                "2",
                "--id",
                "p2",
                "--timeout",
                "30s",
            ])
            .output();
        let (one, two) = tokio::join!(one, two);
        let (one, two) = (one.unwrap(), two.unwrap());
        assert_eq!(one.status.code(), Some(0), "{url}: {one:?}");
        assert_eq!(two.status.code(), Some(0), "{url}: {two:?}");
        assert_eq!(text(&one.stdout), text(&two.stdout));
        let alone = unique("alone");
        let out = run(
            &url,
            &[
                "barrier",
                &alone,
                "--parties",
                "2",
                "--id",
                "p",
                "--timeout",
                "300ms",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(BUSY), "{url}: {out:?}");
    }
}

/// Bad input is exit 64 with the fix in words; an unreachable store 69.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_unreachable_stores() {
    let url = conformance::testkit::redis::server().url();
    let out = run(&url, &["lock", "x", "--ttl", "5", "--", "true"]).await;
    assert_eq!(out.status.code(), Some(USAGE), "{out:?}");
    assert!(
        text(&out.stderr).contains("write a number and a unit"),
        "{out:?}"
    );
    let out = run("bogus://x", &["fence", "next", "r"]).await;
    assert_eq!(out.status.code(), Some(USAGE), "{out:?}");
    assert!(text(&out.stderr).contains("unknown scheme"), "{out:?}");
    let out = run(&format!("{url}?prefx=a"), &["fence", "next", "r"]).await;
    assert_eq!(out.status.code(), Some(USAGE), "{out:?}");
    let out = run(&url, &["lock", "", "--", "true"]).await;
    assert_eq!(out.status.code(), Some(USAGE), "{out:?}");
    let out = run(
        "redis://127.0.0.1:1/?connect_timeout=500ms",
        &["fence", "next", "r"],
    )
    .await;
    assert_eq!(out.status.code(), Some(UNAVAILABLE), "{out:?}");
    assert!(text(&out.stderr).contains("reachable"), "{out:?}");
    let out = run(&url, &["--help"]).await;
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("Exit codes"));
}
