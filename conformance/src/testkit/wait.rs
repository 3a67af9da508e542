//! Waiting for an observable condition instead of sleeping "long enough":
//! a check that needs something to have happened (a waiter queued, a
//! background cleanup done, a key expired) polls for it, so a loaded
//! machine makes it slower, never wrong.

use std::future::Future;
use std::time::Duration;

use tokio::time::{Instant, sleep};

/// How often [`until`] and [`holds_within`] look again.
pub const POLL: Duration = Duration::from_millis(20);

/// Poll `cond` every [`POLL`] until it holds; panic naming `what` if it
/// still does not after `limit`. Returns how long it took.
pub async fn until<F, Fut>(what: &str, limit: Duration, cond: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    match holds_within(limit, cond).await {
        Some(took) => took,
        None => panic!("{what}: not within {limit:?}"),
    }
}

/// Poll `cond` every [`POLL`] until it holds (`Some(how long it took)`)
/// or `limit` has passed (`None`).
pub async fn holds_within<F, Fut>(limit: Duration, mut cond: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if cond().await {
            return Some(start.elapsed());
        }
        if start.elapsed() >= limit {
            return None;
        }
        sleep(POLL).await;
    }
}

/// `call` until it is answered (`Ok`), every [`POLL`]: a client with a
/// short call timeout can go unanswered on a loaded machine, and its
/// caller tries again, as a caller would (the same owner's retry is the
/// same attempt; a read changes nothing). Panics naming `what` once
/// `deadline` (a std `Instant`) has passed.
pub async fn until_answered<T, E, F, Fut>(
    deadline: std::time::Instant,
    what: &str,
    mut call: F,
) -> T
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    loop {
        match call().await {
            Ok(v) => return v,
            Err(e) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{what} never answered: {e}"
                );
                sleep(POLL).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn until_returns_once_the_condition_holds() {
        let start = Instant::now();
        let took = until(
            "the clock passed 100 ms",
            Duration::from_secs(1),
            || async { start.elapsed() >= Duration::from_millis(100) },
        )
        .await;
        assert!(took >= Duration::from_millis(100) && took < Duration::from_millis(200));
    }

    #[tokio::test]
    async fn holds_within_gives_up_after_the_limit() {
        let never = holds_within(Duration::from_millis(300), || async { false }).await;
        assert_eq!(never, None);
    }

    #[tokio::test]
    #[should_panic(expected = "nothing happened: not within")]
    async fn until_panics_naming_what_did_not_happen() {
        until("nothing happened", Duration::from_millis(100), || async {
            false
        })
        .await;
    }
}
