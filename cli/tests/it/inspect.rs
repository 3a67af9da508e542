//! `coord inspect` run as a user runs it, against real Redis, PostgreSQL
//! and etcd servers started by the test kit: the holder of a lock taken by
//! `coord lock` with its metadata (host, pid, since, command, `--meta`),
//! semaphores, leases, elections and queues.

use crate::common;
use common::*;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

async fn inspect(url: &str, kind: &str, name: &str) -> Value {
    let out = run(url, &["inspect", kind, name, "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
    serde_json::from_slice(&out.stdout).expect("inspect JSON")
}

/// While `coord lock` runs a command, `coord inspect lock` shows its holder:
/// the token the command got, a remaining time within the TTL, and the
/// metadata (host, pid, since_ms, command, and the `--meta` keys). Once it
/// ended, the lock shows no holder; plain output says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_holder_of_a_cli_lock_with_its_metadata() {
    for url in stores() {
        let name = unique("lock");
        let mut child = coord(&url)
            .args([
                "lock",
                &name,
                "--ttl",
                "20s",
                "--meta",
                r#"{"why":"backfill","ticket":42}"#,
                "--",
                "sh",
                "-c",
                "echo $COORD_FENCING_TOKEN; exec sleep 30",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let token: u64 = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("the command did not start")
            .unwrap()
            .expect("a token")
            .parse()
            .expect("a numeric token");
        let v = inspect(&url, "lock", &name).await;
        let h = &v["holders"][0];
        assert_eq!(h["fencing_token"], token, "{url}: {v}");
        let m = &h["metadata"];
        assert_eq!(
            (&m["why"], &m["ticket"]),
            (&json!("backfill"), &json!(42)),
            "{url}: {v}"
        );
        assert_eq!(m["command"], "sh", "{url}: {v}");
        assert!(m["pid"].as_u64().is_some_and(|p| p > 0), "{url}: {v}");
        assert!(m["since_ms"].as_u64().is_some_and(|p| p > 0), "{url}: {v}");
        assert!(m["host"].as_str().is_some(), "{url}: {v}");
        if let Some(ms) = h["remaining_ms"].as_u64() {
            assert!(ms <= 20_000, "{url}: {v}");
        }
        assert!(
            h["owner_id"].as_str().is_some_and(|s| s.len() == 16),
            "{url}: {v}"
        );
        let out = run(&url, &["inspect", "lock", &name]).await;
        let plain = String::from_utf8_lossy(&out.stdout);
        assert!(plain.contains(&format!("token {token}")), "{url}: {plain}");
        assert!(plain.contains("backfill"), "{url}: {plain}");
        child.start_kill().unwrap();
        child.wait().await.unwrap();
        // The killed `coord lock` released nothing; force-release it.
        run(&url, &["release", "--force", "lock", &name, "--yes"]).await;
        let v = inspect(&url, "lock", &name).await;
        assert_eq!(v["holders"], json!([]), "{url}: {v}");
        let out = run(&url, &["inspect", "lock", &name]).await;
        assert!(String::from_utf8_lossy(&out.stdout).contains("not held"));
    }
}

/// Semaphore grants (each with its permits), a lease, an election's leader
/// (candidate, term, owner id, remaining time) and a queue's counts, as
/// library clients left them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_semaphores_leases_elections_and_queues() {
    for url in stores() {
        let c = coord::connect(&url).await.unwrap();
        let ttl = Duration::from_secs(20);
        let sem = unique("sem");
        let s = c.semaphores().unwrap();
        let p = s
            .acquire_with_metadata(
                &sem,
                coord::PermitOptions::new(4, ttl).permits(3),
                &json!({"who": "batch"}),
            )
            .await
            .unwrap();
        let v = inspect(&url, "semaphore", &sem).await;
        assert_eq!(v["holders"][0]["permits"], 3, "{url}: {v}");
        assert_eq!(v["holders"][0]["metadata"]["who"], "batch", "{url}: {v}");
        assert_eq!(v["holders"][0]["owner_id"], p.owner_id(), "{url}: {v}");
        p.release().await.unwrap();

        let lease = unique("lease");
        let l = c
            .leases()
            .unwrap()
            .grant_with_metadata(&lease, ttl, &json!({"worker": 7}))
            .await
            .unwrap()
            .unwrap();
        let v = inspect(&url, "lease", &lease).await;
        assert_eq!(v["holders"][0]["metadata"]["worker"], 7, "{url}: {v}");
        assert_eq!(
            v["holders"][0]["fencing_token"],
            l.fencing_token().0,
            "{url}: {v}"
        );
        l.revoke().await.unwrap();

        let election = unique("election");
        let leader = c
            .elections()
            .unwrap()
            .campaign(&election, "alpha", ttl, Duration::from_secs(5))
            .await
            .unwrap();
        let v = inspect(&url, "election", &election).await;
        assert_eq!(
            (&v["leader"], &v["term"]),
            (&json!("alpha"), &json!(leader.term().0)),
            "{url}: {v}"
        );
        // The leader's owner id (its fingerprint, never the owner token)
        // and its remaining time, which every store here can tell.
        assert_eq!(v["owner_id"], leader.owner_id(), "{url}: {v}");
        let left = v["remaining_ms"]
            .as_u64()
            .unwrap_or_else(|| panic!("{url}: {v}"));
        assert!(left <= 20_000 && left > 10_000, "{url}: {v}");
        let text =
            String::from_utf8_lossy(&run(&url, &["inspect", "election", &election]).await.stdout)
                .into_owned();
        assert!(
            text.contains("leader alpha")
                && text.contains(&format!("term {}", leader.term().0))
                && text.contains(&format!("owner {}", leader.owner_id()))
                && text.contains("remaining "),
            "{url}: {text}"
        );
        leader.resign().await.unwrap();
        let v = inspect(&url, "election", &election).await;
        assert_eq!(v["leader"], Value::Null, "{url}: {v}");
        assert_eq!(v["owner_id"], Value::Null, "{url}: {v}");

        let queue = unique("queue");
        let q = c.queues().unwrap();
        q.push(&queue, b"one").await.unwrap();
        q.push(&queue, b"two").await.unwrap();
        let d = q.pop(&queue, ttl, Duration::ZERO).await.unwrap().unwrap();
        let v = inspect(&url, "queue", &queue).await;
        assert_eq!(
            (&v["ready"], &v["in_flight"]),
            (&json!(1), &json!(1)),
            "{url}: {v}"
        );
        assert_eq!(v["oldest"].as_array().map(Vec::len), Some(2), "{url}: {v}");
        d.ack().await.unwrap();
        q.purge(&queue).await.unwrap();
    }
}

/// `coord inspect rwlock` shows the readers of a read-write lock, then its
/// writer, with owner ids and tokens as the library's guards have them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_a_read_write_locks_readers_then_its_writer() {
    for url in stores() {
        let c = coord::connect(&url).await.unwrap();
        let rw = c.rw_locks().unwrap();
        let name = unique("rw");
        let ttl = Duration::from_secs(20);
        let r1 = rw.read(&name, ttl, Duration::ZERO).await.unwrap();
        let r2 = rw.read(&name, ttl, Duration::ZERO).await.unwrap();
        let v = inspect(&url, "rwlock", &name).await;
        assert_eq!(v["writer"], Value::Null, "{url}: {v}");
        let mut readers: Vec<String> = v["readers"]
            .as_array()
            .unwrap_or_else(|| panic!("{url}: {v}"))
            .iter()
            .map(|r| r["owner_id"].as_str().unwrap().to_string())
            .collect();
        readers.sort();
        let mut want = vec![r1.owner_id(), r2.owner_id()];
        want.sort();
        assert_eq!(readers, want, "{url}: {v}");
        r1.release().await.unwrap();
        r2.release().await.unwrap();
        let w = rw.write(&name, ttl, Duration::ZERO).await.unwrap();
        let v = inspect(&url, "rwlock", &name).await;
        assert_eq!(v["writer"]["owner_id"], w.owner_id(), "{url}: {v}");
        assert_eq!(
            v["writer"]["fencing_token"],
            w.fencing_token().0,
            "{url}: {v}"
        );
        assert_eq!(v["readers"].as_array().map(Vec::len), Some(0), "{url}: {v}");
        let text = String::from_utf8_lossy(&run(&url, &["inspect", "rwlock", &name]).await.stdout)
            .into_owned();
        assert!(
            text.starts_with(&format!("written by {}", w.owner_id())),
            "{url}: {text}"
        );
        w.release().await.unwrap();
        let text = String::from_utf8_lossy(&run(&url, &["inspect", "rwlock", &name]).await.stdout)
            .into_owned();
        assert!(text.starts_with("not held\n"), "{url}: {text}");
    }
}

/// `coord ls --prefix P` lists what library clients hold under P on every
/// store, each entry as `inspect --json` shows it (a lock with its
/// metadata, a semaphore grant, a queue's counts) and nothing beside the
/// prefix; `coord ls lock` after the release lists nothing; the plain
/// output names each; a limit of 0 is a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_lists_what_is_held_under_a_prefix() {
    for url in stores() {
        let c = coord::connect(&url).await.unwrap();
        let ttl = Duration::from_secs(20);
        let p = format!("{}/", unique("ls"));
        let locks = c.locks().unwrap();
        let meta = json!({"job": "nightly"});
        let lock = locks
            .acquire_with_metadata(&format!("{p}a"), coord::LockOptions::new(ttl), &meta)
            .await
            .unwrap();
        let beside = format!("{}-beside", p.trim_end_matches('/'));
        let beside = locks.try_acquire(&beside, ttl).await.unwrap();
        let permit = c
            .semaphores()
            .unwrap()
            .try_acquire(&format!("{p}s"), 2, ttl)
            .await
            .unwrap()
            .expect("a free permit");
        let out = run(&url, &["queue", "push", &format!("{p}q"), "job"]).await;
        assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
        let out = run(&url, &["ls", "--prefix", &p, "--json"]).await;
        assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
        let v: Value = serde_json::from_slice(&out.stdout).expect("ls JSON");
        let entries: Vec<(String, String)> = v
            .as_array()
            .expect("an array")
            .iter()
            .map(|e| {
                (
                    e["kind"].as_str().unwrap().into(),
                    e["name"].as_str().unwrap().into(),
                )
            })
            .collect();
        let want = [
            ("lock", format!("{p}a")),
            ("semaphore", format!("{p}s")),
            ("queue", format!("{p}q")),
        ];
        let want: Vec<(String, String)> = want.into_iter().map(|(k, n)| (k.into(), n)).collect();
        assert_eq!(entries, want, "{url}: {v}");
        assert_eq!(
            v[0]["holders"][0]["metadata"]["job"], "nightly",
            "{url}: {v}"
        );
        assert_eq!(
            v[0]["holders"][0]["owner_id"],
            lock.owner_id(),
            "{url}: {v}"
        );
        assert_eq!(v[1]["holders"][0]["permits"], 1, "{url}: {v}");
        assert_eq!(v[2]["ready"], 1, "{url}: {v}");
        let plain = run(&url, &["ls", "--prefix", &p]).await;
        let plain = String::from_utf8_lossy(&plain.stdout).into_owned();
        assert!(
            plain.contains(&format!("lock {p}a\n  held by ")),
            "{url}: {plain}"
        );
        assert!(
            plain.contains(&format!("queue {p}q\n  ready 1")),
            "{url}: {plain}"
        );
        lock.release().await.unwrap();
        let out = run(&url, &["ls", "lock", "--prefix", &p, "--json"]).await;
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "[]",
            "{url}: {out:?}"
        );
        let out = run(&url, &["ls", "--limit", "0"]).await;
        assert_eq!(out.status.code(), Some(USAGE), "{url}: {out:?}");
        permit.release().await.unwrap();
        if let Some(b) = beside {
            b.release().await.unwrap();
        }
        c.queues().unwrap().purge(&format!("{p}q")).await.unwrap();
    }
}
