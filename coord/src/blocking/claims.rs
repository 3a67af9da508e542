//! The blocking guards: a held claim of any kind, ended by a blocking call
//! or on drop.

mod delivery;
mod leadership;
mod multi_guard;
mod permit;
mod rw_guard;

use std::time::{Duration, Instant};

use super::{Rt, check};
use crate::{CancellationToken, FencingToken, Ownership, Result};

pub use delivery::Delivery;
pub use leadership::Leadership;
pub use multi_guard::MultiGuard;
pub use permit::Permit;
pub use rw_guard::RwGuard;

/// The async claim a blocking guard holds, of whichever kind.
pub(super) enum Claim {
    Guard(coord_core::Guard),
    Permit(coord_core::Permit),
    Leadership(coord_core::Leadership),
    Rw(coord_core::RwGuard),
    Delivery(coord_core::Delivery),
}

impl std::fmt::Debug for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Claim::Guard(g) => g.fmt(f),
            Claim::Permit(p) => p.fmt(f),
            Claim::Leadership(l) => l.fmt(f),
            Claim::Rw(r) => r.fmt(f),
            Claim::Delivery(d) => d.fmt(f),
        }
    }
}

impl Claim {
    fn guard(&self) -> &coord_core::Guard {
        match self {
            Claim::Guard(g) => g,
            Claim::Permit(p) => p,
            Claim::Leadership(l) => l,
            Claim::Rw(r) => r,
            Claim::Delivery(d) => d,
        }
    }

    fn guard_mut(&mut self) -> &mut coord_core::Guard {
        match self {
            Claim::Guard(g) => g,
            Claim::Permit(p) => p,
            Claim::Leadership(l) => l,
            Claim::Rw(r) => r,
            Claim::Delivery(d) => d,
        }
    }

    /// Release it the way its kind says (a delivery is given back).
    async fn end(self) -> Result<()> {
        match self {
            Claim::Guard(g) => g.release().await,
            Claim::Permit(p) => p.release().await,
            Claim::Leadership(l) => l.resign().await,
            Claim::Rw(r) => r.release().await,
            Claim::Delivery(d) => d.nack(Duration::ZERO).await,
        }
    }
}

/// A held claim: a lock, a lease, or (inside [`Permit`], [`Leadership`],
/// [`RwGuard`], [`Delivery`]) semaphore permits, a leadership, a read or
/// write lock, a queue delivery. The blocking form of [`crate::Guard`],
/// with the same methods; see there for what each does.
///
/// # Dropping
/// Dropping it without [`release`](Guard::release) releases it on the
/// store before the drop returns (up to
/// [`RELEASE_ON_DROP_TIMEOUT`](super::RELEASE_ON_DROP_TIMEOUT), errors
/// ignored), so the next owner gets it at once. Inside an async runtime the
/// release runs in the background instead (see the
/// [module docs](super#inside-an-async-runtime)).
#[must_use = "dropping a guard releases it; keep it while you rely on the claim"]
pub struct Guard {
    /// `None` only once it ended (a release, or the drop).
    claim: Option<Claim>,
    rt: Rt,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.claim {
            Some(claim) => claim.fmt(f),
            None => f.write_str("Guard(ended)"),
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(claim) = self.claim.take() {
            self.rt.end_on_drop(claim, Claim::end);
        }
    }
}

impl Guard {
    pub(super) fn new(claim: Claim, rt: Rt) -> Guard {
        Guard {
            claim: Some(claim),
            rt,
        }
    }

    fn claim(&self) -> &Claim {
        self.claim
            .as_ref()
            .expect("a guard holds its claim until it ends")
    }

    fn core(&self) -> &coord_core::Guard {
        self.claim().guard()
    }

    /// Take the claim out to end it, unless this thread is inside an async
    /// runtime (then the guard is dropped, which releases it in the
    /// background).
    fn take(mut self) -> Result<(Claim, Rt)> {
        check()?;
        let claim = self
            .claim
            .take()
            .expect("a guard holds its claim until it ends");
        Ok((claim, self.rt.clone()))
    }

    /// The claim's name.
    pub fn name(&self) -> &str {
        self.core().name()
    }

    /// A fingerprint of this grant's owner token (16 hex digits), as
    /// `inspect` shows its holder; see [`crate::Guard::owner_id`].
    pub fn owner_id(&self) -> String {
        self.core().owner_id()
    }

    /// The fencing token of this grant (the term, for a leadership).
    pub fn fencing_token(&self) -> FencingToken {
        self.core().fencing_token()
    }

    /// The TTL the claim was last granted or renewed with.
    pub fn ttl(&self) -> Duration {
        self.core().ttl()
    }

    /// Time left before the local validity deadline; zero once it passed.
    /// Never more than the store would say.
    pub fn remaining(&self) -> Duration {
        self.core().remaining()
    }

    /// Whether the claim is still valid locally: not released, not lost,
    /// deadline not passed.
    pub fn is_valid(&self) -> bool {
        self.core().is_valid()
    }

    /// The local validity deadline; [`remaining`](Guard::remaining) is the
    /// time until it.
    pub fn valid_until(&self) -> Instant {
        self.core().valid_until().into_std()
    }

    /// Whether the watchdog is running.
    pub fn has_watchdog(&self) -> bool {
        self.core().has_watchdog()
    }

    /// Extend the claim so it expires `ttl` from now, iff this owner still
    /// holds it; see [`crate::Guard::extend`] for the rules.
    ///
    /// Errors: [`Error::NotHeld`](crate::Error::NotHeld) if the claim was
    /// lost; [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a
    /// bad TTL or inside an async runtime (nothing sent); store errors.
    pub fn extend(&self, ttl: Duration) -> Result<()> {
        self.rt.block_on(self.core().extend(ttl))
    }

    /// Same as [`extend`](Guard::extend), in lease words.
    pub fn renew(&self, ttl: Duration) -> Result<()> {
        self.extend(ttl)
    }

    /// Start the watchdog: it renews the claim every third of its TTL until
    /// release, on the client's runtime, while this thread does anything
    /// else. If it cannot renew before the validity deadline,
    /// [`lost_token`](Guard::lost_token) is cancelled and
    /// [`is_valid`](Guard::is_valid) turns false. Calling it again does
    /// nothing. Works inside an async runtime too.
    pub fn keep_alive(&mut self) {
        let _entered = self.rt.enter();
        self.claim
            .as_mut()
            .expect("a guard holds its claim until it ends")
            .guard_mut()
            .keep_alive();
    }

    /// Builder form of [`keep_alive`](Guard::keep_alive).
    pub fn with_watchdog(mut self) -> Guard {
        self.keep_alive();
        self
    }

    /// A cancellation token that is cancelled when ownership is lost (the
    /// watchdog could not renew in time, the store said the claim is gone,
    /// or the validity deadline passed): check
    /// [`is_cancelled`](CancellationToken::is_cancelled) between steps of
    /// the work under the claim.
    pub fn lost_token(&self) -> CancellationToken {
        // In the runtime's context, so its deadline timer can start.
        let _entered = self.rt.enter();
        self.core().lost_token()
    }

    /// A cheap, clonable view of this claim for the code running under it
    /// (on this thread or others): its fencing token, validity and lost
    /// token.
    pub fn ownership(&self) -> Ownership {
        // Start the deadline timer of the lost token here: the view's own
        // `lost_token` cannot start it outside a runtime.
        drop(self.lost_token());
        self.core().ownership()
    }

    /// Release the claim iff this owner still holds it (compare-and-delete
    /// on the store), after stopping the watchdog; wakes a waiter.
    ///
    /// Errors: [`Error::NotHeld`](crate::Error::NotHeld) if it had already
    /// expired or been taken over (nothing changed); store errors (sent
    /// again in the background while the client runs; the claim ends at its
    /// TTL at the latest); [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// inside an async runtime, where it is released in the background
    /// instead, as on drop.
    pub fn release(self) -> Result<()> {
        let (claim, rt) = self.take()?;
        rt.block_on(claim.end())
    }

    /// Same as [`release`](Guard::release), in lease words.
    pub fn revoke(self) -> Result<()> {
        self.release()
    }
}
