//! Cleanups that stay armed until an operation's remote effects are
//! settled, written once for every primitive.
//!
//! An operation that may leave something on the store (a grant, a place in
//! a FIFO queue, a barrier arrival, a delivery, a release on its way) arms
//! an [`Armed`] cleanup before the first store call that can leave it, and
//! keeps it armed until the last remote effect of the operation is
//! settled, one of two ways:
//!
//! - **By a reply** that says what the store holds: a grant handed to a
//!   guard (which then owns its release), a refusal that left nothing, a
//!   release or withdraw that was answered. The operation calls
//!   [`Armed::settled`] only then.
//! - **By undoing it**: a lost reply or an ambiguous final error, and a
//!   future dropped before either, start the undo in the background, with
//!   the operation's own identity (release or withdraw as that owner, give
//!   the delivery back), sent again while the store does not answer
//!   ([`retrying`]).
//!
//! A remote call that itself settles the operation (leaving a queue,
//! withdrawing, releasing) runs inside [`Armed::settle_with`]: the cleanup
//! is disarmed only once that call has returned, so a caller's timeout
//! that drops the operation during that round trip leaves nothing behind.

use std::future::Future;

use crate::error::Result;
use crate::util;

/// What to undo when an operation ends before its remote effects are
/// settled.
pub(crate) trait Undo {
    /// Start undoing, in the background (on the current tokio runtime;
    /// without one, what is left ends with its TTL).
    fn start(self);
}

/// A cleanup armed for one operation (see the module docs). Dropped while
/// armed, by the operation returning early or by its future being dropped,
/// it starts its undo.
#[must_use = "dropping it at once undoes the operation"]
pub(crate) struct Armed<U: Undo> {
    undo: Option<U>,
}

impl<U: Undo> Armed<U> {
    /// Armed with `undo`.
    pub(crate) fn new(undo: U) -> Self {
        Armed { undo: Some(undo) }
    }

    /// The outcome is known from a reply, and nothing of the operation is
    /// left to undo (or a guard now owns it): disarm.
    pub(crate) fn settled(mut self) {
        self.undo = None;
    }

    /// The outcome is unknown, or something is left: undo it now, in the
    /// background.
    pub(crate) fn undo(self) {
        drop(self);
    }

    /// The undo, to move the operation on to its next stage.
    pub(crate) fn get_mut(&mut self) -> &mut U {
        self.undo
            .as_mut()
            .expect("an Armed is consumed when it is settled or undone")
    }

    /// Await `call`, a store call that settles the operation (it removes
    /// what the operation left), with the cleanup still armed: dropped
    /// before `call` returns, or answered with an error, the undo starts in
    /// the background; answered, the cleanup is disarmed.
    pub(crate) async fn settle_with<T>(self, call: impl Future<Output = Result<T>>) -> Result<T> {
        let r = call.await;
        match &r {
            Ok(_) => self.settled(),
            Err(_) => self.undo(),
        }
        r
    }
}

impl<U: Undo> Drop for Armed<U> {
    fn drop(&mut self) {
        if let Some(undo) = self.undo.take() {
            undo.start();
        }
    }
}

/// Run `fut` in the background on the current tokio runtime. Without a
/// runtime it is dropped: what it would have removed ends with its TTL.
pub(crate) fn spawn(fut: impl Future<Output = ()> + Send + 'static) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(fut);
    }
}

/// Send `call` until it is answered ([`util::send_until_answered`]: a
/// retryable error sends it again, backing off, for up to
/// [`util::CLEANUP_RETRY_FOR`]); the answer, a non-retryable error or the
/// last error is returned. An error returned is counted once as a failed
/// cleanup of `store` (`coord_cleanup_failures_total`, labelled `what`);
/// `name` is for the logs.
pub(crate) async fn retrying<T, F, Fut>(
    store: &'static str,
    what: &'static str,
    name: &str,
    mut call: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let r = util::send_until_answered(|| {
        let sent = call();
        async move {
            let r = sent.await;
            if let Err(e) = &r {
                tracing::debug!(name, what, error = %e, "cleanup call failed");
            }
            r
        }
    })
    .await;
    if let Err(e) = &r {
        tracing::debug!(name, what, error = %e, "cleanup did not complete; the TTL will end what is left");
        crate::metrics::cleanup_failed(store, what);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    struct Count(Arc<AtomicU32>);

    impl Undo for Count {
        fn start(self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn unavailable() -> Error {
        Error::Unavailable {
            backend: "test",
            operation: "release",
            message: "down".into(),
            source: None,
        }
    }

    #[tokio::test]
    async fn undone_unless_settled() {
        let n = Arc::new(AtomicU32::new(0));
        Armed::new(Count(n.clone())).settled();
        assert_eq!(n.load(Ordering::SeqCst), 0);
        Armed::new(Count(n.clone())).undo();
        assert_eq!(n.load(Ordering::SeqCst), 1);
        drop(Armed::new(Count(n.clone())));
        assert_eq!(n.load(Ordering::SeqCst), 2);
        // Answered: settled. An error: undone.
        let r = Armed::new(Count(n.clone()))
            .settle_with(async { Ok(()) })
            .await;
        assert!(r.is_ok());
        assert_eq!(n.load(Ordering::SeqCst), 2);
        let r: Result<()> = Armed::new(Count(n.clone()))
            .settle_with(async { Err(unavailable()) })
            .await;
        assert!(r.is_err());
        assert_eq!(n.load(Ordering::SeqCst), 3);
    }

    /// Dropped while the settling call is on its way, the cleanup is
    /// still armed: it undoes.
    #[tokio::test(start_paused = true)]
    async fn a_settling_call_dropped_midway_undoes() {
        let n = Arc::new(AtomicU32::new(0));
        let call = Armed::new(Count(n.clone())).settle_with(async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok(())
        });
        let r = tokio::time::timeout(Duration::from_millis(10), call).await;
        assert!(r.is_err());
        assert_eq!(n.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn retrying_sends_again_only_what_may_pass() {
        let calls = AtomicU32::new(0);
        let r: Result<()> = retrying("test", "release", "n", || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err(Error::invalid("x", "y")) }
        })
        .await;
        assert!(r.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let r = retrying("test", "release", "n", || async { Ok(7) }).await;
        assert_eq!(r.unwrap(), 7);
    }

    /// A store that does not answer for a minute: the cleanup is still
    /// being sent when it answers again, and lands.
    #[tokio::test(start_paused = true)]
    async fn retrying_outlasts_a_long_outage() {
        let start = tokio::time::Instant::now();
        let back = start + Duration::from_secs(60);
        let calls = AtomicU32::new(0);
        let r = retrying("test", "release", "n", || {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if tokio::time::Instant::now() < back {
                    Err(unavailable())
                } else {
                    Ok(7)
                }
            }
        })
        .await;
        assert_eq!(r.unwrap(), 7);
        let landed = start.elapsed();
        assert!(
            landed >= Duration::from_secs(60) && landed <= Duration::from_secs(66),
            "landed {landed:?} after the start, the store answering from 60 s"
        );
        // 50 ms doubling to 5 s: a few quick tries, then one every 5 s.
        assert!(calls.load(Ordering::SeqCst) < 25, "{calls:?} sends");
    }

    /// A store that never answers: the cleanup is given up after
    /// `CLEANUP_RETRY_FOR`, not sooner.
    #[tokio::test(start_paused = true)]
    async fn retrying_gives_up_after_its_bound() {
        let start = tokio::time::Instant::now();
        let r: Result<()> = retrying("test", "release", "n", || async { Err(unavailable()) }).await;
        assert!(r.is_err());
        let took = start.elapsed();
        assert!(
            took + util::CLEANUP_PAUSE_MAX >= util::CLEANUP_RETRY_FOR
                && took <= util::CLEANUP_RETRY_FOR,
            "given up after {took:?}"
        );
    }
}
