//! Taking a claim, shared by locks, leases, elections and semaphores: the
//! attempt loop with its wait, the guard it builds, and the cleanup of an
//! attempt whose outcome is unknown or that left a place in the store's
//! queue.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Attempt;
use crate::claim::{ClaimBackend, End, EndClaim, Guard};
use crate::error::{Error, Result};
use crate::metrics;
use crate::settle::Armed;
use crate::types::OwnerToken;
use crate::wait;
use crate::wait::WaitOutcome;

/// The outcome of a force release: a live claim was `removed`, or the
/// name was `free`.
pub(crate) fn removed_or_free(removed: &bool) -> &'static str {
    if *removed { "removed" } else { "free" }
}

/// Whether the store may keep a waiter's place in line for an owner whose
/// acquire did not succeed, so the core must remove it (with `release`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Queueing {
    /// The store keeps nothing for a refused attempt.
    No,
    /// The store queues waiters once they have subscribed (locks and
    /// elections on a fair store, as etcd's key-per-waiter queue).
    OnceSubscribed,
    /// Every refused attempt joins the store's queue, from the first one
    /// (a FIFO semaphore's waiting acquire).
    FromFirstAttempt,
}

impl Queueing {
    pub(crate) fn once_subscribed(fair: bool) -> Self {
        if fair {
            Queueing::OnceSubscribed
        } else {
            Queueing::No
        }
    }
}

/// Shared by locks, leases, elections and semaphores: attempt (waiting if
/// asked), build the guard, and clean up after an ambiguous failure or a
/// wait that left a place in the store's queue.
///
/// `subscribe` gets the attempt's owner token, for stores that wake
/// individual waiters.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn acquire_claim<A, AF, S, SF>(
    backend: ClaimBackend,
    operation: &'static str,
    name: &str,
    ttl: Duration,
    wait: Duration,
    poll: Duration,
    queued: Queueing,
    mut attempt: A,
    subscribe: S,
) -> Result<Guard>
where
    A: FnMut(OwnerToken) -> AF,
    AF: Future<Output = Result<Attempt>>,
    S: FnOnce(OwnerToken) -> SF,
    SF: Future<Output = Result<crate::wake::Waiter>>,
{
    let owner = OwnerToken::random();
    let start = Instant::now();
    let deadline = wait::deadline_in(wait);
    // The validity deadline counts from before the request that won was
    // sent: remember the send time of each attempt.
    let sent = std::sync::Mutex::new(start);
    // An attempt may be granted (or a queueing store may keep our place in
    // line) without this acquire learning it: a lost reply, or this future
    // dropped mid-wait. The cleanup stays armed until the outcome is known
    // and nothing of ours is left on the store.
    let cleanup = Armed::new(EndClaim {
        backend: &backend,
        name,
        owner,
        end: End::Release,
    });
    // In `coord_waiting` from the first refusal until this acquire ends.
    let waiting = std::sync::OnceLock::new();
    let outcome = wait::until(
        || {
            let now = Instant::now();
            *sent.lock().unwrap_or_else(|p| p.into_inner()) = now;
            attempt(owner)
        },
        || {
            let _ = waiting.set(metrics::Counted::waiting(
                backend.store(),
                backend.metric_kind(),
            ));
            subscribe(owner)
        },
        deadline,
        poll,
    )
    .await;
    drop(waiting);
    let (store, kind) = (backend.store(), backend.metric_kind());
    // The caller's span (`coord.lock.acquire`, ...) gets the outcome.
    let span = tracing::Span::current();
    let outcome_of = |r: &Result<WaitOutcome>| match r {
        Ok(o) if o.granted.is_some() => "granted",
        Ok(o) if o.last_error.is_some() => "error",
        Ok(_) => "timeout",
        Err(_) => "error",
    };
    span.record("outcome", outcome_of(&outcome));
    span.record("waited_ms", start.elapsed().as_millis() as u64);
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            cleanup.undo();
            metrics::acquire(store, kind, "error");
            metrics::error(store, &e);
            return Err(e);
        }
    };
    match outcome.granted {
        Some(token) => {
            metrics::granted(store, kind, start.elapsed(), outcome.subscribed);
            let sent_at = *sent.lock().unwrap_or_else(|p| p.into_inner());
            // The guard owns the grant from here on (its release, or its
            // drop's): nothing to undo.
            cleanup.settled();
            Ok(Guard::new(backend, name, owner, token, ttl, sent_at))
        }
        None => {
            // Whether a place in line of ours may be on the store: every
            // refused attempt of a FIFO semaphore's, and those after the
            // subscription on a fair store (etcd's key-per-waiter queue).
            let in_line = match queued {
                Queueing::FromFirstAttempt => true,
                Queueing::OnceSubscribed => outcome.subscribed,
                Queueing::No => false,
            };
            if in_line {
                // Our place in line must be gone before the caller hears
                // "timed out": a request it makes next must not find itself
                // queued behind us. So remove it now, not in the background,
                // with the cleanup still armed: if the caller's timeout drops
                // this future during that round trip, or the store does not
                // answer it, it is sent again in the background (a place left
                // in line holds up every waiter behind it).
                if let Err(e) = cleanup.settle_with(backend.release(name, &owner)).await {
                    tracing::debug!(name, error = %e, "leaving the queue after a timed-out acquire failed; trying again in the background");
                }
            } else if outcome.ambiguous {
                cleanup.undo();
            } else {
                // Every reply seen, every one a refusal: nothing of ours.
                cleanup.settled();
            }
            match outcome.last_error {
                Some(e) => {
                    metrics::acquire(store, kind, "error");
                    metrics::error(store, &e);
                    Err(e)
                }
                None => {
                    metrics::acquire(store, kind, "timeout");
                    Err(Error::Timeout {
                        operation,
                        name: name.to_string(),
                        waited: start.elapsed(),
                    })
                }
            }
        }
    }
}
