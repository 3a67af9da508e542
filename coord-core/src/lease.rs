//! Leases: named, time-bounded claims for membership and heartbeats.

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::backend::Lease;
use crate::claim::{ClaimBackend, Guard};
use crate::coord::{Coord, Settings};
use crate::error::{Error, Result};
use crate::lock::{Queueing, acquire_claim};
use crate::validate;

/// Leases on one store: "worker 7 is alive for the next 10 s".
///
/// A name has at most one live lease. The holder renews it (by hand with
/// [`Guard::renew`], or with the watchdog via [`Guard::keep_alive`]);
/// anybody can ask whether it is alive. Renewing an expired lease fails and
/// resurrects nothing; revoking ends it at once for every observer.
///
/// ```
/// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
/// use std::time::Duration;
/// let leases = coord.leases()?;
/// let mut lease = leases.grant("worker:7", Duration::from_secs(10)).await?.expect("free");
/// lease.keep_alive();
/// assert!(leases.is_alive("worker:7").await?);
/// lease.revoke().await?;
/// assert!(!leases.is_alive("worker:7").await?);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Leases {
    backend: Arc<dyn Lease>,
    settings: Settings,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("backend", &self.backend.capabilities().backend)
            .finish_non_exhaustive()
    }
}

impl Coord {
    /// The leases of this store. Errors: [`Error::Unsupported`].
    pub fn leases(&self) -> Result<Leases> {
        Ok(Leases {
            backend: self
                .lease
                .clone()
                .ok_or_else(|| self.unsupported("leases"))?,
            settings: self.settings,
        })
    }
}

impl Leases {
    /// Grant `name` for `ttl` unless another owner holds a live lease on
    /// it (`Ok(None)`). The guard's fencing token rises with every grant of
    /// the name. Cost: one round trip.
    pub async fn grant(&self, name: &str, ttl: Duration) -> Result<Option<Guard>> {
        validate::name("name", name)?;
        let ttl = validate::ttl("ttl", ttl, self.backend.capabilities())?;
        let span = tracing::debug_span!(
            "coord.lease.grant",
            backend = self.backend.capabilities().backend,
            name,
            outcome = tracing::field::Empty,
            waited_ms = tracing::field::Empty
        );
        let r = acquire_claim(
            ClaimBackend::Lease(self.backend.clone()),
            "lease grant",
            name,
            ttl,
            Duration::ZERO,
            self.settings.poll_interval,
            Queueing::No,
            |owner| {
                let b = self.backend.clone();
                async move { b.grant(name, &owner, ttl).await }
            },
            |_| async { Ok(crate::wake::Waiter::never()) },
        )
        .instrument(span)
        .await;
        match r {
            Ok(g) => Ok(Some(g)),
            Err(Error::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The remaining time of the live lease on `name`, whoever holds it, as
    /// the store sees it; `None` if there is none. Cost: one round trip.
    pub async fn remaining(&self, name: &str) -> Result<Option<Duration>> {
        validate::name("name", name)?;
        self.backend.remaining(name).await
    }

    /// Whether somebody holds a live lease on `name`.
    pub async fn is_alive(&self, name: &str) -> Result<bool> {
        Ok(self.remaining(name).await?.is_some())
    }
}
