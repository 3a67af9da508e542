//! Rate limiting across every client of a store.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Limiter;
use crate::coord::Coord;
use crate::error::{Error, Result};
use crate::types::{Capabilities, Decision, Quota};
use crate::validate;

/// Rate limiters on one store (the PHP original's `checkRateLimit`, corrected).
///
/// Each check-and-record is one atomic step on the store, on the store's
/// clock where it has one (see [`Capabilities::server_clock`]). Across all
/// clients, admitted requests never exceed what the quota's algorithm
/// allows.
///
/// ```
/// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
/// use std::time::Duration;
/// use coord_core::{Algorithm, Quota};
/// let limiter = coord.limiter()?;
/// let quota = Quota::new(100, Duration::from_secs(60), Algorithm::SlidingLog);
/// let d = limiter.check("api:user-17", quota).await?;
/// if d.allowed {
///     // serve the request
/// } else {
///     println!("slow down: retry in {:?}", d.retry_after);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RateLimiter {
    backend: Arc<dyn Limiter>,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("backend", &self.backend.capabilities().backend)
            .finish()
    }
}

impl Coord {
    /// The rate limiter of this store. Errors: [`Error::Unsupported`].
    pub fn limiter(&self) -> Result<RateLimiter> {
        Ok(RateLimiter {
            backend: self
                .limiter
                .clone()
                .ok_or_else(|| self.unsupported("rate limiters"))?,
        })
    }
}

impl RateLimiter {
    /// What the backend promises.
    pub fn capabilities(&self) -> &Capabilities {
        self.backend.capabilities()
    }

    /// Check one request (cost 1) against `quota` for `key`, recording it if
    /// admitted. Cost: one round trip.
    pub async fn check(&self, key: &str, quota: Quota) -> Result<Decision> {
        self.check_cost(key, quota, 1).await
    }

    /// Check a request of `cost` units. A cost above the quota's limit can
    /// never be admitted: it is refused with [`Error::InvalidArgument`]
    /// (not retryable) before anything is sent.
    pub async fn check_cost(&self, key: &str, quota: Quota, cost: u64) -> Result<Decision> {
        validate::name("key", key)?;
        validate::quota(&quota)?;
        validate::cost(&quota, cost)?;
        let span = tracing::debug_span!(
            "coord.limiter.check",
            store = self.backend.capabilities().backend,
            name = key,
            cost,
            outcome = tracing::field::Empty
        );
        let r =
            tracing::Instrument::instrument(self.backend.check(key, &quota, cost), span.clone())
                .await;
        span.record(
            "outcome",
            match &r {
                Ok(d) if d.allowed => "allowed",
                Ok(_) => "denied",
                Err(_) => "error",
            },
        );
        let store = self.backend.capabilities().backend;
        match &r {
            Ok(d) => crate::metrics::limiter_check(store, d.allowed),
            Err(e) => crate::metrics::error(store, e),
        }
        r
    }

    /// Check, and when denied sleep `retry_after` and check again, for at
    /// most `max_wait`. Returns the admitting decision, or
    /// [`Error::Timeout`].
    pub async fn wait(
        &self,
        key: &str,
        quota: Quota,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision> {
        let deadline = crate::wait::deadline_in(max_wait);
        loop {
            let d = self.check_cost(key, quota, cost).await?;
            if d.allowed {
                return Ok(d);
            }
            let next = Instant::now() + d.retry_after.max(Duration::from_millis(1));
            if next > deadline {
                return Err(Error::Timeout {
                    operation: "rate limiter wait",
                    name: key.to_string(),
                    waited: max_wait,
                });
            }
            tokio::time::sleep_until(next).await;
        }
    }
}
