//! What a guard asks of the store, for each kind of claim, and the undo
//! that ends a claim again while the store does not answer.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{Election, Lease, Lock, Semaphore};
use crate::error::Result;
use crate::late::Stepped;
use crate::queue_backend::{Lane, MessageId, Queue};
use crate::types::{Capabilities, OwnerToken};

/// The store operations a guard needs, for each kind of claim.
#[derive(Clone)]
pub(crate) enum ClaimBackend {
    Lock(Stepped<dyn Lock>),
    Lease(Stepped<dyn Lease>),
    Election(Stepped<dyn Election>),
    Semaphore(Stepped<dyn Semaphore>),
    /// A queue delivery: the claim is message `id` of `lane`, in flight to
    /// the guard's owner token; release gives it back (a nack, no delay).
    Delivery {
        queue: Arc<dyn Queue>,
        lane: Lane,
        id: MessageId,
    },
}

/// How a guard ends: released (a delivery: given back at once), or, for a
/// delivery, acked or given back after a delay.
#[derive(Debug, Clone, Copy)]
pub(crate) enum End {
    Release,
    Ack,
    Nack(Duration),
}

impl ClaimBackend {
    /// The store's name (`Capabilities::backend`), for metrics.
    pub(crate) fn store(&self) -> &'static str {
        self.capabilities().backend
    }

    /// The `kind` label of metrics: `lock`, `lease`, `leadership`, `permit`.
    pub(crate) fn metric_kind(&self) -> &'static str {
        match self {
            ClaimBackend::Semaphore(_) => "permit",
            ClaimBackend::Delivery { .. } => "delivery",
            other => other.kind(),
        }
    }

    pub(crate) fn kind(&self) -> &'static str {
        match self {
            ClaimBackend::Lock(_) => "lock",
            ClaimBackend::Lease(_) => "lease",
            ClaimBackend::Election(_) => "leadership",
            ClaimBackend::Semaphore(_) => "semaphore permit",
            ClaimBackend::Delivery { .. } => "queue delivery",
        }
    }

    pub(super) fn capabilities(&self) -> &Capabilities {
        match self {
            ClaimBackend::Lock(b) => b.capabilities(),
            ClaimBackend::Lease(b) => b.capabilities(),
            ClaimBackend::Election(b) => b.capabilities(),
            ClaimBackend::Semaphore(b) => b.capabilities(),
            ClaimBackend::Delivery { queue, .. } => queue.capabilities(),
        }
    }

    pub(super) async fn renew(
        &self,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<bool> {
        match self {
            ClaimBackend::Lock(b) => b.extend(name, owner, ttl).await,
            ClaimBackend::Lease(b) => b.renew(name, owner, ttl).await,
            ClaimBackend::Election(b) => b.renew(name, owner, ttl).await,
            ClaimBackend::Semaphore(b) => b.extend(name, owner, ttl).await,
            ClaimBackend::Delivery { queue, lane, id } => {
                queue.extend(name, *lane, *id, owner, ttl).await
            }
        }
    }

    pub(crate) async fn release(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        self.end(name, owner, End::Release).await
    }

    pub(crate) async fn end(&self, name: &str, owner: &OwnerToken, end: End) -> Result<bool> {
        match self {
            ClaimBackend::Lock(b) => b.release(name, owner).await,
            ClaimBackend::Lease(b) => b.revoke(name, owner).await,
            ClaimBackend::Election(b) => b.resign(name, owner).await,
            ClaimBackend::Semaphore(b) => b.release(name, owner).await,
            ClaimBackend::Delivery { queue, lane, id } => match end {
                End::Ack => queue.ack(name, *lane, *id, owner).await,
                End::Release => queue.nack(name, *lane, *id, owner, Duration::ZERO).await,
                End::Nack(delay) => queue.nack(name, *lane, *id, owner, delay).await,
            },
        }
    }
}

/// The undo of an operation that may have left a claim on the store for
/// `owner` (an acquire dropped or failed midway, a release, ack or nack
/// whose reply never came): end it as that owner (`end`), sent again while
/// the store does not answer. Owner-checked, so it never touches another
/// owner's claim, and ending what is not there changes nothing.
pub(crate) struct EndClaim<'a> {
    pub(crate) backend: &'a ClaimBackend,
    pub(crate) name: &'a str,
    pub(crate) owner: OwnerToken,
    pub(crate) end: End,
}

/// End `owner`'s claim on `name` the way `end` says, sending it again
/// while the store does not answer.
pub(crate) async fn end_retrying(
    backend: &ClaimBackend,
    name: &str,
    owner: &OwnerToken,
    end: End,
) -> Result<bool> {
    crate::settle::retrying(backend.store(), "end_claim", name, || {
        backend.end(name, owner, end)
    })
    .await
}

impl crate::settle::Undo for EndClaim<'_> {
    fn start(self) {
        let (backend, name, owner, end) = (
            self.backend.clone(),
            self.name.to_string(),
            self.owner,
            self.end,
        );
        crate::settle::spawn(async move {
            let _ = end_retrying(&backend, &name, &owner, end).await;
        });
    }
}
