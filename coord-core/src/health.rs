//! A store's health as a program or an operator asks for it:
//! [`Coord::health`] makes one round trip and reports how long it took,
//! what the server says it is, and what the store offers.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Probe, ServerInfo};
use crate::coord::Coord;
use crate::error::{Error, Result};
use crate::types::{Capabilities, Deployment};

/// The answer of [`Coord::health`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// The store (`memory`, `redis`, `postgres`, `etcd`).
    pub backend: &'static str,
    /// How it is deployed.
    pub deployment: Deployment,
    /// What the server reports of itself.
    pub server: ServerInfo,
    /// How long the probe's round trip took.
    pub round_trip: Duration,
    /// The primitives this handle offers (`locks`, `leases`, ...), in the
    /// order of [`Health::PRIMITIVES`].
    pub primitives: Vec<&'static str>,
}

impl Health {
    /// Every primitive a store can offer, in the order [`Health::primitives`] lists them.
    pub const PRIMITIVES: [&'static str; 9] = [
        "locks",
        "leases",
        "fencing",
        "elections",
        "barriers",
        "limiters",
        "semaphores",
        "rwlocks",
        "queues",
    ];
}

/// The primitives `coord` offers, as [`Health::primitives`] lists them.
fn offered(coord: &Coord) -> Vec<&'static str> {
    let has = [
        coord.lock.is_some(),
        coord.lease.is_some(),
        coord.fencing.is_some(),
        coord.election.is_some(),
        coord.barrier.is_some(),
        coord.limiter.is_some(),
        coord.semaphore.is_some(),
        // Read-write locks are built on FIFO semaphores.
        coord.semaphore.as_ref().is_some_and(|s| s.fifo()),
        coord.queue.is_some(),
    ];
    Health::PRIMITIVES
        .iter()
        .zip(has)
        .filter(|(_, h)| *h)
        .map(|(p, _)| *p)
        .collect()
}

impl Coord {
    /// The same handle with `probe` behind [`Coord::health`].
    ///
    /// ```
    /// # fn demo(coord: coord_core::Coord, probe: std::sync::Arc<dyn coord_core::Probe>) {
    /// let coord = coord.with_probe(probe);
    /// # }
    /// ```
    pub fn with_probe(mut self, probe: Arc<dyn Probe>) -> Coord {
        self.probe = Some(probe);
        self
    }

    /// One round trip to the store: how long it took, what the server
    /// says it is, and what this handle offers. For readiness checks and
    /// `coord health`.
    ///
    /// Errors: [`Error::Unavailable`] when the store does not answer
    /// within the backend's call timeout; [`Error::Unsupported`] for a
    /// handle built without a probe ([`CoordBuilder::probe`](crate::CoordBuilder::probe)).
    ///
    /// ```
    /// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
    /// let h = coord.health().await?;
    /// println!("{} ({}) answered in {:?}", h.backend, h.server.version, h.round_trip);
    /// # Ok(()) }
    /// ```
    pub async fn health(&self) -> Result<Health> {
        let caps: &Capabilities = &self.caps;
        let probe = self.probe.clone().ok_or_else(|| Error::Unsupported {
            backend: caps.backend,
            primitive: "health",
            reason: "this handle was built without a probe (CoordBuilder::probe)",
        })?;
        let start = Instant::now();
        let server = op!("coord.health", caps.backend, "", probe.probe())?;
        Ok(Health {
            backend: caps.backend,
            deployment: caps.deployment,
            server,
            round_trip: start.elapsed(),
            primitives: offered(self),
        })
    }
}
