//! Waiting on a rate limiter: `wait` sleeps the denial's `retry_after` and
//! is admitted at the deadline, and gives up when the retry would come
//! past it.

use crate::support;
use std::time::Duration;

use coord_core::{Algorithm, Error, Quota};
use support::faulty::Faulty;
use tokio::time::Instant;

use super::{MS, S};

// ---- waiting on a rate limiter ----

fn one_per_second() -> Quota {
    Quota::new(1, S, Algorithm::FixedWindow)
}

/// `RateLimiter::wait` sleeps exactly the denial's `retry_after`, checks
/// again, and is admitted; a wait that ends exactly at that time still
/// gets its check.
#[tokio::test(start_paused = true)]
async fn a_limiter_wait_sleeps_retry_after_and_is_admitted_at_the_deadline() {
    let f = Faulty::new();
    let lim = f.coord(S).limiter().unwrap();
    assert!(lim.check("w", one_per_second()).await.unwrap().allowed);
    let denied = lim.check("w", one_per_second()).await.unwrap();
    assert!(!denied.allowed);
    let retry = denied.retry_after;
    assert!(retry > Duration::ZERO && retry <= S, "{retry:?}");
    let started = Instant::now();
    let d = lim
        .wait("w", one_per_second(), 1, retry)
        .await
        .expect("admitted at the deadline");
    assert!(d.allowed);
    assert_eq!(started.elapsed(), retry);
    assert_eq!(
        f.calls("limiter.check"),
        4,
        "one denied check, one admitted"
    );
}

/// A wait whose next check would come after its `max_wait` gives up at
/// once with `Timeout`, and one with room to spare is admitted.
#[tokio::test(start_paused = true)]
async fn a_limiter_wait_gives_up_when_the_retry_is_past_its_deadline() {
    let f = Faulty::new();
    let lim = f.coord(S).limiter().unwrap();
    assert!(lim.check("w2", one_per_second()).await.unwrap().allowed);
    let started = Instant::now();
    let e = lim
        .wait("w2", one_per_second(), 1, 500 * MS)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "got {e:?}");
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "it slept before giving up"
    );
    assert_eq!(f.calls("limiter.check"), 2);
    let d = lim
        .wait("w2", one_per_second(), 1, 5 * S)
        .await
        .expect("admitted within 5 s");
    assert!(d.allowed);
    assert_eq!(started.elapsed(), S);
}
