//! The blocking guards: a held claim of any kind, ended by a blocking call
//! or on drop.

use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant, SystemTime};

use super::{Rt, check};
use crate::{CancellationToken, FencingToken, Lane, Message, MessageId, Ownership, Result, RwMode};

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

/// Semaphore permits that are held: a [`Guard`] (through `Deref`), plus
/// how many. The blocking form of [`crate::Permit`]; released on drop as
/// every guard.
#[must_use = "dropping a permit releases it; keep it while you rely on it"]
pub struct Permit {
    guard: Guard,
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.guard.fmt(f)
    }
}

impl Permit {
    pub(super) fn new(permit: coord_core::Permit, rt: Rt) -> Permit {
        Permit {
            guard: Guard::new(Claim::Permit(permit), rt),
        }
    }

    fn inner(&self) -> &coord_core::Permit {
        match self.guard.claim() {
            Claim::Permit(p) => p,
            _ => unreachable!("a blocking permit holds a permit"),
        }
    }

    /// How many permits this grant holds.
    pub fn permits(&self) -> u32 {
        self.inner().permits()
    }

    /// The name's `permits_total` this grant was taken under.
    pub fn permits_total(&self) -> u32 {
        self.inner().permits_total()
    }

    /// Give the permits back iff this owner still holds them, waking the
    /// waiters that can now be granted. Errors: as [`Guard::release`].
    pub fn release(self) -> Result<()> {
        self.guard.release()
    }

    /// The underlying guard, for code written against [`Guard`].
    pub fn into_guard(self) -> Guard {
        self.guard
    }
}

impl Deref for Permit {
    type Target = Guard;
    fn deref(&self) -> &Guard {
        &self.guard
    }
}

impl DerefMut for Permit {
    fn deref_mut(&mut self) -> &mut Guard {
        &mut self.guard
    }
}

/// Leadership of an election: a [`Guard`] (through `Deref`) whose fencing
/// token is the term, plus the candidate's identity. The blocking form of
/// [`crate::Leadership`]; resigned on drop.
#[must_use = "dropping a leadership resigns it"]
pub struct Leadership {
    guard: Guard,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.guard.fmt(f)
    }
}

impl Leadership {
    pub(super) fn new(leadership: coord_core::Leadership, rt: Rt) -> Leadership {
        Leadership {
            guard: Guard::new(Claim::Leadership(leadership), rt),
        }
    }

    fn inner(&self) -> &coord_core::Leadership {
        match self.guard.claim() {
            Claim::Leadership(l) => l,
            _ => unreachable!("a blocking leadership holds a leadership"),
        }
    }

    /// The term: a fencing token, strictly increasing over the terms of
    /// this election.
    pub fn term(&self) -> FencingToken {
        self.inner().term()
    }

    /// The candidate identity this leadership was won with.
    pub fn candidate(&self) -> &str {
        self.inner().candidate()
    }

    /// Step down at once, waking the other candidates and observers.
    /// Errors: as [`Guard::release`].
    pub fn resign(self) -> Result<()> {
        self.guard.release()
    }

    /// The guard alone (the candidate identity dropped).
    pub(super) fn into_guard(self) -> Guard {
        self.guard
    }
}

impl Deref for Leadership {
    type Target = Guard;
    fn deref(&self) -> &Guard {
        &self.guard
    }
}

impl DerefMut for Leadership {
    fn deref_mut(&mut self) -> &mut Guard {
        &mut self.guard
    }
}

/// A held read or write lock: a [`Guard`] (through `Deref`), plus its mode.
/// The blocking form of [`crate::RwGuard`]; released on drop.
#[must_use = "dropping a read-write guard releases it"]
pub struct RwGuard {
    guard: Guard,
}

impl std::fmt::Debug for RwGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.guard.fmt(f)
    }
}

impl RwGuard {
    pub(super) fn new(rw: coord_core::RwGuard, rt: Rt) -> RwGuard {
        RwGuard {
            guard: Guard::new(Claim::Rw(rw), rt),
        }
    }

    fn inner(&self) -> &coord_core::RwGuard {
        match self.guard.claim() {
            Claim::Rw(r) => r,
            _ => unreachable!("a blocking read-write guard holds a read-write guard"),
        }
    }

    /// Read or write.
    pub fn mode(&self) -> RwMode {
        self.inner().mode()
    }

    /// The lock's name (as given to [`RwLocks::read`](super::RwLocks::read)
    /// or [`RwLocks::write`](super::RwLocks::write)).
    pub fn name(&self) -> &str {
        self.inner().name()
    }

    /// The underlying guard, for code written against [`Guard`].
    pub fn into_guard(self) -> Guard {
        self.guard
    }

    /// Release it iff still held, waking the waiters that can now be
    /// granted. Errors: as [`Guard::release`].
    pub fn release(self) -> Result<()> {
        self.guard.release()
    }
}

impl Deref for RwGuard {
    type Target = Guard;
    fn deref(&self) -> &Guard {
        &self.guard
    }
}

impl DerefMut for RwGuard {
    fn deref_mut(&mut self) -> &mut Guard {
        &mut self.guard
    }
}

/// A message delivered to this consumer: a [`Guard`] (through `Deref`:
/// fencing token, [`extend`](Guard::extend) of the visibility,
/// [`keep_alive`](Guard::keep_alive), [`lost_token`](Guard::lost_token)),
/// plus the message. The blocking form of [`crate::Delivery`].
///
/// End it with [`ack`](Delivery::ack) or [`nack`](Delivery::nack).
/// Dropped without either, it is given back at once (a `nack` without
/// delay), blocking as a guard's release on drop does.
#[must_use = "dropping a delivery gives it back; ack or nack it"]
pub struct Delivery {
    guard: Guard,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.guard.fmt(f)
    }
}

impl Delivery {
    pub(super) fn new(delivery: coord_core::Delivery, rt: Rt) -> Delivery {
        Delivery {
            guard: Guard::new(Claim::Delivery(delivery), rt),
        }
    }

    fn inner(&self) -> &coord_core::Delivery {
        match self.guard.claim() {
            Claim::Delivery(d) => d,
            _ => unreachable!("a blocking delivery holds a delivery"),
        }
    }

    /// Take the delivery out to end it (see [`Guard::take`]).
    fn take(self) -> Result<(coord_core::Delivery, Rt)> {
        match self.guard.take()? {
            (Claim::Delivery(d), rt) => Ok((d, rt)),
            _ => unreachable!("a blocking delivery holds a delivery"),
        }
    }

    /// The message id.
    pub fn id(&self) -> MessageId {
        self.inner().id()
    }

    /// The queue's name.
    pub fn queue(&self) -> &str {
        self.inner().queue()
    }

    /// The lane it was popped from.
    pub fn lane(&self) -> Lane {
        self.inner().lane()
    }

    /// The payload bytes.
    pub fn payload(&self) -> &[u8] {
        self.inner().payload()
    }

    /// The payload decoded from JSON.
    ///
    /// Errors: [`Error::Payload`](crate::Error::Payload) if it is not a `T`
    /// (the delivery is unchanged).
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        self.inner().json()
    }

    /// Its group (`None`: the group `""`).
    pub fn group(&self) -> Option<&str> {
        self.inner().group()
    }

    /// How many times it has been delivered, this time included.
    pub fn attempts(&self) -> u32 {
        self.inner().attempts()
    }

    /// When it was pushed (the store's clock where it has one).
    pub fn enqueued_at(&self) -> SystemTime {
        self.inner().enqueued_at()
    }

    /// The whole message.
    pub fn message(&self) -> &Message {
        self.inner().message()
    }

    /// Done: delete the message iff this delivery still holds it.
    ///
    /// Errors: as [`crate::Delivery::ack`]; inside an async runtime
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument), and the
    /// delivery is given back in the background, as on drop.
    pub fn ack(self) -> Result<()> {
        let (delivery, rt) = self.take()?;
        rt.block_on(delivery.ack())
    }

    /// Give the message back iff this delivery still holds it: deliverable
    /// again after `delay` (zero: at once), attempt count kept.
    ///
    /// Errors: as [`crate::Delivery::nack`]; inside an async runtime as
    /// [`ack`](Delivery::ack).
    pub fn nack(self, delay: Duration) -> Result<()> {
        let (delivery, rt) = self.take()?;
        rt.block_on(delivery.nack(delay))
    }
}

impl Deref for Delivery {
    type Target = Guard;
    fn deref(&self) -> &Guard {
        &self.guard
    }
}

impl DerefMut for Delivery {
    fn deref_mut(&mut self) -> &mut Guard {
        &mut self.guard
    }
}

/// Several locks taken by [`Locks::acquire_all`](super::Locks::acquire_all),
/// in sorted order. The blocking form of [`crate::MultiGuard`]; every lock
/// is released on drop.
#[must_use = "dropping it releases every lock; keep it while you rely on the locks"]
pub struct MultiGuard {
    /// `None` only once released (or dropped).
    inner: Option<coord_core::MultiGuard>,
    rt: Rt,
}

impl std::fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Some(m) => m.fmt(f),
            None => f.write_str("MultiGuard(ended)"),
        }
    }
}

impl Drop for MultiGuard {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            self.rt.end_on_drop(inner, coord_core::MultiGuard::release);
        }
    }
}

impl MultiGuard {
    pub(super) fn new(inner: coord_core::MultiGuard, rt: Rt) -> MultiGuard {
        MultiGuard {
            inner: Some(inner),
            rt,
        }
    }

    fn inner(&self) -> &coord_core::MultiGuard {
        self.inner
            .as_ref()
            .expect("a multi-guard holds its locks until it ends")
    }

    /// The held locks' names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.inner().names()
    }

    /// The fencing token of the lock called `name`.
    pub fn fencing_token(&self, name: &str) -> Option<FencingToken> {
        self.inner().fencing_token(name)
    }

    /// Whether every lock is still valid locally (see [`Guard::is_valid`]).
    pub fn is_valid(&self) -> bool {
        self.inner()
            .guards()
            .iter()
            .all(coord_core::Guard::is_valid)
    }

    /// Start the watchdog on every lock.
    pub fn keep_alive(&mut self) {
        let _entered = self.rt.enter();
        self.inner
            .as_mut()
            .expect("a multi-guard holds its locks until it ends")
            .keep_alive();
    }

    /// Release every lock, in reverse order. Returns the first error, after
    /// trying them all; inside an async runtime
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument), and they
    /// are released in the background, as on drop.
    pub fn release(mut self) -> Result<()> {
        check()?;
        let inner = self
            .inner
            .take()
            .expect("a multi-guard holds its locks until it ends");
        self.rt.block_on(inner.release())
    }
}
