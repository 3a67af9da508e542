//! [`Leases`]: blocking leases.

use std::time::Duration;

use super::{acquired, guard};
use crate::blocking::Rt;
use crate::blocking::claims::Guard;
use crate::{Acquired, ClaimInfo, Result};

/// Leases on one store: the blocking form of [`crate::Leases`]. Cheap to
/// clone. Get one with [`Coord::leases`](crate::blocking::Coord::leases).
#[derive(Clone)]
pub struct Leases {
    pub(super) inner: coord_core::Leases,
    pub(super) rt: Rt,
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
