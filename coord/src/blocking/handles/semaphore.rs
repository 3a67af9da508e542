//! [`Semaphores`]: blocking counting semaphores.

use std::time::Duration;

use super::acquired;
use crate::blocking::Rt;
use crate::blocking::claims::Permit;
use crate::{Acquired, Capabilities, ClaimInfo, PermitOptions, Result};

/// Counting semaphores on one store: the blocking form of
/// [`crate::Semaphores`]. Cheap to clone. Get one with
/// [`Coord::semaphores`](crate::blocking::Coord::semaphores).
#[derive(Clone)]
pub struct Semaphores {
    pub(super) inner: coord_core::Semaphores,
    pub(super) rt: Rt,
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
