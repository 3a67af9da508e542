//! `coord queue ...` run as a user runs it, against real Redis, PostgreSQL
//! and etcd servers started by the test kit.

use crate::common;
use common::*;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

async fn stats(url: &str, queue: &str) -> serde_json::Value {
    let out = run(url, &["queue", "stats", queue, "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
    serde_json::from_slice(&out.stdout).expect("stats JSON")
}

/// `push` prints the id; `work` runs the command with the payload on stdin
/// and the delivery in its environment, and acks on exit 0: the queue is
/// empty after. An empty queue exits 75 without running the command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_then_work_acks_on_success() {
    for url in stores() {
        let q = unique("ok");
        let out = run(&url, &["queue", "push", &q, "hello", "--group", "t1"]).await;
        assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
        let id: u64 = text(&out.stdout).parse().expect("a message id");
        let script = "read body; echo \"$body $COORD_MESSAGE_ID $COORD_ATTEMPT $COORD_GROUP $COORD_FENCING_TOKEN\"";
        let out = run(&url, &["queue", "work", &q, "--", "sh", "-c", script]).await;
        assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
        let line = text(&out.stdout);
        let parts: Vec<&str> = line.split(' ').collect();
        assert_eq!(
            parts[..4],
            ["hello", &id.to_string(), "1", "t1"],
            "{url}: {line}"
        );
        parts[4].parse::<u64>().expect("a numeric fencing token");
        let s = stats(&url, &q).await;
        assert_eq!(
            (&s["ready"], &s["in_flight"], &s["dead"]),
            (&0.into(), &0.into(), &0.into()),
            "{url}: {s}"
        );
        let out = run(&url, &["queue", "work", &q, "--", "echo", "ran"]).await;
        assert_eq!(out.status.code(), Some(BUSY), "{url}: {out:?}");
        assert!(text(&out.stdout).is_empty(), "{url}: the command ran");
    }
}

/// A failing command's exit code is passed through and its message given
/// back (attempt 2 next time); with `--max-deliveries 2` the third take
/// finds it dead-lettered: `peek --dead` shows it, `redrive` brings it back,
/// `purge --yes` empties the queue. A repeated dedup id prints `duplicate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_redeliver_then_dead_letter_and_redrive() {
    for url in stores() {
        let q = unique("fail");
        let out = run(&url, &["queue", "push", &q, "job", "--dedup-id", "j1"]).await;
        let id = text(&out.stdout);
        let out = run(&url, &["queue", "push", &q, "job", "--dedup-id", "j1"]).await;
        assert_eq!(text(&out.stdout), format!("{id} duplicate"), "{url}");
        for attempt in 1..=2 {
            let script = format!("test \"$COORD_ATTEMPT\" = {attempt} && exit 3; exit 9");
            let out = run(
                &url,
                &[
                    "queue",
                    "work",
                    &q,
                    "--max-deliveries",
                    "2",
                    "--",
                    "sh",
                    "-c",
                    &script,
                ],
            )
            .await;
            assert_eq!(
                out.status.code(),
                Some(3),
                "{url}: attempt {attempt}: {out:?}"
            );
        }
        let out = run(
            &url,
            &[
                "queue",
                "work",
                &q,
                "--max-deliveries",
                "2",
                "--",
                "echo",
                "ran",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(BUSY), "{url}: {out:?}");
        assert_eq!(stats(&url, &q).await["dead"], 1, "{url}");
        let out = run(&url, &["queue", "peek", &q, "--dead", "--json"]).await;
        let m: serde_json::Value = serde_json::from_slice(&out.stdout).expect("peek JSON");
        assert_eq!(m["id"].to_string(), id, "{url}: {m}");
        assert_eq!(
            (&m["attempts"], &m["payload"]),
            (&2.into(), &"job".into()),
            "{url}: {m}"
        );
        let out = run(&url, &["queue", "redrive", &q]).await;
        assert_eq!(text(&out.stdout), "1", "{url}: {out:?}");
        let s = stats(&url, &q).await;
        assert_eq!(
            (&s["ready"], &s["dead"]),
            (&1.into(), &0.into()),
            "{url}: {s}"
        );
        let out = run(&url, &["queue", "purge", &q]).await;
        assert_ne!(
            out.status.code(),
            Some(0),
            "{url}: purged without confirmation"
        );
        let out = run(&url, &["queue", "purge", &q, "--yes"]).await;
        assert_eq!(text(&out.stdout), "1", "{url}: {out:?}");
        assert_eq!(stats(&url, &q).await["ready"], 0, "{url}");
    }
}

/// A binary payload read from stdin reaches the worker's stdin byte for
/// byte, and `peek --json` shows it as hex.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_payloads_from_stdin() {
    for url in stores() {
        let q = unique("bin");
        let bytes: Vec<u8> = vec![0, 1, 2, 255, b'\n', 0, 128];
        let mut child = coord(&url)
            .args(["queue", "push", &q])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&bytes).await.unwrap();
        drop(stdin);
        let out = child.wait_with_output().await.unwrap();
        assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
        let out = run(&url, &["queue", "peek", &q, "--json"]).await;
        let m: serde_json::Value = serde_json::from_slice(&out.stdout).expect("peek JSON");
        assert_eq!(m["payload_hex"], "000102ff0a0080", "{url}: {m}");
        let out = run(&url, &["queue", "work", &q, "--", "od", "-An", "-tx1"]).await;
        assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
        let hex: String = text(&out.stdout).split_whitespace().collect();
        assert_eq!(hex, "000102ff0a0080", "{url}");
    }
}

/// The queue is purged under a running worker: the watchdog's next
/// extension finds the delivery gone, the command gets SIGTERM and the tool
/// exits 76.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_delivery_stops_the_command() {
    for url in stores() {
        let q = unique("lost");
        run(&url, &["queue", "push", &q, "long job"]).await;
        let mut child = coord(&url)
            .args([
                "queue",
                "work",
                &q,
                "--visibility",
                "2s",
                "--grace",
                "1s",
                "--",
                "sh",
                "-c",
                "echo started; exec sleep 30",
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
        let out = run(&url, &["queue", "purge", &q, "--yes"]).await;
        assert_eq!(text(&out.stdout), "1", "{url}: {out:?}");
        let purged = Instant::now();
        let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
            .await
            .expect("the command was not stopped")
            .unwrap();
        assert_eq!(status.code(), Some(LOST), "{url}");
        assert!(
            purged.elapsed() < Duration::from_secs(8),
            "{url}: stopped after {:?}",
            purged.elapsed()
        );
    }
}
