//! The clients' connections to the masters: closed when the clients are
//! dropped, not retried in a busy loop against a hung or closing master,
//! `connect` returning once a quorum is connected, and the watchdog riding
//! out a connection blip.

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use conformance::testkit::redis::RedlockMasters;
use coord_core::LockOptions;
use tokio::time::{Instant, sleep};

use super::{Frozen, client, connected_clients, ready};

/// Dropping every `Coord` handle closes every connection it opened to
/// every master (no leaked connection or background task keeps one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_clients_close_their_connections() {
    let set = RedlockMasters::start(3);
    let before: Vec<i64> = set.masters().iter().map(connected_clients).collect();
    {
        let mut cs = Vec::new();
        for _ in 0..3 {
            cs.push(client(&set.url()).await);
        }
        for (i, c) in cs.iter().enumerate() {
            let g = c
                .locks()
                .unwrap()
                .acquire("leak", Duration::from_secs(5), Duration::from_secs(5))
                .await
                .unwrap();
            let _ = c.fencing().unwrap().next("leak").await.unwrap();
            let waiter = cs[(i + 1) % 3].locks().unwrap();
            let w = tokio::spawn(async move {
                waiter
                    .acquire("leak", Duration::from_secs(5), Duration::from_secs(5))
                    .await
            });
            sleep(Duration::from_millis(50)).await;
            g.release().await.unwrap();
            w.await.unwrap().unwrap().release().await.unwrap();
        }
        let during: Vec<i64> = set.masters().iter().map(connected_clients).collect();
        eprintln!("connections before {before:?}, with 3 clients {during:?}");
        assert!(during.iter().zip(&before).all(|(d, b)| d > b));
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now: Vec<i64> = set.masters().iter().map(connected_clients).collect();
        if now == before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "5 s after dropping every client: {now:?} connections, {before:?} before"
        );
        sleep(Duration::from_millis(100)).await;
    }
}

/// A fake master on a free port counting the connections made to it:
/// with `hold`, it keeps each one open and never answers (a hung host);
/// otherwise it closes each at once (a host whose server is gone).
fn fake_master(hold: bool) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepts = Arc::new(AtomicUsize::new(0));
    let counted = accepts.clone();
    std::thread::spawn(move || {
        let mut keep = Vec::new();
        for s in listener.incoming() {
            counted.fetch_add(1, Ordering::SeqCst);
            if hold {
                keep.push(s);
            }
        }
    });
    (port, accepts)
}

/// Lock cycles with two real masters and a fake third one, for 3 s and
/// until 20 cycles were done (15 s at most); the connection attempts to
/// the fake one after connect, and how long the cycles ran.
async fn cycles_with_a_fake_master(hold: bool) -> (usize, Duration) {
    let set = RedlockMasters::start(2);
    let (fake, accepts) = fake_master(hold);
    let url = format!(
        "redlock://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{fake}?timeout=1s&connect_timeout=2s",
        set.masters()[0].port(),
        set.masters()[1].port()
    );
    let c = client(&url).await;
    let at_connect = accepts.load(Ordering::SeqCst);
    let locks = c.locks().unwrap();
    let t = Instant::now();
    let mut ops = 0;
    // 20 cycles take well under 3 s on an idle machine; a loaded one gets
    // more time, and the reconnects are judged per second of it.
    while t.elapsed() < Duration::from_secs(3)
        || (ops < 20 && t.elapsed() < Duration::from_secs(15))
    {
        match locks
            .acquire("fake", Duration::from_secs(2), Duration::from_secs(1))
            .await
        {
            Ok(g) => {
                let _ = g.release().await;
                ops += 1;
            }
            Err(e) if e.is_retryable() => {}
            Err(e) => panic!("{e}"),
        }
    }
    let took = t.elapsed();
    let n = accepts.load(Ordering::SeqCst) - at_connect;
    eprintln!(
        "hold {hold}: {ops} lock cycles in {took:?}; {at_connect} connections at connect, {n} after"
    );
    assert!(ops >= 20, "only {ops} lock cycles in {took:?}");
    (n, took)
}

/// At most about one connection attempt a second (8 in 3 s, as before
/// the run could be longer).
fn reconnects_allowed(took: Duration) -> usize {
    took.as_secs_f64().ceil() as usize + 5
}

/// A master that accepts TCP connections but never answers (a hung host)
/// is tried again at most about once a second while clients keep calling,
/// not in a busy loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_master_is_not_reconnected_in_a_busy_loop() {
    let (n, took) = cycles_with_a_fake_master(true).await;
    assert!(
        n <= reconnects_allowed(took),
        "{n} connection attempts to the hung master in {took:?}"
    );
}

/// The same for a master that closes every connection at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closing_master_is_not_reconnected_in_a_busy_loop() {
    let (n, took) = cycles_with_a_fake_master(false).await;
    assert!(
        n <= reconnects_allowed(took),
        "{n} connection attempts to the closing master in {took:?}"
    );
}

/// The watchdog rides out a connection blip to two of the three masters
/// (their connections closed, the servers up): the guard stays valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_survives_a_connection_blip() {
    let set = RedlockMasters::start_behind_proxies(3);
    let url = format!("{}?timeout=1s&connect_timeout=5s", set.url());
    let a = client(&url).await;
    ready(&set, &[&a]).await;
    let g = a
        .locks()
        .unwrap()
        .acquire_with(
            "wd-blip",
            LockOptions::new(Duration::from_secs(3)).watchdog(true),
        )
        .await
        .unwrap();
    for _ in 0..3 {
        set.proxy(0).reset();
        set.proxy(1).reset();
        sleep(Duration::from_millis(1000)).await;
        assert!(
            g.is_valid(),
            "the watchdog lost the lock over a connection blip"
        );
    }
    g.release().await.unwrap();
}

/// `RedlockBackend::connect` says it returns "once a quorum of them is
/// connected"; with one master frozen (SIGSTOP: TCP accepts, nothing
/// answers) it must not wait the frozen master's whole connect timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_returns_once_a_quorum_is_connected() {
    let set = RedlockMasters::start(3);
    // Waiting for the frozen master costs connect its connect timeout
    // (6 s); half of it leaves room for a loaded machine.
    let connect_timeout = Duration::from_secs(6);
    let url = format!(
        "{}?timeout=500ms&connect_timeout={}ms",
        set.url(),
        connect_timeout.as_millis()
    );
    let frozen = Frozen::pause(&set.masters()[2]);
    let t = Instant::now();
    let c = client(&url).await;
    let took = t.elapsed();
    let g = c
        .locks()
        .unwrap()
        .try_acquire("connect-frozen", Duration::from_secs(5))
        .await
        .unwrap();
    assert!(g.is_some());
    drop(frozen);
    assert!(
        took < connect_timeout / 2,
        "connect took {took:?} with two of three masters up at once"
    );
}
