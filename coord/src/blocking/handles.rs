//! The blocking handles, one per primitive: each method blocks on the
//! async handle's method of the same name.

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};

use super::claims::{Claim, Delivery, Guard, Leadership, MultiGuard, Permit, RwGuard};
use super::{Coord, Rt, check};
use crate::{
    Acquired, Capabilities, ClaimInfo, Decision, Error, FencingToken, Lane, LeaderDetails,
    LeaderInfo, LockOptions, Message, MessageId, Ownership, PermitOptions, PopOptions, PushOptions,
    Pushed, QueueConfig, QueueStats, Quota, Result, WithLockError,
};

/// A plain guard from an async one.
fn guard(rt: &Rt) -> impl Fn(coord_core::Guard) -> Guard + '_ {
    move |g| Guard::new(Claim::Guard(g), rt.clone())
}

/// The same outcome of an `*_or_holders` call, with a blocking grant.
fn acquired<A, B>(a: Acquired<A>, f: impl FnOnce(A) -> B) -> Acquired<B> {
    match a {
        Acquired::Granted(g) => Acquired::Granted(f(g)),
        Acquired::Held(info) => Acquired::Held(info),
    }
}

impl Coord {
    /// The locks of this store.
    ///
    /// Errors: [`Error::Unsupported`] if the backend has no locks.
    pub fn locks(&self) -> Result<Locks> {
        Ok(Locks {
            inner: self.inner.locks()?,
            rt: self.rt.clone(),
        })
    }

    /// The leases of this store. Errors: [`Error::Unsupported`].
    pub fn leases(&self) -> Result<Leases> {
        Ok(Leases {
            inner: self.inner.leases()?,
            rt: self.rt.clone(),
        })
    }

    /// The fencing sources of this store. Errors: [`Error::Unsupported`].
    pub fn fencing(&self) -> Result<Fencing> {
        Ok(Fencing {
            inner: self.inner.fencing()?,
            rt: self.rt.clone(),
        })
    }

    /// The elections of this store. Errors: [`Error::Unsupported`].
    pub fn elections(&self) -> Result<Elections> {
        Ok(Elections {
            inner: self.inner.elections()?,
            rt: self.rt.clone(),
        })
    }

    /// The barriers of this store. Errors: [`Error::Unsupported`].
    pub fn barriers(&self) -> Result<Barriers> {
        Ok(Barriers {
            inner: self.inner.barriers()?,
            rt: self.rt.clone(),
        })
    }

    /// The rate limiters of this store. Errors: [`Error::Unsupported`].
    pub fn limiter(&self) -> Result<RateLimiter> {
        Ok(RateLimiter {
            inner: self.inner.limiter()?,
            rt: self.rt.clone(),
        })
    }

    /// The semaphores of this store. Errors: [`Error::Unsupported`].
    pub fn semaphores(&self) -> Result<Semaphores> {
        Ok(Semaphores {
            inner: self.inner.semaphores()?,
            rt: self.rt.clone(),
        })
    }

    /// The read-write locks of this store. Errors: [`Error::Unsupported`]
    /// when the store has no semaphores, or its semaphores do not queue
    /// waiters in order.
    pub fn rw_locks(&self) -> Result<RwLocks> {
        Ok(RwLocks {
            inner: self.inner.rw_locks()?,
            rt: self.rt.clone(),
        })
    }

    /// Work queues on this store, with the default [`QueueConfig`].
    /// Errors: [`Error::Unsupported`].
    pub fn queues(&self) -> Result<Queues> {
        Ok(Queues {
            inner: self.inner.queues()?,
            rt: self.rt.clone(),
        })
    }
}

/// Locks on one store: the blocking form of [`crate::Locks`], whose docs
/// say what each method does. Cheap to clone. Get one with
/// [`Coord::locks`].
///
/// ```
/// # fn main() -> coord::Result<()> {
/// use std::time::Duration;
/// let locks = coord::blocking::connect("memory://")?.locks()?;
/// let guard = locks.acquire("report", Duration::from_secs(30), Duration::from_secs(5))?;
/// println!("holding {} with fencing token {}", guard.name(), guard.fencing_token());
/// guard.release()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Locks {
    inner: coord_core::Locks,
    rt: Rt,
}

impl std::fmt::Debug for Locks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Locks {
    /// What the backend promises.
    pub fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    /// One attempt to take `name` for `ttl`. `Ok(None)` if somebody else
    /// holds it.
    pub fn try_acquire(&self, name: &str, ttl: Duration) -> Result<Option<Guard>> {
        let g = self.rt.block_on(self.inner.try_acquire(name, ttl))?;
        Ok(g.map(guard(&self.rt)))
    }

    /// Take `name` for `ttl`, waiting up to `wait` for it to be free.
    /// Errors: [`Error::Timeout`] if it stayed busy (nothing is held).
    pub fn acquire(&self, name: &str, ttl: Duration, wait: Duration) -> Result<Guard> {
        let g = self.rt.block_on(self.inner.acquire(name, ttl, wait))?;
        Ok(guard(&self.rt)(g))
    }

    /// Take `name` as `opts` say (TTL, wait, watchdog).
    pub fn acquire_with(&self, name: &str, opts: LockOptions) -> Result<Guard> {
        let g = self.rt.block_on(self.inner.acquire_with(name, opts))?;
        Ok(guard(&self.rt)(g))
    }

    /// Take `name` as `opts` say, storing `metadata` (who, why) with the
    /// grant for [`inspect`](Locks::inspect) to show.
    pub fn acquire_with_metadata(
        &self,
        name: &str,
        opts: LockOptions,
        metadata: &serde_json::Value,
    ) -> Result<Guard> {
        let g = self
            .rt
            .block_on(self.inner.acquire_with_metadata(name, opts, metadata))?;
        Ok(guard(&self.rt)(g))
    }

    /// Take `name` as `opts` say, or, if it stayed busy, say who holds it.
    pub fn acquire_or_holders(
        &self,
        name: &str,
        opts: LockOptions,
        metadata: Option<&serde_json::Value>,
    ) -> Result<Acquired<Guard>> {
        let a = self
            .rt
            .block_on(self.inner.acquire_or_holders(name, opts, metadata))?;
        Ok(acquired(a, guard(&self.rt)))
    }

    /// Who holds `name`, as the store records it.
    pub fn inspect(&self, name: &str) -> Result<ClaimInfo> {
        self.rt.block_on(self.inner.inspect(name))
    }

    /// Run `work` on this thread while holding `name`, with the watchdog
    /// on, and release afterwards (also if `work` panics).
    ///
    /// Unlike [`crate::Locks::with_lock`], `work` cannot be stopped when
    /// ownership is lost: check [`Ownership::is_valid`] or its
    /// [`lost_token`](Ownership::lost_token) between steps, and pass its
    /// fencing token to what it writes. If ownership was lost while it ran,
    /// or the release finds the lock gone, the output comes back as
    /// [`WithLockError::Release`] with [`Error::Lost`]: the work finished,
    /// part of it unprotected; do not redo it. Not acquired:
    /// [`WithLockError::Lock`].
    ///
    /// ```
    /// # fn main() -> coord::Result<()> {
    /// use std::time::Duration;
    /// use coord::{LockOptions, WithLockError};
    /// let locks = coord::blocking::connect("memory://")?.locks()?;
    /// let opts = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(5));
    /// let token = match locks.with_lock("nightly-report", opts, |held| held.fencing_token().get()) {
    ///     Ok(token) => token,
    ///     // Done, but not (all of it) under the lock: keep the result, do not redo it.
    ///     Err(WithLockError::Release { output, .. }) => output,
    ///     Err(WithLockError::Lock(e)) => return Err(e),
    /// };
    /// # let _ = token; Ok(()) }
    /// ```
    pub fn with_lock<F, T>(
        &self,
        name: &str,
        opts: LockOptions,
        work: F,
    ) -> std::result::Result<T, WithLockError<T>>
    where
        F: FnOnce(Ownership) -> T,
    {
        let guard = self
            .acquire_with(name, opts.watchdog(true))
            .map_err(WithLockError::Lock)?;
        hold_while(guard, work)
    }

    /// Take every lock in `names`, all or nothing, in a deadlock-free order
    /// (sorted, deduplicated).
    pub fn acquire_all<I, S>(&self, names: I, opts: LockOptions) -> Result<MultiGuard>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let m = self.rt.block_on(self.inner.acquire_all(names, opts))?;
        Ok(MultiGuard::new(m, self.rt.clone()))
    }

    /// Remove `name` whoever holds it: an operator's tool. Returns whether
    /// a live lock was removed.
    pub fn force_release(&self, name: &str) -> Result<bool> {
        self.rt.block_on(self.inner.force_release(name))
    }
}

/// Leases on one store: the blocking form of [`crate::Leases`]. Cheap to
/// clone. Get one with [`Coord::leases`].
#[derive(Clone)]
pub struct Leases {
    inner: coord_core::Leases,
    rt: Rt,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Leases {
    /// Grant `name` for `ttl` unless another owner holds a live lease on
    /// it (`Ok(None)`).
    pub fn grant(&self, name: &str, ttl: Duration) -> Result<Option<Guard>> {
        let g = self.rt.block_on(self.inner.grant(name, ttl))?;
        Ok(g.map(guard(&self.rt)))
    }

    /// [`grant`](Leases::grant), storing `metadata` (who, why) with the
    /// lease for [`inspect`](Leases::inspect) to show.
    pub fn grant_with_metadata(
        &self,
        name: &str,
        ttl: Duration,
        metadata: &serde_json::Value,
    ) -> Result<Option<Guard>> {
        let g = self
            .rt
            .block_on(self.inner.grant_with_metadata(name, ttl, metadata))?;
        Ok(g.map(guard(&self.rt)))
    }

    /// [`grant`](Leases::grant), or, if another owner holds a live lease,
    /// say who.
    pub fn grant_or_holders(
        &self,
        name: &str,
        ttl: Duration,
        metadata: Option<&serde_json::Value>,
    ) -> Result<Acquired<Guard>> {
        let a = self
            .rt
            .block_on(self.inner.grant_or_holders(name, ttl, metadata))?;
        Ok(acquired(a, guard(&self.rt)))
    }

    /// Who holds `name`, as the store records it.
    pub fn inspect(&self, name: &str) -> Result<ClaimInfo> {
        self.rt.block_on(self.inner.inspect(name))
    }

    /// The remaining time of the live lease on `name`, whoever holds it;
    /// `None` if there is none.
    pub fn remaining(&self, name: &str) -> Result<Option<Duration>> {
        self.rt.block_on(self.inner.remaining(name))
    }

    /// Whether somebody holds a live lease on `name`.
    pub fn is_alive(&self, name: &str) -> Result<bool> {
        self.rt.block_on(self.inner.is_alive(name))
    }
}

/// Fencing tokens per resource: the blocking form of [`crate::Fencing`].
/// Cheap to clone. Get one with [`Coord::fencing`].
#[derive(Clone)]
pub struct Fencing {
    inner: coord_core::Fencing,
    rt: Rt,
}

impl std::fmt::Debug for Fencing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Fencing {
    /// The next token for `resource`: strictly greater than every token
    /// handed out for it before, across all clients.
    pub fn next(&self, resource: &str) -> Result<FencingToken> {
        self.rt.block_on(self.inner.next(resource))
    }
}

/// Leader elections on one store: the blocking form of
/// [`crate::Elections`]. Cheap to clone. Get one with
/// [`Coord::elections`].
#[derive(Clone)]
pub struct Elections {
    inner: coord_core::Elections,
    rt: Rt,
}

impl std::fmt::Debug for Elections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Elections {
    /// One attempt to become leader of `name` as `candidate`. `Ok(None)` if
    /// somebody else leads.
    pub fn try_campaign(
        &self,
        name: &str,
        candidate: &str,
        ttl: Duration,
    ) -> Result<Option<Leadership>> {
        let l = self
            .rt
            .block_on(self.inner.try_campaign(name, candidate, ttl))?;
        Ok(l.map(|l| Leadership::new(l, self.rt.clone())))
    }

    /// Campaign until elected or `wait` passes ([`Error::Timeout`]). The
    /// leadership is not renewed unless you call
    /// [`keep_alive`](Guard::keep_alive) on it.
    pub fn campaign(
        &self,
        name: &str,
        candidate: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Leadership> {
        let l = self
            .rt
            .block_on(self.inner.campaign(name, candidate, ttl, wait))?;
        Ok(Leadership::new(l, self.rt.clone()))
    }

    /// Campaign for `name` (waiting up to `wait`), run `work` as leader
    /// with the watchdog on, then resign: see
    /// [`crate::Elections::with_leadership`]. `work` runs on this thread to
    /// its end (a blocking closure cannot be stopped): if the leadership
    /// was lost meanwhile, the output comes back as
    /// [`WithLockError::Release`] with [`Error::Lost`].
    pub fn with_leadership<F, T>(
        &self,
        name: &str,
        candidate: &str,
        ttl: Duration,
        wait: Duration,
        work: F,
    ) -> std::result::Result<T, WithLockError<T>>
    where
        F: FnOnce(Ownership) -> T,
    {
        let mut leadership = self
            .campaign(name, candidate, ttl, wait)
            .map_err(WithLockError::Lock)?;
        leadership.keep_alive();
        hold_while(leadership.into_guard(), work)
    }

    /// The live leader of `name` and its term, if any.
    pub fn leader(&self, name: &str) -> Result<Option<LeaderInfo>> {
        self.rt.block_on(self.inner.leader(name))
    }

    /// The live leader of `name` as the store records it; `None` if the
    /// office is vacant.
    pub fn inspect(&self, name: &str) -> Result<Option<LeaderDetails>> {
        self.rt.block_on(self.inner.inspect(name))
    }

    /// The leadership changes of `name`, as an iterator that blocks for
    /// each: first the current state, then every change it sees (see
    /// [`crate::Elections::observe`]). It never ends; use
    /// [`LeaderChanges::next_timeout`] to wait a bounded time.
    pub fn observe(&self, name: &str) -> Result<LeaderChanges> {
        // The stream is built without waiting; it does its I/O when asked
        // for its items, in the client's runtime.
        let stream = self.inner.observe(name)?;
        Ok(LeaderChanges {
            stream: Box::pin(stream),
            rt: self.rt.clone(),
        })
    }
}

/// The leadership changes of an election, from [`Elections::observe`]:
/// `Ok(None)` means the office is vacant. Each `next` blocks until the
/// next change; inside an async runtime it yields
/// [`Error::InvalidArgument`] at once.
pub struct LeaderChanges {
    stream: Pin<Box<dyn Stream<Item = Result<Option<LeaderInfo>>> + Send>>,
    rt: Rt,
}

impl std::fmt::Debug for LeaderChanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderChanges").finish_non_exhaustive()
    }
}

impl LeaderChanges {
    /// The next change, waiting up to `timeout` for it; `None` if none came
    /// in time (the next call goes on waiting for it).
    pub fn next_timeout(&mut self, timeout: Duration) -> Option<Result<Option<LeaderInfo>>> {
        if let Err(e) = check() {
            return Some(Err(e));
        }
        let stream = &mut self.stream;
        self.rt.runtime().block_on(async move {
            tokio::time::timeout(timeout, stream.next())
                .await
                .ok()
                .flatten()
        })
    }
}

impl Iterator for LeaderChanges {
    type Item = Result<Option<LeaderInfo>>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Err(e) = check() {
            return Some(Err(e));
        }
        self.rt.runtime().block_on(self.stream.next())
    }
}

/// Barriers on one store: the blocking form of [`crate::Barriers`]. Cheap
/// to clone. Get one with [`Coord::barriers`].
#[derive(Clone)]
pub struct Barriers {
    inner: coord_core::Barriers,
    rt: Rt,
}

impl std::fmt::Debug for Barriers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Barriers {
    /// Arrive at `name` as `participant` and wait until `parties`
    /// participants of this generation have arrived. Returns the generation
    /// that completed. Errors: [`Error::Timeout`] after `timeout` (the
    /// participant has been withdrawn); see [`crate::Barriers::wait`].
    pub fn wait(
        &self,
        name: &str,
        parties: u32,
        participant: &str,
        timeout: Duration,
    ) -> Result<u64> {
        self.rt
            .block_on(self.inner.wait(name, parties, participant, timeout))
    }
}

/// Rate limiters on one store: the blocking form of
/// [`crate::RateLimiter`]. Cheap to clone. Get one with
/// [`Coord::limiter`].
#[derive(Clone)]
pub struct RateLimiter {
    inner: coord_core::RateLimiter,
    rt: Rt,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl RateLimiter {
    /// What the backend promises.
    pub fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    /// Check one request (cost 1) against `quota` for `key`, recording it
    /// if admitted.
    pub fn check(&self, key: &str, quota: Quota) -> Result<Decision> {
        self.rt.block_on(self.inner.check(key, quota))
    }

    /// Check a request of `cost` units.
    pub fn check_cost(&self, key: &str, quota: Quota, cost: u64) -> Result<Decision> {
        self.rt.block_on(self.inner.check_cost(key, quota, cost))
    }

    /// Check, and when denied sleep `retry_after` and check again, for at
    /// most `max_wait`. Returns the admitting decision, or
    /// [`Error::Timeout`].
    pub fn wait(&self, key: &str, quota: Quota, cost: u64, max_wait: Duration) -> Result<Decision> {
        self.rt
            .block_on(self.inner.wait(key, quota, cost, max_wait))
    }
}

/// Counting semaphores on one store: the blocking form of
/// [`crate::Semaphores`]. Cheap to clone. Get one with
/// [`Coord::semaphores`].
#[derive(Clone)]
pub struct Semaphores {
    inner: coord_core::Semaphores,
    rt: Rt,
}

impl std::fmt::Debug for Semaphores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Semaphores {
    fn permit(&self, p: coord_core::Permit) -> Permit {
        Permit::new(p, self.rt.clone())
    }

    /// What the backend promises.
    pub fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    /// Whether the store queues waiters and grants them in arrival order.
    pub fn is_fifo(&self) -> bool {
        self.inner.is_fifo()
    }

    /// One attempt to take one of the `permits_total` permits of `name`
    /// for `ttl`. `Ok(None)` if none is free.
    pub fn try_acquire(
        &self,
        name: &str,
        permits_total: u32,
        ttl: Duration,
    ) -> Result<Option<Permit>> {
        let p = self
            .rt
            .block_on(self.inner.try_acquire(name, permits_total, ttl))?;
        Ok(p.map(|p| self.permit(p)))
    }

    /// One attempt to take `n` of the `permits_total` permits of `name` at
    /// once, all or none.
    pub fn try_acquire_many(
        &self,
        name: &str,
        n: u32,
        permits_total: u32,
        ttl: Duration,
    ) -> Result<Option<Permit>> {
        let p = self
            .rt
            .block_on(self.inner.try_acquire_many(name, n, permits_total, ttl))?;
        Ok(p.map(|p| self.permit(p)))
    }

    /// Take one of the `permits_total` permits of `name` for `ttl`,
    /// waiting up to `wait` for one to be free.
    pub fn acquire(
        &self,
        name: &str,
        permits_total: u32,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Permit> {
        let p = self
            .rt
            .block_on(self.inner.acquire(name, permits_total, ttl, wait))?;
        Ok(self.permit(p))
    }

    /// Take `n` of the `permits_total` permits of `name` at once, all or
    /// none, waiting up to `wait`.
    pub fn acquire_many(
        &self,
        name: &str,
        n: u32,
        permits_total: u32,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Permit> {
        let p = self
            .rt
            .block_on(self.inner.acquire_many(name, n, permits_total, ttl, wait))?;
        Ok(self.permit(p))
    }

    /// Take permits as `opts` say.
    pub fn acquire_with(&self, name: &str, opts: PermitOptions) -> Result<Permit> {
        let p = self.rt.block_on(self.inner.acquire_with(name, opts))?;
        Ok(self.permit(p))
    }

    /// [`acquire_with`](Semaphores::acquire_with), storing `metadata` (who,
    /// why) with the grant for [`inspect`](Semaphores::inspect) to show.
    pub fn acquire_with_metadata(
        &self,
        name: &str,
        opts: PermitOptions,
        metadata: &serde_json::Value,
    ) -> Result<Permit> {
        let p = self
            .rt
            .block_on(self.inner.acquire_with_metadata(name, opts, metadata))?;
        Ok(self.permit(p))
    }

    /// [`acquire_with`](Semaphores::acquire_with), or, if not enough
    /// permits were free within `opts.wait`, say who holds them.
    pub fn acquire_or_holders(
        &self,
        name: &str,
        opts: PermitOptions,
        metadata: Option<&serde_json::Value>,
    ) -> Result<Acquired<Permit>> {
        let a = self
            .rt
            .block_on(self.inner.acquire_or_holders(name, opts, metadata))?;
        Ok(acquired(a, |p| self.permit(p)))
    }

    /// The live grants of `name` and queued waiters where the store can
    /// tell.
    pub fn inspect(&self, name: &str) -> Result<ClaimInfo> {
        self.rt.block_on(self.inner.inspect(name))
    }

    /// Remove every grant of `name`, whoever holds it: an operator's tool.
    /// Returns whether a live grant was removed.
    pub fn force_release(&self, name: &str) -> Result<bool> {
        self.rt.block_on(self.inner.force_release(name))
    }
}

/// Read-write locks on one store: the blocking form of
/// [`crate::RwLocks`]. Cheap to clone. Get one with [`Coord::rw_locks`].
#[derive(Clone)]
pub struct RwLocks {
    inner: coord_core::RwLocks,
    rt: Rt,
}

impl std::fmt::Debug for RwLocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl RwLocks {
    fn rw(&self, r: coord_core::RwGuard) -> RwGuard {
        RwGuard::new(r, self.rt.clone())
    }

    /// Take `name` for reading: wait up to `wait` (zero: one attempt) while
    /// a writer holds it or waits for it.
    pub fn read(&self, name: &str, ttl: Duration, wait: Duration) -> Result<RwGuard> {
        let r = self.rt.block_on(self.inner.read(name, ttl, wait))?;
        Ok(self.rw(r))
    }

    /// Take `name` for writing: wait up to `wait` for every reader and
    /// writer ahead to leave.
    pub fn write(&self, name: &str, ttl: Duration, wait: Duration) -> Result<RwGuard> {
        let w = self.rt.block_on(self.inner.write(name, ttl, wait))?;
        Ok(self.rw(w))
    }

    /// One attempt to read: `Ok(None)` while a writer holds or waits.
    pub fn try_read(&self, name: &str, ttl: Duration) -> Result<Option<RwGuard>> {
        let r = self.rt.block_on(self.inner.try_read(name, ttl))?;
        Ok(r.map(|r| self.rw(r)))
    }

    /// One attempt to write: `Ok(None)` while anybody holds it or waits.
    pub fn try_write(&self, name: &str, ttl: Duration) -> Result<Option<RwGuard>> {
        let w = self.rt.block_on(self.inner.try_write(name, ttl))?;
        Ok(w.map(|w| self.rw(w)))
    }

    /// Remove every grant of `name`, readers' and writer's: an operator's
    /// tool. Returns whether a live grant was removed.
    pub fn force_release(&self, name: &str) -> Result<bool> {
        self.rt.block_on(self.inner.force_release(name))
    }
}

/// Work queues on one store: the blocking form of [`crate::Queues`], whose
/// docs say how delivery works. Cheap to clone. Get one with
/// [`Coord::queues`].
#[derive(Clone)]
pub struct Queues {
    inner: coord_core::Queues,
    rt: Rt,
}

impl std::fmt::Debug for Queues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Queues {
    fn delivery(&self, d: coord_core::Delivery) -> Delivery {
        Delivery::new(d, self.rt.clone())
    }

    /// The same queues with another delivery configuration (dead letters,
    /// ordered groups).
    pub fn with_config(mut self, config: QueueConfig) -> Queues {
        self.inner = self.inner.with_config(config);
        self
    }

    /// The delivery configuration.
    pub fn config(&self) -> QueueConfig {
        self.inner.config()
    }

    /// What the backend promises.
    pub fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    /// The largest payload this store takes, in bytes.
    pub fn max_payload(&self) -> usize {
        self.inner.max_payload()
    }

    /// Whether this store promises that an acknowledged push survives a
    /// restart of the store.
    pub fn durable(&self) -> bool {
        self.inner.durable()
    }

    /// Push `payload` to `queue`: deliverable at once, in the group `""`.
    pub fn push(&self, queue: &str, payload: impl AsRef<[u8]>) -> Result<MessageId> {
        self.rt.block_on(self.inner.push(queue, payload))
    }

    /// Push with a delay, group or dedup id.
    pub fn push_with(
        &self,
        queue: &str,
        payload: impl AsRef<[u8]>,
        opts: &PushOptions,
    ) -> Result<Pushed> {
        self.rt.block_on(self.inner.push_with(queue, payload, opts))
    }

    /// Push `value` as JSON (`serde_json`), with `opts`.
    pub fn push_json<T: serde::Serialize + ?Sized>(
        &self,
        queue: &str,
        value: &T,
        opts: &PushOptions,
    ) -> Result<Pushed> {
        self.rt.block_on(self.inner.push_json(queue, value, opts))
    }

    /// Take the next message of `queue` for `visibility`, waiting up to
    /// `wait` for one. `Ok(None)`: none came within `wait`.
    pub fn pop(
        &self,
        queue: &str,
        visibility: Duration,
        wait: Duration,
    ) -> Result<Option<Delivery>> {
        let d = self.rt.block_on(self.inner.pop(queue, visibility, wait))?;
        Ok(d.map(|d| self.delivery(d)))
    }

    /// Pop as `opts` say (lane, visibility, wait, watchdog).
    pub fn pop_with(&self, queue: &str, opts: PopOptions) -> Result<Option<Delivery>> {
        let d = self.rt.block_on(self.inner.pop_with(queue, opts))?;
        Ok(d.map(|d| self.delivery(d)))
    }

    /// Up to `limit` messages of `lane`, without delivering them.
    pub fn peek(&self, queue: &str, lane: Lane, limit: usize) -> Result<Vec<Message>> {
        self.rt.block_on(self.inner.peek(queue, lane, limit))
    }

    /// Move up to `limit` dead letters of `queue` back to its main lane.
    /// Returns how many moved.
    pub fn redrive(&self, queue: &str, limit: usize) -> Result<u64> {
        self.rt.block_on(self.inner.redrive(queue, limit))
    }

    /// How many messages `queue` holds, by state.
    pub fn stats(&self, queue: &str) -> Result<QueueStats> {
        self.rt.block_on(self.inner.stats(queue))
    }

    /// Delete every message of `queue` (both lanes) and its dedup ids: an
    /// operator's tool. Returns how many were deleted.
    pub fn purge(&self, queue: &str) -> Result<u64> {
        self.rt.block_on(self.inner.purge(queue))
    }
}

/// Run `work` under `guard` (its watchdog on) on this thread, then end the
/// claim: the blocking scoped forms (`with_lock`, `with_leadership`). A
/// claim that was no longer valid when `work` ended gives its output back
/// as [`WithLockError::Release`] with [`Error::Lost`].
fn hold_while<F, T>(guard: Guard, work: F) -> std::result::Result<T, WithLockError<T>>
where
    F: FnOnce(Ownership) -> T,
{
    let output = work(guard.ownership());
    let held = guard.is_valid();
    let lost = Error::Lost {
        name: guard.ownership().name().to_string(),
    };
    match guard.release() {
        Ok(()) if held => Ok(output),
        Ok(()) | Err(Error::NotHeld { .. }) => Err(WithLockError::Release {
            output,
            error: lost,
        }),
        Err(_) if !held => Err(WithLockError::Release {
            output,
            error: lost,
        }),
        Err(error) => Err(WithLockError::Release { output, error }),
    }
}
