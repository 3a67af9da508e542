//! The server restarts (cleanly, and like a crash) in the middle of use:
//! locks still exclude, tokens keep rising, the pool and the LISTEN
//! connection reconnect.

use std::time::{Duration, Instant};

use conformance::testkit::postgres::cluster;
use coord_core::{Coord, Error, FencingToken};

async fn client() -> Coord {
    coord_postgres::builder(&cluster().url())
        .call_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect")
        .with_poll_interval(Duration::from_secs(60))
}

/// Retry a call while the server is coming back (retryable errors only).
async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = coord_core::Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

async fn restart_in_the_middle(crash: bool) {
    let (a, b) = (client().await, client().await);
    let (la, lb) = (a.locks().unwrap(), b.locks().unwrap());
    let name = format!("restart-{crash}-{}", std::process::id());
    let before = a.fencing().unwrap().next("restart").await.unwrap();
    let held = la
        .try_acquire(&name, Duration::from_secs(60))
        .await
        .unwrap()
        .expect("free");
    let t1 = held.fencing_token();

    // Both clients have idle pooled connections and a LISTEN connection;
    // the server goes away under them.
    let pg = tokio::task::spawn_blocking(move || {
        if crash {
            cluster().crash();
        } else {
            cluster().stop();
        }
    });
    pg.await.unwrap();
    let e = lb
        .try_acquire(&name, Duration::from_secs(60))
        .await
        .expect_err("server down");
    assert!(e.is_retryable(), "a down server is Unavailable: {e:?}");
    tokio::task::spawn_blocking(|| cluster().start())
        .await
        .unwrap();

    // The lock survived the restart and still excludes.
    let got = eventually("try_acquire after restart", || {
        lb.try_acquire(&name, Duration::from_secs(60))
    })
    .await;
    assert!(
        got.is_none(),
        "the lock held before the restart still excludes"
    );

    // Fencing tokens keep rising across the restart.
    let fb = b.fencing().unwrap();
    let after = eventually("fencing next after restart", || fb.next("restart")).await;
    assert!(after > before, "{after} > {before}");

    // A waiter on b; a releases; b is woken by NOTIFY on its re-established
    // LISTEN connection (the poll fallback is a minute).
    let lb2 = lb.clone();
    let n2 = name.clone();
    let waiter = tokio::spawn(async move {
        let t0 = Instant::now();
        let g = lb2
            .acquire(&n2, Duration::from_secs(60), Duration::from_secs(40))
            .await
            .expect("acquire after release");
        (g, t0.elapsed())
    });
    // Give the listener time to reconnect (backoff is at most 2 s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let released = held.release().await;
    match released {
        Ok(()) => {}
        Err(Error::Unavailable { .. }) => {
            // The pooled connection of `a` died with the server; a retry
            // goes through a fresh one.
            eventually("force release", || la.force_release(&name)).await;
        }
        Err(e) => panic!("release after restart: {e}"),
    }
    let (g, waited) = waiter.await.unwrap();
    assert!(
        waited < Duration::from_secs(10),
        "woken by NOTIFY after the reconnect, not by polling: {waited:?}"
    );
    let t2: FencingToken = g.fencing_token();
    assert!(
        t2 > t1,
        "tokens keep rising across the restart: {t2} > {t1}"
    );
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_restart_in_the_middle_of_use() {
    let _alone = crate::ALONE.lock().await;
    restart_in_the_middle(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_restart_in_the_middle_of_use() {
    let _alone = crate::ALONE.lock().await;
    restart_in_the_middle(true).await;
}
