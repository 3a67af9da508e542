//! Wake-ups are published only when someone waits, and no waiter is ever
//! left to its poll interval: a release nobody waits for sends no NOTIFY
//! (each one takes a database-wide lock at commit, which serializes every
//! notifying commit and its WAL flush), and chains of waiters in one and
//! in several clients are each woken by NOTIFY.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use conformance::testkit::postgres::{self, cluster};
use coord_postgres::tokio_postgres::{self, AsyncMessage, NoTls};
use futures::StreamExt;

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// 20 uncontended lock cycles send no notification: a marker sent after
/// them is the first payload a LISTEN session on the channel receives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_nobody_waits_for_sends_no_notification() {
    let schema = unique("wk");
    let url = format!("{}&coord_schema={schema}", cluster().url());
    let coord = coord_postgres::connect(&url).await.unwrap();
    assert!(coord.capabilities().notifications);
    let locks = coord.locks().unwrap();

    let (client, mut conn) = tokio_postgres::connect(&cluster().url(), NoTls)
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            if let AsyncMessage::Notification(n) = m {
                let _ = tx.send(n.payload().to_string());
            }
        }
    });
    let channel = format!("{schema}_wake");
    client
        .batch_execute(&format!("LISTEN \"{channel}\""))
        .await
        .unwrap();

    for i in 0..20 {
        let g = locks
            .try_acquire(&format!("cycle-{i}"), Duration::from_secs(10))
            .await
            .unwrap()
            .expect("free");
        g.release().await.unwrap();
    }
    client
        .query("SELECT pg_notify($1, 'marker')", &[&channel])
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the marker arrives")
        .expect("a payload");
    assert_eq!(first, "marker", "a release nobody waited for notified");
}

/// One holder and 12 waiters on one lock, 8 of them in the holder's client
/// and 4 in another; each waiter, once in, holds 20 ms and releases. The
/// poll interval is a minute, so every waiter gets in within the 30 s
/// limit only if every hand-over is announced by NOTIFY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chains_of_waiters_are_each_woken_by_notify() {
    let poll = Duration::from_secs(60);
    let a = coord_postgres::connect(&cluster().url())
        .await
        .unwrap()
        .with_poll_interval(poll);
    let b = coord_postgres::connect(&cluster().url())
        .await
        .unwrap()
        .with_poll_interval(poll);
    let name = unique("chain");
    let ttl = Duration::from_secs(120);
    let holder = a
        .locks()
        .unwrap()
        .try_acquire(&name, ttl)
        .await
        .unwrap()
        .expect("free");
    let mut waiters = Vec::new();
    for i in 0..12 {
        let locks = if i % 3 == 2 { &b } else { &a }.locks().unwrap();
        let name = name.clone();
        waiters.push(tokio::spawn(async move {
            let g = locks
                .acquire(&name, ttl, Duration::from_secs(30))
                .await
                .unwrap_or_else(|e| panic!("waiter {i} was not woken: {e}"));
            tokio::time::sleep(Duration::from_millis(20)).await;
            g.release().await.unwrap();
        }));
    }
    // Every waiter is waiting (subscribed) before the first release.
    tokio::time::sleep(Duration::from_millis(500)).await;
    holder.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
}

/// A release wakes a waiter of the same client at once, without waiting
/// for its own NOTIFY to come back through the LISTEN connection (one
/// server process and one client task fewer on the hand-over's path):
/// with that connection's server process stopped (SIGSTOP), so no NOTIFY
/// reaches the client, a waiter in the releasing client still gets in
/// promptly, not after the 60 s poll interval or the holder's 30 s TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_of_its_own_client_without_the_notify() {
    let schema = unique("wkl");
    let url = format!("{}&coord_schema={schema}", cluster().url());
    let a = coord_postgres::connect(&url)
        .await
        .unwrap()
        .with_poll_interval(Duration::from_secs(60));
    let locks = a.locks().unwrap();
    let name = unique("own");
    let ttl = Duration::from_secs(30);
    let holder = locks.try_acquire(&name, ttl).await.unwrap().expect("free");
    let waiter = {
        let (locks, name) = (locks.clone(), name.clone());
        tokio::spawn(async move {
            let g = locks.acquire(&name, ttl, Duration::from_secs(20)).await;
            (std::time::Instant::now(), g)
        })
    };
    // The waiter has been refused and waits.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (admin, conn) = tokio_postgres::connect(&cluster().url(), NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let listen = format!("LISTEN \"{schema}_wake\"");
    let pid: i32 = admin
        .query_one(
            "SELECT pid FROM pg_stat_activity WHERE query = $1",
            &[&listen],
        )
        .await
        .expect("the client's LISTEN session")
        .get(0);
    /// Stops a server process until dropped (also when the test fails).
    struct Stopped(u32);
    impl Drop for Stopped {
        fn drop(&mut self) {
            postgres::signal(self.0, "CONT");
        }
    }
    let pid = pid as u32;
    assert!(postgres::signal(pid, "STOP"), "kill -STOP {pid}");
    let stopped = Stopped(pid);
    let released = std::time::Instant::now();
    holder.release().await.unwrap();
    let (woke, got) = waiter.await.unwrap();
    drop(stopped);
    let g = got.expect("the waiter gets the lock");
    let took = woke - released;
    assert!(
        took < Duration::from_secs(5),
        "the waiter got in {took:?} after the release"
    );
    g.release().await.unwrap();
}
