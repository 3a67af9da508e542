//! Wake-ups are published only when someone waits, and no waiter is ever
//! left to its poll interval: a release or a queue step nobody waits for
//! sends no NOTIFY
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

/// A LISTEN session on the wake-up channel of `schema`: its client, the
/// channel, and the payloads it receives.
async fn listen(
    schema: &str,
) -> (
    tokio_postgres::Client,
    String,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let (client, mut conn) = tokio_postgres::connect(&cluster().url(), NoTls)
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
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
    (client, channel, rx)
}

/// Send a marker on `channel` and return the payloads `rx` gets before
/// it, but the clients' listeners' probes of their own connections.
async fn payloads_before_a_marker(
    client: &tokio_postgres::Client,
    channel: &str,
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
) -> Vec<String> {
    client
        .query("SELECT pg_notify($1, 'marker')", &[&channel])
        .await
        .unwrap();
    let mut before = Vec::new();
    loop {
        let p = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("the marker arrives")
            .expect("a payload");
        if p == "marker" {
            return before;
        }
        if !p.starts_with("probe:") {
            before.push(p);
        }
    }
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
    let (client, channel, mut rx) = listen(&schema).await;

    for i in 0..20 {
        let g = locks
            .try_acquire(&format!("cycle-{i}"), Duration::from_secs(10))
            .await
            .unwrap()
            .expect("free");
        g.release().await.unwrap();
    }
    let sent = payloads_before_a_marker(&client, &channel, &mut rx).await;
    assert!(
        sent.is_empty(),
        "a release nobody waited for notified: {sent:?}"
    );
}

/// Work queue steps on a queue nobody waits on send no notification (20
/// pushes, pops and acks, a nack, a redrive); once a consumer of another
/// client waits on the queue, a push wakes it by NOTIFY (its poll
/// interval is a minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_steps_notify_only_while_somebody_waits() {
    let schema = unique("wq");
    let url = format!("{}&coord_schema={schema}", cluster().url());
    let coord = coord_postgres::connect(&url).await.unwrap();
    let queues = coord.queues().unwrap();
    let (client, channel, mut rx) = listen(&schema).await;
    let vis = Duration::from_secs(30);
    for i in 0..20 {
        queues.push("jobs", format!("m{i}")).await.unwrap();
        let d = queues.pop("jobs", vis, Duration::ZERO).await.unwrap();
        d.expect("a message").ack().await.unwrap();
    }
    queues.push("jobs", "again").await.unwrap();
    let d = queues.pop("jobs", vis, Duration::ZERO).await.unwrap();
    d.expect("a message").nack(Duration::ZERO).await.unwrap();
    queues.redrive("jobs", 10).await.unwrap();
    let sent = payloads_before_a_marker(&client, &channel, &mut rx).await;
    assert!(
        sent.is_empty(),
        "a step nobody waited for notified: {sent:?}"
    );
    queues.purge("jobs").await.unwrap();

    let waiter = coord_postgres::connect(&url)
        .await
        .unwrap()
        .with_poll_interval(Duration::from_secs(60));
    let waiting = tokio::spawn(async move {
        let q = waiter.queues().unwrap();
        let started = tokio::time::Instant::now();
        let d = q.pop("jobs", vis, Duration::from_secs(30)).await.unwrap();
        let took = started.elapsed();
        let Some(d) = d else { return (None, took) };
        let payload = d.payload().to_vec();
        // Nothing left ready: the ack wakes nobody.
        d.ack().await.unwrap();
        (Some(payload), took)
    });
    // Until the waiter's empty pop has marked the lane.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let marked = client
            .query_one(
                &format!(
                    "SELECT count(*) FROM \"{schema}\".queue_waiting \
                     WHERE queue = 'jobs' AND until > clock_timestamp()"
                ),
                &[],
            )
            .await
            .unwrap();
        if marked.get::<_, i64>(0) > 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never marked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    queues.push("jobs", "woken").await.unwrap();
    let (got, took) = waiting.await.unwrap();
    assert_eq!(got.as_deref(), Some(&b"woken"[..]));
    assert!(
        took < Duration::from_secs(20),
        "the waiter polled: {took:?}"
    );
    let sent = payloads_before_a_marker(&client, &channel, &mut rx).await;
    assert_eq!(sent, ["queue:main:jobs"], "the push to a waited-on queue");
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

/// A push that lands while a waiter's empty pop is marking the queue (the
/// pop looked before the push committed; the push's look at the mark came
/// before the mark committed, so it notifies nobody) is not missed: the
/// pop that wrote the mark looks again once it is committed. The mark's
/// row is held locked here to stop the pop between its look and its
/// commit. The waiter's poll interval is a minute; it must get the
/// message within 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_landing_while_a_waiter_marks_the_queue_is_not_missed() {
    a_push_landing_while_a_waiter_writes_its_mark("now() - interval '1 hour'", Duration::ZERO)
        .await;
}

/// The same with a mark still live but due for renewal, that runs out
/// while the renewal waits: the push's look finds it run out, so the
/// renewal must look again too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_landing_while_a_waiter_renews_a_mark_that_ran_out_is_not_missed() {
    a_push_landing_while_a_waiter_writes_its_mark(
        "now() + interval '1 second'",
        Duration::from_millis(1200),
    )
    .await;
}

/// The mark of the queue `jobs` set to `until` (an SQL expression), its
/// row held locked while a waiter's empty pop writes it; the push comes
/// `push_after` once the pop waits for the row.
async fn a_push_landing_while_a_waiter_writes_its_mark(until: &str, push_after: Duration) {
    let schema = unique("wr");
    let url = format!("{}&coord_schema={schema}", cluster().url());
    let producer = coord_postgres::connect(&url).await.unwrap();
    let waiter = coord_postgres::connect(&url)
        .await
        .unwrap()
        .with_poll_interval(Duration::from_secs(60));
    let vis = Duration::from_secs(30);
    // A mark row for the queue (left by another client: the waiter's own
    // first attempt below must find no waiter of its client, so that it
    // is its second one, after it subscribed, that writes the mark).
    let first = producer
        .queues()
        .unwrap()
        .pop("jobs", vis, Duration::from_millis(300))
        .await
        .unwrap();
    assert!(first.is_none());
    let (mut admin, conn) = tokio_postgres::connect(&cluster().url(), NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let table = format!("\"{schema}\".queue_waiting");
    let set = admin
        .execute(
            &format!("UPDATE {table} SET until = {until} WHERE queue = 'jobs'"),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(set, 1, "the waiting pop marked the queue");
    let hold = admin.transaction().await.unwrap();
    hold.execute(
        &format!("SELECT 1 FROM {table} WHERE queue = 'jobs' FOR UPDATE"),
        &[],
    )
    .await
    .unwrap();

    let waiting = tokio::spawn(async move {
        let q = waiter.queues().unwrap();
        let started = tokio::time::Instant::now();
        let d = q.pop("jobs", vis, Duration::from_secs(30)).await.unwrap();
        (d.map(|d| d.payload().to_vec()), started.elapsed())
    });
    // Until the pop waits for the mark's row.
    let (watcher, conn) = tokio_postgres::connect(&cluster().url(), NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let blocked = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                  WHERE wait_event_type = 'Lock' AND query LIKE '%queue_pop%'",
                &[],
            )
            .await
            .unwrap();
        if blocked.get::<_, i64>(0) > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pop never reached the mark"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(push_after).await;
    producer
        .queues()
        .unwrap()
        .push("jobs", "landed")
        .await
        .unwrap();
    hold.rollback().await.unwrap();
    let (got, took) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter missed the push: it waits for its poll")
        .unwrap();
    assert_eq!(got.as_deref(), Some(&b"landed"[..]), "after {took:?}");
}
