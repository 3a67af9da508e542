//! The wait loop, written once for every backend and primitive: attempt,
//! then sleep until the store notifies (or the holder's TTL runs out, or a
//! jittered poll interval passes), then attempt again, until a deadline.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Attempt;
use crate::error::{Error, Result};
use crate::types::FencingToken;
use crate::wake::Waiter;

/// The outcome of a wait: granted, or still not granted at the deadline.
#[derive(Debug)]
pub(crate) struct WaitOutcome {
    /// The grant, if any.
    pub granted: Option<FencingToken>,
    /// Whether any attempt ended in an error (its effect on the store is
    /// unknown, so the caller cleans up if nothing was granted).
    pub ambiguous: bool,
    /// The last retryable error seen, if the last attempt failed.
    pub last_error: Option<Error>,
    /// Whether the loop went past its first attempt and subscribed (a
    /// queueing store may then hold a waiter's entry for this owner).
    pub subscribed: bool,
}

/// `now + wait`, saturating far in the future instead of overflowing
/// (`Duration::MAX` means "wait for ever").
pub(crate) fn deadline_in(wait: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(wait)
        .unwrap_or_else(|| now + Duration::from_secs(30 * 365 * 24 * 3600))
}

/// A jittered sleep between half and all of `poll`.
pub(crate) fn jittered(poll: Duration) -> Duration {
    let nanos = poll.as_nanos().min(u64::MAX as u128) as u64;
    if nanos < 2 {
        return poll;
    }
    Duration::from_nanos(crate::rng::range_inclusive(nanos / 2, nanos))
}

/// Attempt until granted or `deadline` passes.
///
/// - `attempt` makes one try; `subscribe` registers for wake-ups and is
///   called lazily, only when the first attempt fails (the uncontended path
///   pays nothing for waiting).
/// - Between attempts it sleeps until a notification, the holder's reported
///   expiry (plus 1 ms), or a jittered poll interval, whichever is first,
///   never past the deadline.
/// - Retryable errors are retried with backoff; others are returned at once.
pub(crate) async fn until<A, AF, S, SF>(
    mut attempt: A,
    subscribe: S,
    deadline: Instant,
    poll: Duration,
) -> Result<WaitOutcome>
where
    A: FnMut() -> AF,
    AF: Future<Output = Result<Attempt>>,
    S: FnOnce() -> SF,
    SF: Future<Output = Result<Waiter>>,
{
    let mut ambiguous = false;
    let mut backoff = Duration::from_millis(5);

    // First attempt without subscribing: the uncontended path.
    let mut next_sleep = match attempt().await {
        Ok(Attempt::Granted(t)) => {
            return Ok(WaitOutcome {
                granted: Some(t),
                ambiguous,
                last_error: None,
                subscribed: false,
            });
        }
        Ok(Attempt::Held { expires_in }) => hint(expires_in, poll),
        Err(e) if e.is_retryable() => {
            ambiguous = true;
            tracing::debug!(error = %e, "attempt failed, retrying");
            if Instant::now() >= deadline {
                return Ok(WaitOutcome {
                    granted: None,
                    ambiguous,
                    last_error: Some(e),
                    subscribed: false,
                });
            }
            backoff
        }
        Err(e) => return Err(e),
    };
    if Instant::now() >= deadline {
        return Ok(WaitOutcome {
            granted: None,
            ambiguous,
            last_error: None,
            subscribed: false,
        });
    }

    let waiter = match subscribe().await {
        Ok(w) => w,
        Err(e) if e.is_retryable() => {
            tracing::debug!(error = %e, "subscribe failed, falling back to polling");
            Waiter::never()
        }
        Err(e) => return Err(e),
    };

    // We already know the lock was busy a moment ago, but a release may
    // have happened before we subscribed: attempt again right away, with the
    // notification armed.
    let mut first = true;
    loop {
        let notified = waiter.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();

        if !first {
            let now = Instant::now();
            let until = (now + next_sleep).min(deadline);
            tokio::select! {
                biased;
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
        first = false;

        let mut last_error = None;
        match attempt().await {
            Ok(Attempt::Granted(t)) => {
                return Ok(WaitOutcome {
                    granted: Some(t),
                    ambiguous,
                    last_error: None,
                    subscribed: true,
                });
            }
            Ok(Attempt::Held { expires_in }) => {
                backoff = Duration::from_millis(5);
                next_sleep = hint(expires_in, poll);
            }
            Err(e) if e.is_retryable() => {
                ambiguous = true;
                tracing::debug!(error = %e, "attempt failed, retrying");
                next_sleep = backoff;
                backoff = (backoff * 2).min(poll).min(Duration::from_secs(1));
                last_error = Some(e);
            }
            Err(e) => return Err(e),
        }
        if Instant::now() >= deadline {
            return Ok(WaitOutcome {
                granted: None,
                ambiguous,
                last_error,
                subscribed: true,
            });
        }
    }
}

/// How long to sleep when the holder's TTL is known: until just after it
/// runs out, plus a random spread so the waiters of every process do not
/// all retry in the same millisecond, but never longer than a jittered poll
/// interval.
fn hint(expires_in: Option<Duration>, poll: Duration) -> Duration {
    let p = jittered(poll);
    match expires_in {
        Some(e) => p.min(e + Duration::from_millis(1) + expiry_spread(e)),
        None => p,
    }
}

/// A random delay in `0..=clamp(e / 10, 2 ms, 50 ms)` added to a holder's
/// expiry hint `e`.
fn expiry_spread(e: Duration) -> Duration {
    let max = (e / 10).clamp(Duration::from_millis(2), Duration::from_millis(50));
    Duration::from_nanos(crate::rng::range_inclusive(0, max.as_nanos() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wake::Wakeups;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn jitter_stays_within_half_and_full() {
        for _ in 0..100 {
            let j = jittered(Duration::from_millis(100));
            assert!(j >= Duration::from_millis(50) && j <= Duration::from_millis(100));
        }
        // And they are spread over that range, not all the full interval.
        let draws: Vec<Duration> = (0..100).map(|_| jittered(Duration::from_secs(1))).collect();
        let (lo, hi) = (draws.iter().min().unwrap(), draws.iter().max().unwrap());
        assert!(
            *hi - *lo >= Duration::from_millis(100),
            "not spread: {lo:?}..{hi:?}"
        );
        // Intervals too short to split are kept as they are.
        for _ in 0..64 {
            assert_eq!(jittered(Duration::from_nanos(1)), Duration::from_nanos(1));
        }
        assert_eq!(jittered(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn expiry_hints_are_spread_and_never_early() {
        let e = Duration::from_millis(500);
        let hints: Vec<Duration> = (0..200)
            .map(|_| hint(Some(e), Duration::from_secs(10)))
            .collect();
        let (lo, hi) = (hints.iter().min().unwrap(), hints.iter().max().unwrap());
        assert!(*lo >= e + Duration::from_millis(1), "{lo:?}");
        assert!(*hi <= e + Duration::from_millis(51), "{hi:?}");
        assert!(
            *hi - *lo >= Duration::from_millis(10),
            "not spread: {lo:?}..{hi:?}"
        );
        // The spread is a tenth of a short expiry, not the 50 ms cap.
        let e = Duration::from_millis(100);
        for _ in 0..200 {
            let h = hint(Some(e), Duration::from_secs(10));
            assert!(h >= e + Duration::from_millis(1), "{h:?}");
            assert!(h <= e + Duration::from_millis(11), "{h:?}");
        }
        // A short poll interval still bounds the sleep.
        assert!(hint(Some(e), Duration::from_millis(100)) <= Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn granted_on_first_attempt_never_subscribes() {
        let out = until(
            || async { Ok(Attempt::Granted(FencingToken(1))) },
            || async { panic!("must not subscribe on the uncontended path") },
            Instant::now() + Duration::from_secs(1),
            Duration::from_secs(1),
        )
        .await
        .unwrap();
        assert_eq!(out.granted, Some(FencingToken(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn notification_wakes_before_poll_interval() {
        let wakeups = Wakeups::new();
        let free = Arc::new(AtomicU32::new(0));
        let w2 = wakeups.clone();
        let f2 = free.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            f2.store(1, Ordering::SeqCst);
            w2.notify_one("k");
        });
        let start = Instant::now();
        let out = until(
            || {
                let free = free.clone();
                async move {
                    if free.load(Ordering::SeqCst) == 1 {
                        Ok(Attempt::Granted(FencingToken(7)))
                    } else {
                        Ok(Attempt::Held { expires_in: None })
                    }
                }
            },
            || {
                let w = wakeups.clone();
                async move { Ok(w.subscribe("k")) }
            },
            Instant::now() + Duration::from_secs(60),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
        assert_eq!(out.granted, Some(FencingToken(7)));
        assert!(start.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn expiry_hint_retries_at_holder_expiry() {
        let calls = Arc::new(AtomicU32::new(0));
        let start = Instant::now();
        let c = calls.clone();
        let out = until(
            move || {
                let n = c.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n >= 2 {
                        Ok(Attempt::Granted(FencingToken(3)))
                    } else {
                        Ok(Attempt::Held {
                            expires_in: Some(Duration::from_millis(200)),
                        })
                    }
                }
            },
            || async { Ok(Waiter::never()) },
            Instant::now() + Duration::from_secs(60),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
        assert_eq!(out.granted, Some(FencingToken(3)));
        assert!(start.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_returns_not_granted_and_fatal_errors_return_at_once() {
        let out = until(
            || async { Ok(Attempt::Held { expires_in: None }) },
            || async { Ok(Waiter::never()) },
            Instant::now() + Duration::from_secs(2),
            Duration::from_millis(100),
        )
        .await
        .unwrap();
        assert!(out.granted.is_none());
        assert!(!out.ambiguous);

        let err = until(
            || async { Err(Error::invalid("x", "y")) },
            || async { Ok(Waiter::never()) },
            Instant::now() + Duration::from_secs(2),
            Duration::from_millis(100),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }));
    }
}
