//! A lock or a one-permit semaphore through the raw traits, for tests
//! that run one scenario on both (the late-copy races of
//! `coord-redis` and `coord-postgres`, `tests/it/same_owner_one_client.rs`).

use std::time::Duration;

use std::sync::LazyLock;

use coord_core::late::Unanswered;
use coord_core::{Attempt, Lock, OwnerToken, PermitRequest, Result, Semaphore};

/// The book of unanswered steps these calls keep, as the core's handles
/// do (`coord_core::late::Stepped`): an owner whose attempt went
/// unanswered has its next extend and its release marked. Owners are
/// random per scenario, so one book serves every scenario of the process.
static BOOK: LazyLock<Unanswered> = LazyLock::new(Unanswered::default);

/// Which raw trait a scenario goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimKind {
    /// [`Lock`].
    Lock,
    /// [`Semaphore`], one permit of one.
    Semaphore,
}

impl ClaimKind {
    /// `owner`'s single attempt on `name` for `ttl` (a semaphore: one
    /// permit of one, not queued).
    pub async fn attempt<B: Lock + Semaphore + ?Sized>(
        self,
        b: &B,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Attempt> {
        let req = PermitRequest {
            permits: 1,
            total: 1,
            ttl,
            queue: false,
        };
        BOOK.attempt_with(name, owner.step(), |step| async move {
            match self {
                ClaimKind::Lock => Lock::try_acquire(b, name, step, ttl).await,
                ClaimKind::Semaphore => Semaphore::try_acquire(b, name, step, &req).await,
            }
        })
        .await
    }

    /// `owner`'s release of `name`.
    pub async fn release<B: Lock + Semaphore + ?Sized>(
        self,
        b: &B,
        name: &str,
        owner: &OwnerToken,
    ) -> Result<bool> {
        BOOK.ending(name, *owner, |step| async move {
            match self {
                ClaimKind::Lock => Lock::release(b, name, step).await,
                ClaimKind::Semaphore => Semaphore::release(b, name, step).await,
            }
        })
        .await
    }

    /// `owner`'s extend of its claim on `name` to `ttl`.
    pub async fn extend<B: Lock + Semaphore + ?Sized>(
        self,
        b: &B,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<bool> {
        BOOK.step(name, *owner, |step| async move {
            match self {
                ClaimKind::Lock => Lock::extend(b, name, step, ttl).await,
                ClaimKind::Semaphore => Semaphore::extend(b, name, step, ttl).await,
            }
        })
        .await
    }

    /// The owners holding `name` now (panics on a store error).
    pub async fn holders<B: Lock + Semaphore + ?Sized>(self, b: &B, name: &str) -> Vec<OwnerToken> {
        self.try_holders(b, name).await.expect("inspect")
    }

    /// The owners holding `name` now, or the store's error.
    pub async fn try_holders<B: Lock + Semaphore + ?Sized>(
        self,
        b: &B,
        name: &str,
    ) -> Result<Vec<OwnerToken>> {
        let r = match self {
            ClaimKind::Lock => Lock::inspect(b, name).await,
            ClaimKind::Semaphore => Semaphore::inspect(b, name).await,
        };
        Ok(r?.holders.iter().map(|h| h.owner).collect())
    }
}
