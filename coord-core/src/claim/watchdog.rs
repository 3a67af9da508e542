//! The watchdog: renews a claim a third of its TTL after each renewal,
//! and fires the lost signal when it cannot renew in time.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::Inner;
use crate::metrics;

pub(super) async fn watchdog(inner: Arc<Inner>, stop: CancellationToken) {
    let span = tracing::debug_span!(
        "coord.watchdog",
        store = inner.backend.store(),
        kind = inner.backend.kind(),
        name = %inner.name,
        outcome = tracing::field::Empty
    );
    let watched = inner.clone();
    async move {
        loop {
            // Renew when two thirds of the TTL are left: a third of the TTL
            // after each renewal, and at once for a watchdog started late.
            // An explicit extend re-plans (its TTL may be shorter).
            let replanned = inner.replan.notified();
            tokio::pin!(replanned);
            replanned.as_mut().enable();
            let counted = inner.counted();
            let renew_at = inner
                .deadline()
                .checked_sub(counted * 2 / 3)
                .unwrap_or_else(Instant::now);
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = &mut replanned => continue,
                _ = tokio::time::sleep_until(renew_at.max(Instant::now() + Duration::from_millis(1))) => {}
            }
            if inner.is_lost() {
                return;
            }
            // Renew, retrying until the validity deadline.
            loop {
                let op = tokio::select! {
                    biased;
                    g = inner.op.lock() => g,
                    _ = stop.cancelled() => return,
                };
                if stop.is_cancelled() || inner.is_released() || inner.is_lost() {
                    return;
                }
                let deadline = inner.deadline();
                let sent_at = Instant::now();
                if sent_at >= deadline {
                    inner.mark_lost("watchdog could not renew before the validity deadline");
                    return;
                }
                let ttl = inner.ttl();
                let n = inner.sending(sent_at, ttl);
                let r = tokio::time::timeout_at(
                    deadline,
                    inner.backend.renew(&inner.name, &inner.owner, ttl),
                )
                .await;
                if matches!(r, Ok(Ok(_))) {
                    inner.answered(n);
                }
                drop(op);
                if !matches!(r, Ok(Ok(true))) {
                    metrics::renewal(inner.backend.store(), inner.backend.metric_kind(), false);
                }
                if let Ok(Err(e)) = &r {
                    metrics::error(inner.backend.store(), e);
                }
                match r {
                    Ok(Ok(true)) if inner.is_lost() => {
                        // Lost while the renewal was on its way: stays lost.
                        return;
                    }
                    Ok(Ok(true)) => {
                        metrics::renewal(inner.backend.store(), inner.backend.metric_kind(), true);
                        inner.renewed(n, sent_at, ttl);
                        tracing::trace!("renewed");
                        break;
                    }
                    Ok(Ok(false)) => {
                        inner.mark_lost("the store no longer holds the claim for this owner");
                        return;
                    }
                    Ok(Err(e)) if !e.is_retryable() => {
                        tracing::warn!(error = %e, "renewal failed");
                        inner.mark_lost("renewal failed with a non-retryable error");
                        return;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "renewal failed; retrying until the validity deadline");
                    }
                    Err(_) => {
                        inner.mark_lost("renewal did not complete before the validity deadline");
                        return;
                    }
                }
                let retry = (ttl / 20).max(Duration::from_millis(5));
                let until = (Instant::now() + retry).min(deadline);
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep_until(until) => {}
                }
            }
        }
    }
    .instrument(span.clone())
    .await;
    // It ends when the claim is released (or the watchdog stopped), or
    // when ownership was lost.
    span.record(
        "outcome",
        if watched.is_lost() { "lost" } else { "stopped" },
    );
}
