//! The backend traits: the small, store-specific operations each backend
//! implements. Everything else (guards, waiting, watchdog, validation,
//! ordering) is built on them once, in this crate.
//!
//! Arguments reaching these methods are already validated (names, TTLs
//! rounded up to the backend's granularity, quotas, costs, party counts), so
//! a backend only talks to its store. Names must reach the store as data
//! (keys, bind parameters), never spliced into script or SQL text.
//!
//! Every method must be bounded in time: a network backend wraps each call
//! in a timeout and reports [`Error::Unavailable`](crate::Error::Unavailable)
//! when it fires.
//!
//! **Cost.** Each method is expected to be one atomic step on the store:
//! one round trip (one script, one statement, one transaction), so an
//! uncontended acquire + release is two. `subscribe` may cost a round trip
//! the first time a name is waited on.
//!
//! **Steps.** Every mutating call of a claim trait (an attempt, a
//! release, an extend or renewal) carries a [`Step`]: its owner (`owner`
//! in the docs below is `step.owner`), a stamp rising per process, and
//! whether it must leave a mark. A store whose requests can arrive late
//! (a network store) uses them to refuse a late copy of an owner's earlier
//! step, as [`late`](crate::late) describes; the core keeps the book of
//! unanswered steps, so a backend keeps none.
//!
//! **Cancel safety.** Every method may be cancelled (its future dropped) at
//! any await point. The store then holds either the old or the new state,
//! never a torn one; a claim granted by a cancelled attempt is freed by its
//! TTL, and the core cleans up after attempts whose outcome it did not see
//! (it calls `release` with the same owner token, which is why attempts are
//! idempotent per owner).

use std::time::Duration;

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::inspect::ClaimRecord;
use crate::types::{
    Arrival, Capabilities, Decision, FencingToken, LeaderInfo, OwnerToken, Quota, Step,
};
use crate::wake::Waiter;

mod operator;
mod semaphore;

pub use operator::{Listed, Lister, Probe, ServerInfo};
pub use semaphore::{PermitRequest, Semaphore};

/// The error of a default method a backend did not override.
fn unsupported(caps: &Capabilities, what: &'static str) -> Error {
    Error::Unsupported {
        backend: caps.backend,
        primitive: what,
        reason: caps.why_unsupported(what),
    }
}

/// The outcome of one attempt to take a claim (lock, lease, leadership).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// Taken (or already held by the same owner token: attempts are
    /// idempotent per owner). Carries the grant's fencing token.
    Granted(FencingToken),
    /// Held by somebody else. `expires_in` is the holder's remaining TTL as
    /// the store sees it, when the store can tell; waiters retry no later
    /// than that, so an expiring claim is taken over without a notification.
    Held {
        /// The current holder's remaining time, if known.
        expires_in: Option<Duration>,
    },
}

/// An exclusive, lease-bounded lock: the store-specific half.
///
/// Use it through [`Locks`](crate::Locks), which adds waiting, guards,
/// watchdog, ordering and validation.
#[async_trait]
pub trait Lock: Send + Sync + 'static {
    /// What this backend promises.
    fn capabilities(&self) -> &Capabilities;

    /// One attempt to take `name` for `owner` for `ttl`, atomically issuing a
    /// fresh fencing token on success. If `owner` already holds `name`, an
    /// attempt through the same client succeeds again with the same token
    /// (so a retry after a lost reply is safe); it may refresh the TTL.
    /// Through another client a store may answer `Held` instead (etcd binds
    /// a claim to the lease of the client that took it); it never grants
    /// another token while the first grant lives (except a higher one on a
    /// store with [`FencingDurability::BestEffort`](crate::FencingDurability::BestEffort):
    /// Redlock, when a master not yet set to the grant's token still holds
    /// its own), and a release by owner through any client
    /// frees the claim (conformance case
    /// `lock_same_owner_through_another_client_gets_no_other_token`).
    async fn try_acquire(&self, name: &str, step: Step, ttl: Duration) -> Result<Attempt>;

    /// Delete the lock iff `owner` holds it (compare-and-delete, atomic on
    /// the server), waking one waiter. `Ok(false)`: not held by `owner`,
    /// nothing changed. A release whose reply never came may still land
    /// later and free whatever `owner` then holds on `name`: an owner that
    /// takes `name` again after such a release must wait out
    /// [`LATE_COPY_HORIZON`](crate::late::LATE_COPY_HORIZON) first, or use
    /// a new token (as the guards do: every acquire is an owner of its
    /// own).
    async fn release(&self, name: &str, step: Step) -> Result<bool>;

    /// Set the remaining TTL to `ttl` iff `owner` still holds the lock
    /// (compare-and-expire). Never resurrects an expired lock, never changes
    /// the fencing token. `Ok(false)`: not held, nothing changed.
    async fn extend(&self, name: &str, step: Step, ttl: Duration) -> Result<bool>;

    /// Delete the lock whoever holds it (an operator's tool, and how tests
    /// take ownership away behind a guard's back). Wakes one waiter.
    /// Returns whether a live lock was removed.
    async fn force_release(&self, name: &str) -> Result<bool>;

    /// Register `owner`, whose attempt on `name` was just refused, for
    /// wake-ups before attempting again (a store that queues waiters can
    /// wake exactly the one whose turn came). The default never wakes:
    /// waiting then relies on polling alone.
    async fn subscribe(&self, _name: &str, _owner: &OwnerToken) -> Result<Waiter> {
        Ok(Waiter::never())
    }

    /// [`try_acquire`](Lock::try_acquire), storing `metadata` (JSON bytes,
    /// at most [`MAX_METADATA_BYTES`](crate::inspect::MAX_METADATA_BYTES),
    /// checked by the core) with the grant, for [`inspect`](Lock::inspect).
    /// A retry by the same owner keeps the grant as it is. The default is
    /// [`Error::Unsupported`].
    async fn try_acquire_with_metadata(
        &self,
        _name: &str,
        _step: Step,
        _ttl: Duration,
        _metadata: &[u8],
    ) -> Result<Attempt> {
        Err(unsupported(self.capabilities(), "holder metadata"))
    }

    /// The live holder of `name` (none, or one), as the store records it;
    /// `waiters` where the store queues them. The default is
    /// [`Error::Unsupported`].
    async fn inspect(&self, _name: &str) -> Result<ClaimRecord> {
        Err(unsupported(self.capabilities(), "inspect"))
    }
}

/// A named, time-bounded claim: membership, heartbeats ("is worker 7
/// alive?"). The store-specific half of [`Leases`](crate::Leases).
///
/// A name has at most one live lease at a time.
#[async_trait]
pub trait Lease: Send + Sync + 'static {
    /// What this backend promises.
    fn capabilities(&self) -> &Capabilities;

    /// Grant `name` to `owner` for `ttl` unless another owner holds a live
    /// lease on it. Idempotent per owner, like [`Lock::try_acquire`].
    async fn grant(&self, name: &str, step: Step, ttl: Duration) -> Result<Attempt>;

    /// Reset the remaining time to `ttl` iff `owner` still holds a live lease
    /// on `name`. Renewing an expired lease fails and resurrects nothing.
    async fn renew(&self, name: &str, step: Step, ttl: Duration) -> Result<bool>;

    /// End the lease at once for every observer, iff `owner` holds it.
    async fn revoke(&self, name: &str, step: Step) -> Result<bool>;

    /// The remaining time of the live lease on `name`, whoever holds it, as
    /// the store sees it; `None` when there is none.
    async fn remaining(&self, name: &str) -> Result<Option<Duration>>;

    /// [`grant`](Lease::grant), storing `metadata` (JSON bytes, checked by
    /// the core) with the lease, for [`inspect`](Lease::inspect). The
    /// default is [`Error::Unsupported`].
    async fn grant_with_metadata(
        &self,
        _name: &str,
        _step: Step,
        _ttl: Duration,
        _metadata: &[u8],
    ) -> Result<Attempt> {
        Err(unsupported(self.capabilities(), "holder metadata"))
    }

    /// The live holder of `name` (none, or one), as the store records it.
    /// The default is [`Error::Unsupported`].
    async fn inspect(&self, _name: &str) -> Result<ClaimRecord> {
        Err(unsupported(self.capabilities(), "inspect"))
    }
}

/// A source of fencing tokens per resource, independent of any lock.
#[async_trait]
pub trait FencingSource: Send + Sync + 'static {
    /// What this backend promises.
    fn capabilities(&self) -> &Capabilities;

    /// The next token for `resource`: strictly greater than every token
    /// handed out before for it, across all clients.
    async fn next(&self, resource: &str) -> Result<FencingToken>;
}

/// Leader election: the store-specific half of
/// [`Elections`](crate::Elections). Leadership is a claim whose term is a
/// fencing token.
#[async_trait]
pub trait Election: Send + Sync + 'static {
    /// What this backend promises.
    fn capabilities(&self) -> &Capabilities;

    /// One attempt to become leader of `name` as `candidate`; on success the
    /// term is a fresh fencing token. Idempotent per owner.
    async fn try_campaign(
        &self,
        name: &str,
        candidate: &str,
        step: Step,
        ttl: Duration,
    ) -> Result<Attempt>;

    /// Extend the leadership iff `owner` still leads. Never changes the term.
    async fn renew(&self, name: &str, step: Step, ttl: Duration) -> Result<bool>;

    /// Step down at once iff `owner` leads, waking the other candidates and
    /// observers.
    async fn resign(&self, name: &str, step: Step) -> Result<bool>;

    /// The live leader and its term, if any.
    async fn leader(&self, name: &str) -> Result<Option<LeaderInfo>>;

    /// The live leader with its grant as the store records it (owner
    /// token, term, remaining time where the store can tell), if any. The
    /// default is [`Error::Unsupported`].
    async fn inspect(&self, _name: &str) -> Result<Option<crate::inspect::LeaderRecord>> {
        Err(unsupported(self.capabilities(), "election inspect"))
    }

    /// Register for wake-ups on any change of leadership of `name`. The
    /// default never wakes: waiting then relies on polling alone.
    async fn subscribe(&self, _name: &str) -> Result<Waiter> {
        Ok(Waiter::never())
    }
}

/// A reusable barrier: the store-specific half of
/// [`Barriers`](crate::Barriers).
#[async_trait]
pub trait Barrier: Send + Sync + 'static {
    /// What this backend promises.
    fn capabilities(&self) -> &Capabilities;

    /// Record `participant` in the current generation of `name` (once:
    /// arriving again returns the same generation). When this is the
    /// `parties`-th distinct arrival, the generation completes and the next
    /// arrivals form the next one. A `parties` different from the one the
    /// current generation was started with is
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) and changes
    /// nothing.
    ///
    /// `arrival` identifies one wait: the core draws it once per
    /// [`Barriers::wait`](crate::Barriers::wait) and sends the same one on
    /// every retry. An arrival whose id was recorded in the generation that
    /// completed last (its reply was lost, and this is the retry) returns
    /// `Arrival { generation: that one, complete: true }` and changes
    /// nothing: a retried completing arrival never joins the next
    /// generation. Backends keep the ids of at least the last completed
    /// generation. An arrival id withdrawn from the current generation
    /// (see [`withdraw`](Barrier::withdraw)) is refused with
    /// [`Error::ArrivalLost`](crate::Error::ArrivalLost) and changes
    /// nothing. A participant arriving through a second arrival id (a
    /// second wait) while still in the generation counts once; each of its
    /// arrivals is withdrawn on its own.
    async fn arrive(
        &self,
        name: &str,
        parties: u32,
        participant: &str,
        arrival: &OwnerToken,
    ) -> Result<Arrival>;

    /// Whether `generation` of `name` has completed. A barrier state that
    /// can be lost and made again (swept, expired) carries the generation
    /// it was made at: `generation` below it belongs to a state that was
    /// lost with its arrivals, and is
    /// [`Error::ArrivalLost`](crate::Error::ArrivalLost), never "complete".
    async fn is_complete(&self, name: &str, generation: u64) -> Result<bool>;

    /// Undo one arrival: withdraw arrival `arrival` of `participant` from
    /// `generation` if that has not completed. Returns `true` if the
    /// arrival no longer counts (withdrawn, never recorded, or lost with
    /// an earlier state of the barrier), `false` if the generation had
    /// already completed (the participant passed).
    ///
    /// Only that arrival is undone: if the participant is also in the
    /// generation through another arrival (its next wait), that one stays.
    /// The arrival id is remembered (a tombstone) until the current
    /// generation completes: a late copy of the same arrival that lands
    /// after the withdraw is refused by [`arrive`](Barrier::arrive) with
    /// [`Error::ArrivalLost`](crate::Error::ArrivalLost) and changes
    /// nothing.
    ///
    /// `generation` is [`ANY_GENERATION`] when the caller never learned
    /// where the arrival stands (every reply to it was lost): the arrival
    /// is removed from the open generation if it is there, and tombstoned
    /// there either way; the answer is then `true` (an arrival that
    /// already completed a generation is not told apart). Nothing is
    /// arrived to find out: a copy sent now could complete a generation
    /// for a participant whose wait has already ended.
    async fn withdraw(
        &self,
        name: &str,
        generation: u64,
        participant: &str,
        arrival: &OwnerToken,
    ) -> Result<bool>;

    /// Register for wake-ups when a generation of `name` completes.
    async fn subscribe(&self, _name: &str) -> Result<Waiter> {
        Ok(Waiter::never())
    }
}

/// The `generation` to [`Barrier::withdraw`] an arrival from when its
/// generation was never learned: above every generation a store hands out
/// (they fit a signed 64-bit integer).
pub const ANY_GENERATION: u64 = i64::MAX as u64;

/// A rate limiter: the store-specific half of
/// [`RateLimiter`](crate::RateLimiter).
#[async_trait]
pub trait Limiter: Send + Sync + 'static {
    /// What this backend promises (`server_clock` tells whose clock the
    /// windows are measured on).
    fn capabilities(&self) -> &Capabilities;

    /// Check and, if admitted, record a request of `cost` against `key`
    /// under `quota`: one atomic step on the store. `1 <= cost <= limit` is
    /// guaranteed by the caller. State for different algorithms of the same
    /// key must not collide.
    async fn check(&self, key: &str, quota: &Quota, cost: u64) -> Result<Decision>;
}
