//! [`RwLocks`]: blocking read-write locks.

use std::time::Duration;

use crate::Result;
use crate::blocking::Rt;
use crate::blocking::claims::RwGuard;

/// Read-write locks on one store: the blocking form of
/// [`crate::RwLocks`]. Cheap to clone. Get one with
/// [`Coord::rw_locks`](crate::blocking::Coord::rw_locks).
#[derive(Clone)]
pub struct RwLocks {
    pub(super) inner: coord_core::RwLocks,
    pub(super) rt: Rt,
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
