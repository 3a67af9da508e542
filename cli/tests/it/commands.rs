//! The `coord` binary run as a user runs it, against real Redis, PostgreSQL
//! and etcd servers started by the test kit.

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

/// `release --force` also ends every grant of a semaphore and of a
/// read-write lock (asking first, like a lock's): the holders' guards learn
/// it, and the name is free at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_force_ends_semaphores_and_read_write_locks() {
    for url in stores() {
        let c = coord::connect(&url).await.unwrap();
        let ttl = Duration::from_secs(30);
        let sem = unique("force-sem");
        let permit = c
            .semaphores()
            .unwrap()
            .try_acquire(&sem, 1, ttl)
            .await
            .unwrap()
            .expect("free");
        let out = run(&url, &["release", "--force", "semaphore", &sem]).await;
        assert_eq!(out.status.code(), Some(USAGE), "{url}: {out:?}");
        let out = run(&url, &["release", "--force", "semaphore", &sem, "--yes"]).await;
        assert_eq!(text(&out.stdout), "released", "{url}: {out:?}");
        let again = c
            .semaphores()
            .unwrap()
            .try_acquire(&sem, 1, ttl)
            .await
            .unwrap();
        assert!(again.is_some(), "{url}: the semaphore is still taken");
        drop((permit, again));

        let rw = unique("force-rw");
        let writer = c
            .rw_locks()
            .unwrap()
            .try_write(&rw, ttl)
            .await
            .unwrap()
            .expect("free");
        let out = run(&url, &["release", "--force", "rwlock", &rw, "--yes"]).await;
        assert_eq!(text(&out.stdout), "released", "{url}: {out:?}");
        let out = run(&url, &["release", "--force", "rwlock", &rw, "--yes"]).await;
        assert_eq!(text(&out.stdout), "not held", "{url}: {out:?}");
        let reader = c.rw_locks().unwrap().try_read(&rw, ttl).await.unwrap();
        assert!(
            reader.is_some(),
            "{url}: the read-write lock is still taken"
        );
        drop((writer, reader));
    }
}

/// `release --force lease|election` ends a lease or a leadership held by
/// a library client: the holder's renewal is refused, the name is free (a
/// waiting candidate is elected with a higher term), and a second run
/// finds nothing held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_force_ends_leases_and_leaderships() {
    for url in stores() {
        let c = coord::connect(&url).await.unwrap();
        let ttl = Duration::from_secs(30);
        let lease = unique("force-lease");
        let held = c
            .leases()
            .unwrap()
            .grant(&lease, ttl)
            .await
            .unwrap()
            .expect("free");
        let out = run(&url, &["release", "--force", "lease", &lease, "--yes"]).await;
        assert_eq!(text(&out.stdout), "released", "{url}: {out:?}");
        let out = run(&url, &["release", "--force", "lease", &lease, "--yes"]).await;
        assert_eq!(text(&out.stdout), "not held", "{url}: {out:?}");
        assert!(
            held.renew(ttl).await.is_err(),
            "{url}: the lease still renews"
        );
        assert!(
            !c.leases().unwrap().is_alive(&lease).await.unwrap(),
            "{url}"
        );

        let election = unique("force-election");
        let e = c.elections().unwrap();
        let leader = e
            .campaign(&election, "a", ttl, Duration::ZERO)
            .await
            .unwrap();
        let e2 = e.clone();
        let name = election.clone();
        let next =
            tokio::spawn(
                async move { e2.campaign(&name, "b", ttl, Duration::from_secs(30)).await },
            );
        let out = run(
            &url,
            &["release", "--force", "election", &election, "--yes"],
        )
        .await;
        assert_eq!(text(&out.stdout), "released", "{url}: {out:?}");
        let next = tokio::time::timeout(Duration::from_secs(5), next)
            .await
            .expect("the waiting candidate is elected")
            .unwrap()
            .unwrap();
        assert!(next.term() > leader.term(), "{url}");
        assert!(
            leader.renew(ttl).await.is_err(),
            "{url}: the old leader still renews"
        );
        next.resign().await.unwrap();
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

/// The store can be given with `--url` instead of `COORD_URL`, and the
/// flag wins over the variable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_url_flag_instead_of_coord_url() {
    let bin = env!("CARGO_BIN_EXE_coord");
    for url in stores() {
        let resource = unique("flag");
        let fence = |env: Option<&str>| {
            let mut c = tokio::process::Command::new(bin);
            c.args(["--url", &url, "fence", "next", &resource])
                .stdin(Stdio::null())
                .kill_on_drop(true);
            match env {
                Some(v) => c.env("COORD_URL", v),
                None => c.env_remove("COORD_URL"),
            };
            async move {
                tokio::time::timeout(Duration::from_secs(60), c.output())
                    .await
                    .unwrap()
                    .unwrap()
            }
        };
        let a = fence(None).await;
        assert_eq!(a.status.code(), Some(0), "{url}: {a:?}");
        let b = fence(Some("bogus://nowhere")).await;
        assert_eq!(b.status.code(), Some(0), "{url}: {b:?}");
        let (a, b): (u64, u64) = (
            text(&a.stdout).parse().unwrap(),
            text(&b.stdout).parse().unwrap(),
        );
        assert!(b > a, "{url}: {a} then {b}");
        // The same store as the library's: the token is above both.
        let c = coord::connect(&url).await.unwrap();
        assert!(c.fencing().unwrap().next(&resource).await.unwrap().0 > b);
    }
}

/// Without `--url` or `COORD_URL` every command is refused (exit 64,
/// nothing run) with a message naming both: `memory://` coordinates
/// nothing across processes, so it is used only when asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_store_every_command_is_refused_naming_coord_url() {
    let bin = env!("CARGO_BIN_EXE_coord");
    let run = |args: Vec<String>| {
        let mut c = tokio::process::Command::new(bin);
        c.args(args)
            .env_remove("COORD_URL")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        async move {
            tokio::time::timeout(Duration::from_secs(60), c.output())
                .await
                .unwrap()
                .unwrap()
        }
    };
    let words = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
    let marker = std::env::temp_dir().join(unique("no-store-ran"));
    let mut lock = words("lock n -- sh -c");
    lock.push(format!("touch {}", marker.display()));
    let commands = [
        words("fence next r"),
        lock,
        words("leader e"),
        words("limit k --limit 1 --window 1s"),
        words("queue push q"),
    ];
    for args in commands {
        let out = run(args.clone()).await;
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        assert!(
            err.contains("COORD_URL") && err.contains("--url") && err.contains("memory://"),
            "{args:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: {out:?}");
    }
    assert!(!marker.exists(), "a refused `coord lock` ran its command");
    // Asked for, memory:// works.
    let out = run(words("--url memory:// fence next r")).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// `coord release --force lock NAME` asks on the terminal. Answered `y`
/// there (a pseudo-terminal as stdin) it releases; `y` piped on stdin
/// (not a terminal) is not taken as an answer: refused, exit 64, saying
/// to pass --yes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_force_reads_its_answer_from_the_terminal() {
    use std::io::Write;
    use tokio::io::AsyncWriteExt;
    for url in stores() {
        let name = unique("confirm");
        let c = coord::connect(&url).await.unwrap();
        let held = c
            .locks()
            .unwrap()
            .try_acquire(&name, Duration::from_secs(30))
            .await
            .unwrap()
            .expect("free");
        // "y" through a pipe.
        let mut child = coord(&url)
            .args(["release", "--force", "lock", &name])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"y\n").await.unwrap();
        drop(stdin);
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(out.status.code(), Some(USAGE), "{url}: {out:?}");
        assert!(text(&out.stderr).contains("pass --yes"), "{url}: {out:?}");
        let info = c.locks().unwrap().inspect(&name).await.unwrap();
        assert_eq!(info.holders.len(), 1, "{url}: released on a piped `y`");

        // On a terminal: "n" does not release, "y" does.
        for (answer, expect) in [("n\n", None), ("y\n", Some("released"))] {
            let pty = nix::pty::openpty(None, None).unwrap();
            let mut master = std::fs::File::from(pty.master);
            let child = coord(&url)
                .args(["release", "--force", "lock", &name])
                .stdin(Stdio::from(pty.slave))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            master.write_all(answer.as_bytes()).unwrap();
            let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
                .await
                .expect("no answer read from the terminal")
                .unwrap();
            assert!(
                text(&out.stderr).contains(&format!("Force-release lock `{name}`")),
                "{url}: not asked: {out:?}"
            );
            match expect {
                None => {
                    assert_eq!(out.status.code(), Some(USAGE), "{url}: {out:?}");
                    assert!(held.is_valid(), "{url}");
                    let info = c.locks().unwrap().inspect(&name).await.unwrap();
                    assert_eq!(info.holders.len(), 1, "{url}: released on `n`");
                }
                Some(said) => {
                    assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
                    assert_eq!(text(&out.stdout), said, "{url}: {out:?}");
                }
            }
            drop(master);
        }
        let again = c
            .locks()
            .unwrap()
            .try_acquire(&name, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(again.is_some(), "{url}: the lock is still held");
    }
}

/// Options the stores do not take are refused before anything runs, exit
/// 64, naming the option: etcd's `session_ttl` (coord-etcd has no session
/// lease: the error says so), a Redis TLS file that is not there (its path
/// named), a misspelt libpq option.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_options_a_store_does_not_take_exit_64_naming_them() {
    let etcd = conformance::testkit::etcd::shared().url();
    let sep = |u: &str| if u.contains('?') { '&' } else { '?' };
    for (url, says) in [
        (
            format!("{etcd}{}session_ttl=10s&prefix=/coord/", sep(&etcd)),
            vec!["`session_ttl`", "no session lease"],
        ),
        (
            "rediss://127.0.0.1:1?tls_ca_file=/nonexistent/ca.pem".to_string(),
            vec!["`tls_ca_file`", "/nonexistent/ca.pem"],
        ),
        (
            format!(
                "{}&sslmod=require",
                conformance::testkit::postgres::cluster().url()
            ),
            vec!["option `sslmod`"],
        ),
    ] {
        let out = run(&url, &["lock", "x", "--", "echo", "ran"]).await;
        assert_eq!(out.status.code(), Some(USAGE), "{url}: {out:?}");
        assert!(text(&out.stdout).is_empty(), "{url}: the command ran");
        let err = text(&out.stderr);
        for s in says {
            assert!(err.contains(s), "{url}: no {s} in: {err}");
        }
    }
}

/// `coord health --json` names the store, its server version and what it
/// offers on every store; a store that cannot be reached is exit 69 with
/// what to check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_every_store_and_an_unreachable_one_is_69() {
    for (url, backend, server) in [
        (stores()[0].clone(), "redis", "redis "),
        (stores()[1].clone(), "postgres", "PostgreSQL "),
        (stores()[2].clone(), "etcd", "etcd "),
        ("memory://".to_string(), "memory", "coord-memory "),
    ] {
        let out = run(&url, &["health", "--json"]).await;
        assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
        let v: serde_json::Value = serde_json::from_str(&text(&out.stdout)).expect("JSON");
        assert_eq!(v["backend"], backend, "{v}");
        assert!(
            v["server"].as_str().is_some_and(|s| s.starts_with(server)),
            "{url}: {v}"
        );
        assert!(
            v["round_trip_ms"].as_f64().is_some_and(|ms| ms >= 0.0),
            "{v}"
        );
        let offers: Vec<&str> = v["primitives"]
            .as_array()
            .expect("primitives")
            .iter()
            .filter_map(|p| p.as_str())
            .collect();
        assert!(
            offers.contains(&"locks") && offers.contains(&"queues"),
            "{v}"
        );
        let plain = run(&url, &["health"]).await;
        assert_eq!(plain.status.code(), Some(0), "{url}: {plain:?}");
        assert!(text(&plain.stdout).starts_with("ok: "), "{plain:?}");
    }
    let out = run("redis://127.0.0.1:1/?connect_timeout=500ms", &["health"]).await;
    assert_eq!(out.status.code(), Some(UNAVAILABLE), "{out:?}");
    assert!(text(&out.stderr).contains("reachable"), "{out:?}");
}

/// `--help` never prints the store's URL from COORD_URL (it may hold a
/// password) nor COORD_UI_TOKEN: not for coord, not for a command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_does_not_print_the_url_or_the_token_from_the_environment() {
    let secret = "hunter2-url-password";
    let token = "hunter2-ui-token-0123456789";
    for args in [
        &["--help"][..],
        &["-h"],
        &["ui", "--help"],
        &["lock", "--help"],
        &["help", "ls"],
    ] {
        let out = tokio::time::timeout(
            Duration::from_secs(30),
            coord(&format!("redis://:{secret}@127.0.0.1:1/"))
                .args(args)
                .env("COORD_UI_TOKEN", token)
                .output(),
        )
        .await
        .expect("coord --help did not finish")
        .unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        let printed = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(printed.contains("COORD_URL"), "{args:?}: {printed}");
        assert!(
            !printed.contains(secret) && !printed.contains(token),
            "{args:?} prints a secret: {printed}"
        );
    }
}
