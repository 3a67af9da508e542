//! Fencing tokens across a crash of the store's server (`kill -9`, then
//! started again on the same data): one scenario for every store whose
//! tokens outlive its process ([`FencingDurability::Durable`] and
//! [`FencingDurability::ClockSeeded`]); each backend's tests call it with
//! the crash of its own server.

use std::future::Future;
use std::time::{Duration, Instant};

use coord_core::{Coord, Error, FencingDurability, FencingToken};

/// Every kind of token `c` hands out, drawn once on `name`.
async fn draw(c: &Coord, name: &str) -> Vec<(&'static str, FencingToken)> {
    const TTL: Duration = Duration::from_secs(2);
    // After a crash a grant from before it may still hold (a durable
    // store): wait out its TTL.
    const WAIT: Duration = Duration::from_secs(10);
    let mut drawn = Vec::new();
    if let Ok(f) = c.fencing() {
        drawn.push(("fencing source", retry(|| f.next(name)).await));
    }
    if let Ok(l) = c.locks() {
        let g = retry(|| l.acquire(name, TTL, WAIT)).await;
        drawn.push(("lock", g.fencing_token()));
        let _ = g.release().await;
    }
    if let Ok(l) = c.leases() {
        let until = Instant::now() + WAIT;
        let g = loop {
            if let Some(g) = retry(|| l.grant(name, TTL)).await {
                break g;
            }
            assert!(Instant::now() < until, "the lease stayed held");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        drawn.push(("lease", g.fencing_token()));
        let _ = g.release().await;
    }
    if let Ok(s) = c.semaphores() {
        let p = retry(|| s.acquire(name, 1, TTL, WAIT)).await;
        drawn.push(("semaphore permit", p.fencing_token()));
        let _ = p.release().await;
    }
    if let Ok(e) = c.elections() {
        let l = retry(|| e.campaign(name, "candidate", TTL, WAIT)).await;
        drawn.push(("leadership", l.term()));
        let _ = l.resign().await;
    }
    if let Ok(q) = c.queues() {
        retry(|| q.push(name, b"m")).await;
        let d = retry(|| q.pop(name, TTL, WAIT))
            .await
            .expect("the message pushed was not delivered");
        drawn.push(("queue delivery", d.fencing_token()));
        let _ = d.ack().await;
    }
    drawn
}

/// `call` until it answers, while the store is coming back (20 s).
async fn retry<T, F, Fut>(mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = coord_core::Result<T>>,
{
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        match call().await {
            Ok(v) => return v,
            Err(e) if e.is_retryable() && Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e @ Error::Timeout { .. }) => panic!("still held after the crash: {e}"),
            Err(e) => panic!("{e}"),
        }
    }
}

/// One token of every kind `before` hands out (fencing source, lock,
/// lease, semaphore permit, leadership, queue delivery) on `name`; then
/// `crash` kills the server (`kill -9`, no clean shutdown), starts it again
/// on the same data and returns a client of it; each kind's next token on
/// `name` is above the one before the crash. Nothing is asserted where the
/// store's tokens rise only while its process lives.
pub async fn tokens_rise_across_a_crash<F, Fut>(before: &Coord, name: &str, crash: F)
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Coord>,
{
    let durable = matches!(
        before.capabilities().fencing,
        FencingDurability::Durable | FencingDurability::ClockSeeded
    );
    let first = draw(before, name).await;
    assert!(first.len() >= 2, "too few kinds of token: {first:?}");
    let after = crash().await;
    let second = draw(&after, name).await;
    if !durable {
        return;
    }
    for ((kind, a), (_, b)) in first.iter().zip(&second) {
        assert!(
            b > a,
            "a {kind} token went back across the crash: {a:?} before, {b:?} after"
        );
    }
}
