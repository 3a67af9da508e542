//! [`RateLimiter`]: blocking rate limit checks.

use std::time::Duration;

use crate::blocking::Rt;
use crate::{Capabilities, Decision, Quota, Result};

/// Rate limiters on one store: the blocking form of
/// [`crate::RateLimiter`]. Cheap to clone. Get one with
/// [`Coord::limiter`](crate::blocking::Coord::limiter).
#[derive(Clone)]
pub struct RateLimiter {
    pub(super) inner: coord_core::RateLimiter,
    pub(super) rt: Rt,
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
    /// [`Error::Timeout`](crate::Error::Timeout).
    pub fn wait(&self, key: &str, quota: Quota, cost: u64, max_wait: Duration) -> Result<Decision> {
        self.rt
            .block_on(self.inner.wait(key, quota, cost, max_wait))
    }
}
