//! Leases: named, time-bounded claims for membership and heartbeats.

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::acquire::{Queueing, acquire_claim};
use crate::backend::Lease;
use crate::claim::{ClaimBackend, Guard};
use crate::coord::{Coord, Settings};
use crate::error::{Error, Result};
use crate::late::Stepped;
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
    backend: Stepped<dyn Lease>,
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
        self.grant_inner(name, ttl, None).await
    }

    /// [`grant`](Leases::grant), storing `metadata` (who, why) with the
    /// lease for [`inspect`](Leases::inspect) to show; at most
    /// [`MAX_METADATA_BYTES`](crate::inspect::MAX_METADATA_BYTES) as JSON,
    /// checked before any I/O.
    ///
    /// ```
    /// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// let leases = coord.leases()?;
    /// let me = serde_json::json!({"host": "worker-7", "version": "1.4.2"});
    /// if let Some(lease) = leases.grant_with_metadata("worker:7", Duration::from_secs(10), &me).await? {
    ///     assert_eq!(leases.inspect("worker:7").await?.holders[0].metadata.as_ref(), Some(&me));
    ///     lease.revoke().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn grant_with_metadata(
        &self,
        name: &str,
        ttl: Duration,
        metadata: &serde_json::Value,
    ) -> Result<Option<Guard>> {
        let meta = crate::inspect::metadata_bytes(metadata)?;
        self.grant_inner(name, ttl, Some(meta.into())).await
    }

    /// [`grant`](Leases::grant) (with `metadata`, if given, as
    /// [`grant_with_metadata`](Leases::grant_with_metadata) stores it), or,
    /// if another owner holds a live lease, say who:
    /// [`Acquired::Held`](crate::Acquired::Held) with the holder's
    /// fingerprint, fencing token, remaining time and metadata, read right
    /// after the refusal. Cost: one round trip, two when refused.
    pub async fn grant_or_holders(
        &self,
        name: &str,
        ttl: Duration,
        metadata: Option<&serde_json::Value>,
    ) -> Result<crate::Acquired<Guard>> {
        let meta = crate::inspect::optional_metadata(metadata)?;
        match self.grant_inner(name, ttl, meta).await? {
            Some(g) => Ok(crate::Acquired::Granted(g)),
            None => crate::inspect::after_refusal(self.inspect(name)).await,
        }
    }

    /// Who holds `name`, as the store records it (none when no lease is
    /// live). Cost: one round trip.
    ///
    /// ```
    /// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
    /// for h in coord.leases()?.inspect("worker:7").await?.holders {
    ///     println!("{} until {:?}: {:?}", h.owner_id, h.remaining, h.metadata);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, name: &str) -> Result<crate::ClaimInfo> {
        validate::name("name", name)?;
        let store = self.backend.capabilities().backend;
        let record = op!(
            "coord.lease.inspect",
            store,
            name,
            self.backend.inspect(name)
        )?;
        Ok(crate::inspect::info(record))
    }

    /// End the lease on `name` whoever holds it (an operator's tool): its
    /// holder's next renewal reports [`Error::NotHeld`] and its lost signal
    /// fires. Returns whether a live lease was ended. Works on every store:
    /// the holder is read, then revoked as its owner (owner-checked), and
    /// read again if the lease changed hands meanwhile. Cost: two round
    /// trips.
    ///
    /// ```
    /// # async fn demo(leases: coord_core::Leases) -> coord_core::Result<()> {
    /// if leases.force_revoke("worker:7").await? {
    ///     println!("ended worker 7's lease");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn force_revoke(&self, name: &str) -> Result<bool> {
        validate::name("name", name)?;
        let store = self.backend.capabilities().backend;
        let b = &self.backend;
        op!(
            "coord.lease.force_revoke",
            store,
            name,
            crate::force::end_whoever_holds(
                store,
                "lease force revoke",
                name,
                || async { Ok(b.inspect(name).await?.holders.first().map(|h| h.owner)) },
                |owner| async move { b.revoke(name, &owner).await },
            ),
            crate::acquire::removed_or_free
        )
    }

    async fn grant_inner(
        &self,
        name: &str,
        ttl: Duration,
        meta: Option<Arc<[u8]>>,
    ) -> Result<Option<Guard>> {
        validate::name("name", name)?;
        let ttl = validate::ttl("ttl", ttl, self.backend.capabilities())?;
        let span = tracing::debug_span!(
            "coord.lease.grant",
            store = self.backend.capabilities().backend,
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
                let (b, meta) = (self.backend.clone(), meta.clone());
                async move {
                    match meta {
                        Some(m) => b.grant_with_metadata(name, &owner, ttl, &m).await,
                        None => b.grant(name, &owner, ttl).await,
                    }
                }
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
        let store = self.backend.capabilities().backend;
        op!(
            "coord.lease.remaining",
            store,
            name,
            self.backend.remaining(name),
            |r: &Option<Duration>| if r.is_some() { "live" } else { "none" }
        )
    }

    /// Whether somebody holds a live lease on `name`.
    pub async fn is_alive(&self, name: &str) -> Result<bool> {
        Ok(self.remaining(name).await?.is_some())
    }
}
