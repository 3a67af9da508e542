//! `coord release --force`: it ends semaphores and read-write locks,
//! leases and leaderships, and reads its answer from the terminal.

use crate::common;
use common::*;
use std::process::Stdio;
use std::time::Duration;

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
