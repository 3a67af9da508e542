//! Time measured on the database clock: a held lock reports the holder's
//! remaining time (and repeats are idempotent), and a GCRA burst admits
//! its limit plus what refilled, no more.

use std::time::{Duration, Instant};

use conformance::testkit::postgres::cluster;
use coord_core::{Attempt, FencingToken, Lock, OwnerToken};

use super::unique;

/// A held lock reports the holder's remaining time, measured on the
/// database clock; tokens are per grant; a repeat by the same owner is
/// idempotent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_reports_remaining_time_and_repeats_are_idempotent() {
    let backend = coord_postgres::builder(&cluster().url())
        .connect_backend()
        .await
        .unwrap();
    let name = unique("held");
    let (o1, o2) = (OwnerToken::random(), OwnerToken::random());
    let Attempt::Granted(t1) = backend
        .try_acquire(&name, o1.step(), Duration::from_secs(10))
        .await
        .unwrap()
    else {
        panic!("free lock");
    };
    assert_eq!(
        backend
            .try_acquire(&name, o1.step(), Duration::from_secs(10))
            .await
            .unwrap(),
        Attempt::Granted(t1),
        "a retry after a lost reply gets the same token"
    );
    match backend
        .try_acquire(&name, o2.step(), Duration::from_secs(10))
        .await
        .unwrap()
    {
        Attempt::Held {
            expires_in: Some(left),
        } => assert!(
            left <= Duration::from_secs(10) && left > Duration::from_secs(8),
            "{left:?}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(!backend.release(&name, o2.step()).await.unwrap());
    assert!(
        !backend
            .extend(&name, o2.step(), Duration::from_secs(10))
            .await
            .unwrap()
    );
    assert!(backend.release(&name, o1.step()).await.unwrap());
    let Attempt::Granted(t2) = backend
        .try_acquire(&name, o2.step(), Duration::from_secs(10))
        .await
        .unwrap()
    else {
        panic!("released lock");
    };
    assert!(t2 > t1);
    // Release frees the row in place (the sweep deletes it once idle);
    // the next grant takes it with a higher token (tests/it/reuse.rs).
    assert!(backend.release(&name, o2.step()).await.unwrap());
    let left = cluster().psql(
        "postgres",
        &format!(
            "SELECT count(*) FROM coord.claims WHERE kind = 'lock' AND name = '{name}' \
             AND owner IS NOT NULL"
        ),
    );
    assert_eq!(left.trim(), "0");
    let o3 = OwnerToken::random();
    let Attempt::Granted(t3) = backend
        .try_acquire(&name, o3.step(), Duration::from_secs(10))
        .await
        .unwrap()
    else {
        panic!("released lock");
    };
    assert!(t3 > t2 && FencingToken(t2.get()) > t1);
    assert!(backend.release(&name, o3.step()).await.unwrap());
}

/// GCRA refills one request per window/limit while a burst runs: across 8
/// clients, a burst of 1000 admits at least `limit` and at most `limit`
/// plus what refilled during the burst, never more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gcra_burst_admits_limit_plus_refill_and_no_more() {
    use coord_core::{Algorithm, Quota};
    const LIMIT: u64 = 100;
    let window = Duration::from_secs(20);
    let quota = Quota::new(LIMIT, window, Algorithm::Gcra);
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(coord_postgres::connect(&cluster().url()).await.unwrap());
    }
    let key = unique("gcra-burst");
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(clients.len()));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for c in &clients {
        let (c, k, s) = (c.clone(), key.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            let lim = c.limiter().unwrap();
            s.wait().await;
            let checks = (0..125).map(|_| lim.check(&k, quota));
            futures::future::join_all(checks)
                .await
                .into_iter()
                .filter(|d| d.as_ref().expect("limiter check").allowed)
                .count() as u64
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    let elapsed = t0.elapsed();
    let refill = (elapsed.as_secs_f64() / (window.as_secs_f64() / LIMIT as f64)).ceil() as u64;
    assert!(
        (LIMIT..=LIMIT + refill).contains(&admitted),
        "admitted {admitted} in {elapsed:?}: limit {LIMIT} + refill {refill}"
    );
}
