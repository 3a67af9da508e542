//! The semaphore trait: the store-specific half of
//! [`Semaphores`](crate::Semaphores).

use std::time::Duration;

use async_trait::async_trait;

use super::{Attempt, unsupported};
use crate::error::Result;
use crate::inspect::ClaimRecord;
use crate::types::{Capabilities, OwnerToken, Step};
use crate::wake::Waiter;

/// What one semaphore attempt asks for: `permits` of the `total` permits
/// of a name, for `ttl`. Already validated by the core
/// (`1 <= permits <= total <= MAX_PERMITS`, TTL rounded up).
///
/// ```
/// use std::time::Duration;
/// // What `Semaphores::acquire_many("pool", 2, 8, 30 s, 5 s)` sends.
/// let req = coord_core::PermitRequest {
///     permits: 2,
///     total: 8,
///     ttl: Duration::from_secs(30),
///     queue: true,
/// };
/// assert!(req.permits <= req.total);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PermitRequest {
    /// How many permits to take at once (all or none).
    pub permits: u32,
    /// How many permits the name has in all (`permits_total`).
    pub total: u32,
    /// The grant's time-to-live (and each renewal's).
    pub ttl: Duration,
    /// Whether a refused attempt joins (or keeps its place in) the store's
    /// queue of waiters. `false` for a single attempt
    /// ([`Semaphores::try_acquire`](crate::Semaphores::try_acquire)): a
    /// refused single attempt leaves nothing behind. Stores that do not
    /// queue ignore it.
    pub queue: bool,
}

/// A counting semaphore of lease-bounded permits: the store-specific half
/// of [`Semaphores`](crate::Semaphores), shaped like [`Lock`](super::Lock).
///
/// A name has `total` permits; each grant takes `permits` of them for one
/// owner token, carries a fresh fencing token, and ends at release or at
/// its TTL (so a crashed holder's permits come back). One owner holds at
/// most one grant per name.
///
/// **`total` binds while the name is in use.** While a name has live
/// holders (or queued waiters), an attempt with another `total` is
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) with field
/// `permits_total`, and changes nothing. Once the name is idle, the next
/// attempt sets a new total.
///
/// **Fairness.** A store that queues waiters ([`Semaphore::fifo`])
/// grants in arrival order: a request is granted only if it and every
/// request queued ahead of it fit into the free permits together, so a
/// request for `n` permits at the head of the queue is never overtaken by
/// smaller requests that came later. Queued waiters are woken by the store
/// when they can be granted.
///
/// Users want [`Semaphores`](crate::Semaphores); backend authors and tests
/// reach the raw trait through [`Coord::raw_semaphore`](crate::Coord::raw_semaphore):
///
/// ```
/// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
/// use std::time::Duration;
/// use coord_core::{Attempt, OwnerToken, PermitRequest};
/// let raw = coord.raw_semaphore()?;
/// let owner = OwnerToken::random();
/// let req = PermitRequest { permits: 1, total: 2, ttl: Duration::from_secs(5), queue: false };
/// // Each call is a step of the owner (see `coord_core::late`).
/// if let Attempt::Granted(token) = raw.try_acquire("pool", owner.step(), &req).await? {
///     println!("granted with fencing token {token}");
///     assert!(raw.release("pool", owner.step()).await?);
/// }
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Semaphore: Send + Sync + 'static {
    /// What this backend promises.
    fn capabilities(&self) -> &Capabilities;

    /// Whether this store queues semaphore waiters and grants them in
    /// arrival order (see the trait's fairness rule). The default is
    /// `false`: waiters race, and a large request may wait longer than
    /// smaller ones that came later.
    fn fifo(&self) -> bool {
        false
    }

    /// The most permits one request may take at once on this store (a
    /// larger request is [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// with field `permits`, before any I/O). The default is
    /// [`MAX_PERMITS`](crate::validate::MAX_PERMITS); a store that writes
    /// one key per permit in one transaction (etcd) takes fewer.
    fn max_permits_per_request(&self) -> u32 {
        crate::validate::MAX_PERMITS
    }

    /// One attempt to take `request.permits` of `request.total` permits of
    /// `name` for `owner`, all or none, atomically issuing a fresh fencing
    /// token on success. If `owner` already holds a grant of `name`, the
    /// attempt succeeds again with the same token (a retry after a lost
    /// reply is safe); it may refresh the TTL. Refused:
    /// [`Attempt::Held`] with, where known, the time until the next holder
    /// (or queued waiter ahead) expires.
    async fn try_acquire(&self, name: &str, step: Step, request: &PermitRequest)
    -> Result<Attempt>;

    /// Return `owner`'s permits iff it holds a live grant of `name`
    /// (compare-and-delete), waking the waiters that can now be granted.
    /// Also removes `owner`'s place in the queue, if any. `Ok(false)`: no
    /// live grant of `owner`, no permits changed.
    async fn release(&self, name: &str, step: Step) -> Result<bool>;

    /// Set the remaining TTL of `owner`'s grant to `ttl` iff it is still
    /// live (compare-and-expire). Never resurrects an expired grant, never
    /// changes the fencing token. `Ok(false)`: not held, nothing changed.
    async fn extend(&self, name: &str, step: Step, ttl: Duration) -> Result<bool>;

    /// Remove every grant of `name`, whoever holds it (an operator's tool,
    /// and how tests take permits away behind a guard's back). Waiters are
    /// woken. Returns whether a live grant was removed.
    async fn force_release(&self, name: &str) -> Result<bool>;

    /// Register for wake-ups of `owner`'s waiting acquire on `name`, before
    /// attempting (the owner lets a queueing store wake exactly the waiters
    /// it can grant). The default never wakes: waiting then relies on
    /// polling alone.
    async fn subscribe(&self, _name: &str, _owner: &OwnerToken) -> Result<Waiter> {
        Ok(Waiter::never())
    }

    /// [`try_acquire`](Semaphore::try_acquire), storing `metadata` (JSON
    /// bytes, checked by the core) with the grant, for
    /// [`inspect`](Semaphore::inspect). The default is
    /// [`Error::Unsupported`](crate::Error::Unsupported).
    async fn try_acquire_with_metadata(
        &self,
        _name: &str,
        _step: Step,
        _request: &PermitRequest,
        _metadata: &[u8],
    ) -> Result<Attempt> {
        Err(unsupported(self.capabilities(), "holder metadata"))
    }

    /// The live grants of `name` (each with its permits), as the store
    /// records them; `waiters`: how many requests are queued, where the
    /// store can tell. The default is [`Error::Unsupported`](crate::Error::Unsupported).
    async fn inspect(&self, _name: &str) -> Result<ClaimRecord> {
        Err(unsupported(self.capabilities(), "inspect"))
    }
}
