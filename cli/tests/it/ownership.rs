//! What `coord lock`, `elect` and `queue work` report when they lose what
//! they hold, and that nothing stays held when the command cannot start:
//! the real binary against a real Redis.

use crate::common;
use common::*;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// How many times a racy outcome is tried.
const RUNS: usize = 20;

/// The lock is force-released while the command runs and another worker
/// takes it; the command ends before the next renewal would notice. The
/// release then finds the lock not held: coord exits 76, not the
/// command's 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_exits_76_when_the_release_finds_the_lock_taken() {
    let url = conformance::testkit::redis::url();
    let name = unique("taken");
    let mut child = coord(&url)
        .args(["lock", &name, "--ttl", "30s", "--"])
        .args(["sh", "-c", "echo started; read x"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(next_line(&mut lines).await, "started");
    let c = coord::connect(&url).await.unwrap();
    let locks = c.locks().unwrap();
    assert!(locks.force_release(&name).await.unwrap());
    let other = locks
        .try_acquire(&name, Duration::from_secs(30))
        .await
        .unwrap()
        .expect("another worker takes the released lock");
    // Let the command finish: well before the renewal at 10 s.
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"go\n").await.unwrap();
    drop(stdin);
    let status = exited(&mut child).await;
    let mut err = String::new();
    use tokio::io::AsyncReadExt;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .await
        .unwrap();
    assert_eq!(status.code(), Some(LOST), "{status:?}; stderr: {err}");
    assert!(err.contains("not held"), "stderr: {err}");
    assert!(other.is_valid(), "the other worker's lock was touched");
    other.release().await.unwrap();
}

/// The leadership is taken over while the command runs (the store's
/// record changed under it, another candidate elected); the command ends
/// before the next renewal: the resign finds it not held, coord exits 76.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_exits_76_when_the_resign_finds_the_leadership_taken() {
    let server = conformance::testkit::redis::server();
    let url = server.url();
    let name = unique("usurped");
    let mut child = coord(&url)
        .args(["elect", &name, "--id", "first", "--ttl", "30s", "--"])
        .args(["sh", "-c", "echo started; read x"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(next_line(&mut lines).await, "started");
    // What a lapse would leave: the hash without its owner.
    let key = format!("coord:election:{{{name}}}");
    server.command(&["HDEL", &key, "owner", "candidate"]);
    let c = coord::connect(&url).await.unwrap();
    let elections = c.elections().unwrap();
    let second = elections
        .try_campaign(&name, "second", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("the second candidate is elected");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"go\n").await.unwrap();
    drop(stdin);
    let status = exited(&mut child).await;
    assert_eq!(status.code(), Some(LOST), "{status:?}");
    let leader = elections.leader(&name).await.unwrap().expect("a leader");
    assert_eq!(leader.candidate, "second");
    second.resign().await.unwrap();
}

/// A command that cannot start: coord exits 64 and the lock is free the
/// moment it has exited (released, not left to its 30 s TTL). Raced
/// against the runtime's shutdown when left to a guard's drop, so tried
/// [`RUNS`] times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_is_free_right_after_a_command_that_cannot_start() {
    let url = conformance::testkit::redis::url();
    let mut held = 0;
    for _ in 0..RUNS {
        let name = unique("nostart");
        let out = run(
            &url,
            &["lock", &name, "--ttl", "30s", "--", "/nonexistent/command"],
        )
        .await;
        assert_eq!(out.status.code(), Some(USAGE), "{out:?}");
        assert!(text(&out.stderr).contains("cannot run"), "{out:?}");
        if !lock_is_free(&url, &name).await {
            held += 1;
        }
    }
    assert_eq!(held, 0, "{held} of {RUNS} runs left the lock held");
}

/// The same for `elect`: no leader the moment coord has exited 64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_leaves_no_leader_after_a_command_that_cannot_start() {
    let url = conformance::testkit::redis::url();
    let c = coord::connect(&url).await.unwrap();
    let elections = c.elections().unwrap();
    let mut held = 0;
    for _ in 0..RUNS {
        let name = unique("nostart-elect");
        let out = run(
            &url,
            &[
                "elect",
                &name,
                "--id",
                "a",
                "--ttl",
                "30s",
                "--",
                "/nonexistent/command",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(USAGE), "{out:?}");
        if elections.leader(&name).await.unwrap().is_some() {
            held += 1;
        }
    }
    assert_eq!(held, 0, "{held} of {RUNS} runs left the leadership held");
}

/// The same for `queue work`: the message is back in the queue (ready,
/// not in flight) the moment coord has exited 64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_work_gives_the_message_back_when_the_command_cannot_start() {
    let url = conformance::testkit::redis::url();
    let mut held = 0;
    for _ in 0..RUNS {
        let q = unique("nostart-q");
        let out = run(&url, &["queue", "push", &q, "job"]).await;
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let out = run(
            &url,
            &[
                "queue",
                "work",
                &q,
                "--visibility",
                "30s",
                "--",
                "/nonexistent/command",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(USAGE), "{out:?}");
        let out = run(&url, &["queue", "stats", &q, "--json"]).await;
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if s["in_flight"] != 0 || s["ready"] != 1 {
            held += 1;
        }
    }
    assert_eq!(held, 0, "{held} of {RUNS} runs left the message in flight");
}
