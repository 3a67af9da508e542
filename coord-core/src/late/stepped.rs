//! [`Stepped`]: a backend as the core calls it, each mutating call sent as
//! a [`Step`](crate::Step) with the book of unanswered steps kept here.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use super::Unanswered;
use crate::backend::{Attempt, Election, Lease, Lock, PermitRequest, Semaphore};
use crate::error::Result;
use crate::types::OwnerToken;

/// A claim backend (`dyn Lock`, `dyn Lease`, `dyn Election`,
/// `dyn Semaphore`) with the book of its owners' unanswered steps: its
/// methods take an owner token, as the handles have it, and send each call
/// as a [`Step`](crate::Step) of that owner (see the module docs):
/// attempts through [`Unanswered::attempt_with`], extends and renewals
/// through [`Unanswered::step`], releases through
/// [`Unanswered::ending`]. Everything else is the backend's own, through
/// `Deref`. Clones share the book.
///
/// ```
/// # async fn demo(lock: std::sync::Arc<dyn coord_core::Lock>) -> coord_core::Result<()> {
/// use std::time::Duration;
/// use coord_core::late::Stepped;
/// use coord_core::{Attempt, OwnerToken};
///
/// let lock = Stepped::new(lock);
/// let owner = OwnerToken::random();
/// if let Attempt::Granted(_) = lock.try_acquire("jobs", &owner, Duration::from_secs(5)).await? {
///     assert!(lock.release("jobs", &owner).await?);
/// }
/// # Ok(()) }
/// ```
pub struct Stepped<B: ?Sized> {
    backend: Arc<B>,
    book: Arc<Unanswered>,
}

impl<B: ?Sized> std::fmt::Debug for Stepped<B> {
    /// The book's size; the backend is not shown (it need not be `Debug`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stepped")
            .field("unanswered", &self.book.len())
            .finish_non_exhaustive()
    }
}

impl<B: ?Sized> Clone for Stepped<B> {
    fn clone(&self) -> Self {
        Stepped {
            backend: self.backend.clone(),
            book: self.book.clone(),
        }
    }
}

impl<B: ?Sized> Deref for Stepped<B> {
    type Target = B;
    fn deref(&self) -> &B {
        &self.backend
    }
}

impl<B: ?Sized> Stepped<B> {
    /// `backend`, with an empty book of its own.
    pub fn new(backend: Arc<B>) -> Self {
        Stepped {
            backend,
            book: Arc::default(),
        }
    }

    /// The backend itself (its calls take steps).
    pub fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    /// The book of owners with a step that may still land.
    pub fn book(&self) -> &Unanswered {
        &self.book
    }
}

impl Stepped<dyn Lock> {
    /// [`Lock::try_acquire`] as an attempt of `owner`.
    pub async fn try_acquire(
        &self,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Attempt> {
        let b = &self.backend;
        self.book
            .attempt_with(name, owner.step(), |s| b.try_acquire(name, s, ttl))
            .await
    }

    /// [`Lock::try_acquire_with_metadata`] as an attempt of `owner`.
    pub async fn try_acquire_with_metadata(
        &self,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
        metadata: &[u8],
    ) -> Result<Attempt> {
        let b = &self.backend;
        let send = |s| b.try_acquire_with_metadata(name, s, ttl, metadata);
        self.book.attempt_with(name, owner.step(), send).await
    }

    /// [`Lock::release`] as the release of `owner`.
    pub async fn release(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        let b = &self.backend;
        self.book.ending(name, *owner, |s| b.release(name, s)).await
    }

    /// [`Lock::extend`] as a step of `owner`.
    pub async fn extend(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        let b = &self.backend;
        self.book
            .step(name, *owner, |s| b.extend(name, s, ttl))
            .await
    }
}

impl Stepped<dyn Lease> {
    /// [`Lease::grant`] as an attempt of `owner`.
    pub async fn grant(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<Attempt> {
        let b = &self.backend;
        self.book
            .attempt_with(name, owner.step(), |s| b.grant(name, s, ttl))
            .await
    }

    /// [`Lease::grant_with_metadata`] as an attempt of `owner`.
    pub async fn grant_with_metadata(
        &self,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
        metadata: &[u8],
    ) -> Result<Attempt> {
        let b = &self.backend;
        let send = |s| b.grant_with_metadata(name, s, ttl, metadata);
        self.book.attempt_with(name, owner.step(), send).await
    }

    /// [`Lease::renew`] as a step of `owner`.
    pub async fn renew(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        let b = &self.backend;
        self.book
            .step(name, *owner, |s| b.renew(name, s, ttl))
            .await
    }

    /// [`Lease::revoke`] as the release of `owner`.
    pub async fn revoke(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        let b = &self.backend;
        self.book.ending(name, *owner, |s| b.revoke(name, s)).await
    }
}

impl Stepped<dyn Election> {
    /// [`Election::try_campaign`] as an attempt of `owner`.
    pub async fn try_campaign(
        &self,
        name: &str,
        candidate: &str,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Attempt> {
        let b = &self.backend;
        let send = |s| b.try_campaign(name, candidate, s, ttl);
        self.book.attempt_with(name, owner.step(), send).await
    }

    /// [`Election::renew`] as a step of `owner`.
    pub async fn renew(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        let b = &self.backend;
        self.book
            .step(name, *owner, |s| b.renew(name, s, ttl))
            .await
    }

    /// [`Election::resign`] as the release of `owner`.
    pub async fn resign(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        let b = &self.backend;
        self.book.ending(name, *owner, |s| b.resign(name, s)).await
    }
}

impl Stepped<dyn Semaphore> {
    /// [`Semaphore::try_acquire`] as an attempt of `owner`.
    pub async fn try_acquire(
        &self,
        name: &str,
        owner: &OwnerToken,
        request: &PermitRequest,
    ) -> Result<Attempt> {
        let b = &self.backend;
        let send = |s| b.try_acquire(name, s, request);
        self.book.attempt_with(name, owner.step(), send).await
    }

    /// [`Semaphore::try_acquire_with_metadata`] as an attempt of `owner`.
    pub async fn try_acquire_with_metadata(
        &self,
        name: &str,
        owner: &OwnerToken,
        request: &PermitRequest,
        metadata: &[u8],
    ) -> Result<Attempt> {
        let b = &self.backend;
        let send = |s| b.try_acquire_with_metadata(name, s, request, metadata);
        self.book.attempt_with(name, owner.step(), send).await
    }

    /// [`Semaphore::release`] as the release of `owner`.
    pub async fn release(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        let b = &self.backend;
        self.book.ending(name, *owner, |s| b.release(name, s)).await
    }

    /// [`Semaphore::extend`] as a step of `owner`.
    pub async fn extend(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        let b = &self.backend;
        self.book
            .step(name, *owner, |s| b.extend(name, s, ttl))
            .await
    }
}
