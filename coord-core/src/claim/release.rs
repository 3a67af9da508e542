//! How a guard ends: release (or, for a delivery, ack or nack) on request,
//! and release in the background when it is dropped.

use std::sync::atomic::Ordering;

use tracing::Instrument;

use super::guard::{Guard, end_outcome};
use super::{ClaimBackend, End, EndClaim, end_retrying};
use crate::error::{Error, Result};
use crate::metrics;

impl Guard {
    /// Release the claim iff this owner still holds it (compare-and-delete
    /// on the store), after stopping the watchdog and waiting for any
    /// renewal in flight. Wakes a waiter.
    ///
    /// Errors: [`Error::NotHeld`] if it had already expired or been taken
    /// over (nothing was changed on the store); store errors as they come
    /// (the release may or may not have landed: it is sent again in the
    /// background while the store does not answer, for up to 10 minutes,
    /// and the claim ends at its TTL at the latest). Cost: one round trip.
    /// Cancel-safe: if the future is dropped before the store answers, the
    /// guard counts as released and the release is sent again in the
    /// background.
    pub async fn release(self) -> Result<()> {
        self.end(End::Release).await
    }

    /// End the claim as `end` says (see [`release`](Guard::release)).
    pub(crate) async fn end(self, end: End) -> Result<()> {
        let inner = self.inner.clone();
        let r = self.end_own(end).await;
        inner.end_companion().await;
        r
    }

    /// End this claim alone (see [`end`](Guard::end)).
    pub(super) async fn end_own(mut self, end: End) -> Result<()> {
        self.stop_watchdog();
        let inner = self.inner.clone();
        let (store, kind) = (inner.backend.store(), inner.backend.kind());
        let span = match end {
            End::Release => tracing::debug_span!(
                "coord.release",
                store = store,
                kind,
                name = %inner.name,
                outcome = tracing::field::Empty
            ),
            End::Ack => tracing::debug_span!(
                "coord.queue.ack",
                store = store,
                kind,
                name = %inner.name,
                outcome = tracing::field::Empty
            ),
            End::Nack(_) => tracing::debug_span!(
                "coord.queue.nack",
                store = store,
                kind,
                name = %inner.name,
                outcome = tracing::field::Empty
            ),
        };
        let r = async move {
            let _op = inner.op.lock().await;
            if inner.released.swap(true, Ordering::AcqRel) {
                return Err(Error::NotHeld {
                    name: inner.name.to_string(),
                });
            }
            inner.ended.notify_waiters();
            inner.record_release();
            // The guard counts as ended from here on, so the cleanup that
            // its drop would start is off: keep one armed until the store
            // answered. Dropped midway, or answered with an error (the
            // call may or may not have landed), the end is sent again in
            // the background as this owner.
            let again = crate::settle::Armed::new(EndClaim {
                backend: &inner.backend,
                name: &inner.name,
                owner: inner.owner,
                end,
            });
            let r = again
                .settle_with(inner.backend.end(&inner.name, &inner.owner, end))
                .await;
            metrics::observe(inner.backend.store(), &r);
            if r? {
                Ok(())
            } else {
                Err(Error::NotHeld {
                    name: inner.name.to_string(),
                })
            }
        }
        .instrument(span.clone())
        .await;
        span.record("outcome", end_outcome(&r));
        r
    }

    /// Same as [`release`](Guard::release), in lease words.
    pub async fn revoke(self) -> Result<()> {
        self.release().await
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.stop_watchdog();
        if self.inner.is_released() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(name = %self.inner.name, "guard dropped outside a runtime; the TTL will free it");
            return;
        };
        let inner = self.inner.clone();
        let span = tracing::debug_span!(
            "coord.release",
            store = inner.backend.store(),
            kind = inner.backend.kind(),
            name = %inner.name,
            on_drop = true,
            outcome = tracing::field::Empty
        );
        rt.spawn(
            async move {
                let _op = inner.op.lock().await;
                if inner.released.swap(true, Ordering::AcqRel) {
                    return;
                }
                inner.ended.notify_waiters();
                inner.record_release();
                if matches!(inner.backend, ClaimBackend::Delivery { .. }) {
                    metrics::queue_op(inner.backend.store(), "give_back");
                }
                let r = end_retrying(&inner.backend, &inner.name, &inner.owner, End::Release).await;
                inner.end_companion().await;
                let span = tracing::Span::current();
                match r {
                    Ok(true) => {
                        span.record("outcome", "ok");
                    }
                    Ok(false) => {
                        span.record("outcome", "not_held");
                    }
                    Err(e) => {
                        span.record("outcome", "error");
                        metrics::error(inner.backend.store(), &e);
                        tracing::debug!(name = %inner.name, error = %e, "release on drop failed; the TTL will free it");
                    }
                }
            }
            .instrument(span),
        );
    }
}
