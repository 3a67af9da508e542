//! Elections, limits, fencing tokens and barriers from the command line:
//! `elect` runs the command as leader, `leader --watch` prints each
//! change, a spent limit exits 75, tokens rise, and two processes meet at
//! a barrier.

use crate::common;
use common::*;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

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

/// `coord leader NAME --watch` prints the current state, then a line per
/// change of leader (elected, resigned, another elected, terms rising),
/// until it is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_watch_prints_each_change() {
    for url in stores() {
        let name = unique("watch");
        let mut child = coord(&url)
            .args(["leader", &name, "--watch"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(20), lines.next_line())
                .await
                .expect("no change printed within 20 s")
                .unwrap()
                .expect("the watch ended")
        };
        assert_eq!(next().await, "no leader", "{url}");
        let c = coord::connect(&url).await.unwrap();
        let elections = c.elections().unwrap();
        let alpha = elections
            .try_campaign(&name, "alpha", Duration::from_secs(30))
            .await
            .unwrap()
            .expect("elected");
        let t1 = alpha.term().0;
        assert_eq!(next().await, format!("alpha (term {t1})"), "{url}");
        alpha.resign().await.unwrap();
        assert_eq!(next().await, "no leader", "{url}");
        let beta = elections
            .try_campaign(&name, "beta", Duration::from_secs(30))
            .await
            .unwrap()
            .expect("elected");
        let t2 = beta.term().0;
        assert!(t2 > t1, "{url}: term {t2} after {t1}");
        assert_eq!(next().await, format!("beta (term {t2})"), "{url}");
        // Still watching: it has not exited by itself.
        assert!(child.try_wait().unwrap().is_none(), "{url}");
        child.start_kill().unwrap();
        tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .expect("not stopped")
            .unwrap();
        beta.resign().await.unwrap();
    }
}
