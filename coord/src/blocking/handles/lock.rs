//! [`Locks`]: blocking locks, scoped and multi-lock forms included.

use std::time::Duration;

use super::{acquired, guard, hold_while};
use crate::blocking::Rt;
use crate::blocking::claims::{Guard, MultiGuard};
use crate::{Acquired, Capabilities, ClaimInfo, LockOptions, Ownership, Result, WithLockError};

/// Locks on one store: the blocking form of [`crate::Locks`], whose docs
/// say what each method does. Cheap to clone. Get one with
/// [`Coord::locks`](crate::blocking::Coord::locks).
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
    pub(super) inner: coord_core::Locks,
    pub(super) rt: Rt,
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
    /// Errors: [`Error::Timeout`](crate::Error::Timeout) if it stayed busy (nothing is held).
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
    /// [`WithLockError::Release`] with [`Error::Lost`](crate::Error::Lost): the work finished,
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
