//! Semaphores: `permits_total` lease-bounded, fenced permits per name.
//!
//! A permit is a claim like a lock: it is held by a fresh owner token, ends
//! at release or at its TTL (so a crashed holder's permits come back),
//! carries a fencing token, and its guard is the same [`Guard`] locks use
//! (extend, release, release-on-drop, watchdog, lost signal). Only the
//! store-specific half ([`Semaphore`]) differs per backend.

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::acquire::{Queueing, acquire_claim};
use crate::backend::{PermitRequest, Semaphore};
use crate::claim::ClaimBackend;
use crate::coord::{Coord, Settings};
use crate::error::{Error, Result};
use crate::late::Stepped;
use crate::types::Capabilities;
use crate::validate;

mod options;
mod permit;

pub use options::PermitOptions;
pub use permit::Permit;

/// Counting semaphores on one store: at most `permits_total` permits of a
/// name are held at any time, across every client.
///
/// - Each grant is lease-bounded (a crashed holder's permits come back
///   after its TTL), owner-checked, and carries a fencing token that rises
///   with every grant of the name.
/// - `n` permits are taken at once, all or none.
/// - The [`Permit`] is a [`Guard`](crate::Guard) (through `Deref`): extend, release,
///   watchdog and lost signal work exactly as for locks.
/// - Waiters are woken by the store. On a store that queues them
///   ([`is_fifo`](Semaphores::is_fifo); the in-memory one does) they are
///   granted in arrival order: a request is granted only if it and every
///   request queued ahead of it fit into the free permits together, so a
///   request for `n` permits at the head of the queue is never overtaken by
///   smaller later requests, and no waiter is starved while permits keep
///   coming back.
/// - **`permits_total` binds while the name is in use.** While a name has
///   live holders (or queued waiters), a request with another total is
///   [`Error::InvalidArgument`] with field `permits_total` and changes
///   nothing; once the name is idle, the next request sets the total anew.
///
/// Cheap to clone. Get one with [`Coord::semaphores`].
///
/// ```
/// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
/// use std::time::Duration;
/// let sem = coord.semaphores()?;
/// // At most 3 concurrent calls to the partner API, across all servers.
/// let permit = sem.acquire("partner-api", 3, Duration::from_secs(30), Duration::from_secs(5)).await?;
/// println!("calling with fencing token {}", permit.fencing_token());
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Semaphores {
    backend: Stepped<dyn Semaphore>,
    settings: Settings,
}

impl std::fmt::Debug for Semaphores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphores")
            .field("backend", &self.backend.capabilities().backend)
            .field("fifo", &self.backend.fifo())
            .finish_non_exhaustive()
    }
}

impl Coord {
    /// The semaphores of this store.
    ///
    /// Errors: [`Error::Unsupported`] if the backend has no semaphores
    /// (yet).
    ///
    /// ```
    /// # fn demo(coord: coord_core::Coord) {
    /// match coord.semaphores() {
    ///     Ok(sem) => println!("semaphores, fifo: {}", sem.is_fifo()),
    ///     Err(coord_core::Error::Unsupported { backend, .. }) => println!("{backend} has none"),
    ///     Err(e) => panic!("{e}"),
    /// }
    /// # }
    /// ```
    pub fn semaphores(&self) -> Result<Semaphores> {
        Ok(Semaphores {
            backend: self
                .semaphore
                .clone()
                .ok_or_else(|| self.unsupported("semaphores"))?,
            settings: self.settings,
        })
    }
}

impl Semaphores {
    /// Semaphores over a raw backend, with these settings.
    ///
    /// ```
    /// # fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
    /// let sem = coord_core::Semaphores::new(coord.raw_semaphore()?, coord.settings());
    /// # let _ = sem; Ok(()) }
    /// ```
    pub fn new(backend: Arc<dyn Semaphore>, settings: Settings) -> Self {
        Semaphores {
            backend: Stepped::new(backend),
            settings,
        }
    }

    /// What the backend promises.
    ///
    /// ```
    /// # fn demo(sem: coord_core::Semaphores) {
    /// println!("min TTL {:?}", sem.capabilities().min_ttl);
    /// # }
    /// ```
    pub fn capabilities(&self) -> &Capabilities {
        self.backend.capabilities()
    }

    /// Whether the store queues waiters and grants them in arrival order
    /// (see [`Semaphores`] for the rule).
    ///
    /// ```
    /// # fn demo(sem: coord_core::Semaphores) {
    /// if !sem.is_fifo() {
    ///     println!("large requests may wait longer than small ones here");
    /// }
    /// # }
    /// ```
    pub fn is_fifo(&self) -> bool {
        self.backend.fifo()
    }

    /// One attempt to take one of the `permits_total` permits of `name`
    /// for `ttl`. `Ok(None)` if none is free (or, on a FIFO store, if
    /// waiters queued earlier need them). A refused attempt leaves nothing
    /// behind.
    ///
    /// Errors: [`Error::InvalidArgument`] (nothing sent) for a bad name,
    /// TTL or total, or (from the store, nothing changed) a total other
    /// than the one the name is in use with; store errors.
    /// Cost: one round trip.
    ///
    /// ```
    /// # async fn demo(sem: coord_core::Semaphores) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// match sem.try_acquire("slots", 2, Duration::from_secs(10)).await? {
    ///     Some(permit) => permit.release().await?,
    ///     None => println!("both slots are taken"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(
        &self,
        name: &str,
        permits_total: u32,
        ttl: Duration,
    ) -> Result<Option<Permit>> {
        self.try_acquire_many(name, 1, permits_total, ttl).await
    }

    /// One attempt to take `n` of the `permits_total` permits of `name` at
    /// once, all or none. See [`try_acquire`](Semaphores::try_acquire).
    ///
    /// ```
    /// # async fn demo(sem: coord_core::Semaphores) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// if let Some(p) = sem.try_acquire_many("slots", 3, 4, Duration::from_secs(10)).await? {
    ///     assert_eq!(p.permits(), 3);
    ///     p.release().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire_many(
        &self,
        name: &str,
        n: u32,
        permits_total: u32,
        ttl: Duration,
    ) -> Result<Option<Permit>> {
        match self
            .acquire_with(name, PermitOptions::new(permits_total, ttl).permits(n))
            .await
        {
            Ok(p) => Ok(Some(p)),
            Err(Error::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Take one of the `permits_total` permits of `name` for `ttl`,
    /// waiting up to `wait` for one to be free. Waiters are woken by the
    /// store when permits come back (and retry at the next holder's expiry
    /// and at a jittered poll interval at the latest).
    ///
    /// Errors: [`Error::Timeout`] if none came free (nothing is held, and
    /// no place in line is kept: leaving the line is sent again in the
    /// background while the store does not answer it, for up to 10
    /// minutes);
    /// [`Error::InvalidArgument`]; store errors. Cost uncontended: one
    /// round trip. Cancel-safe: if the future is dropped mid-wait, whatever
    /// this attempt may have been granted (or its place in line) is
    /// released in the background.
    ///
    /// ```
    /// # async fn demo(sem: coord_core::Semaphores) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// let permit = sem.acquire("slots", 2, Duration::from_secs(10), Duration::from_secs(3)).await?;
    /// permit.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn acquire(
        &self,
        name: &str,
        permits_total: u32,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Permit> {
        self.acquire_with(name, PermitOptions::new(permits_total, ttl).wait(wait))
            .await
    }

    /// Take `n` of the `permits_total` permits of `name` at once, all or
    /// none, waiting up to `wait`. Nothing is held while waiting: the `n`
    /// permits are granted together or not at all. On a FIFO store a
    /// waiting request for `n` is not overtaken by smaller later ones.
    ///
    /// ```
    /// # async fn demo(sem: coord_core::Semaphores) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// let p = sem.acquire_many("slots", 2, 4, Duration::from_secs(10), Duration::from_secs(3)).await?;
    /// assert_eq!((p.permits(), p.permits_total()), (2, 4));
    /// p.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn acquire_many(
        &self,
        name: &str,
        n: u32,
        permits_total: u32,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Permit> {
        self.acquire_with(
            name,
            PermitOptions::new(permits_total, ttl).permits(n).wait(wait),
        )
        .await
    }

    /// Take permits as `opts` say. See [`acquire`](Semaphores::acquire).
    /// Every input is checked before anything is sent.
    ///
    /// ```
    /// # async fn demo(sem: coord_core::Semaphores) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// use coord_core::PermitOptions;
    /// let opts = PermitOptions::new(4, Duration::from_secs(3)).watchdog(true);
    /// let permit = sem.acquire_with("slots", opts).await?;
    /// assert!(permit.has_watchdog());
    /// permit.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn acquire_with(&self, name: &str, opts: PermitOptions) -> Result<Permit> {
        validate::name("name", name)?;
        self.acquire_checked(name, opts).await
    }

    /// [`acquire_with`](Semaphores::acquire_with), storing `metadata` (who,
    /// why) with the grant for [`inspect`](Semaphores::inspect) to show; at
    /// most [`MAX_METADATA_BYTES`](crate::inspect::MAX_METADATA_BYTES) as
    /// JSON, checked before any I/O.
    ///
    /// ```
    /// # async fn demo(sem: coord_core::Semaphores) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// use coord_core::PermitOptions;
    /// let who = serde_json::json!({"host": "gpu-node-2"});
    /// let p = sem.acquire_with_metadata("gpus", PermitOptions::new(4, Duration::from_secs(30)), &who).await?;
    /// assert_eq!(sem.inspect("gpus").await?.holders.len(), 1);
    /// p.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn acquire_with_metadata(
        &self,
        name: &str,
        opts: PermitOptions,
        metadata: &serde_json::Value,
    ) -> Result<Permit> {
        validate::name("name", name)?;
        let meta = crate::inspect::metadata_bytes(metadata)?;
        self.acquire_meta(name, opts, Some(meta.into())).await
    }

    /// [`acquire_with`](Semaphores::acquire_with) (with `metadata`, if
    /// given, as [`acquire_with_metadata`](Semaphores::acquire_with_metadata)
    /// stores it), or, if not enough permits were free within `opts.wait`,
    /// say who holds them: [`Acquired::Held`](crate::Acquired::Held) with
    /// every live grant (fingerprint, permits, fencing token, remaining
    /// time, metadata) and the queued waiters where the store can tell,
    /// read right after the last refused attempt.
    ///
    /// Errors: as `acquire_with`, except that a semaphore that stayed full
    /// is not an error. Cost: as `acquire_with`, plus one round trip when
    /// refused.
    pub async fn acquire_or_holders(
        &self,
        name: &str,
        opts: PermitOptions,
        metadata: Option<&serde_json::Value>,
    ) -> Result<crate::Acquired<Permit>> {
        validate::name("name", name)?;
        let meta = crate::inspect::optional_metadata(metadata)?;
        match self.acquire_meta(name, opts, meta).await {
            Ok(p) => Ok(crate::Acquired::Granted(p)),
            Err(Error::Timeout { .. }) => crate::inspect::after_refusal(self.inspect(name)).await,
            Err(e) => Err(e),
        }
    }

    /// The live grants of `name` (holder fingerprint, permits, fencing
    /// token, remaining time, metadata) and queued waiters where the store
    /// can tell. Cost: one round trip.
    ///
    /// ```
    /// # async fn demo(sem: coord_core::Semaphores) -> coord_core::Result<()> {
    /// let info = sem.inspect("gpus").await?;
    /// let taken: u32 = info.holders.iter().map(|h| h.permits).sum();
    /// println!("{taken} permits taken, {:?} waiting", info.waiters);
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, name: &str) -> Result<crate::ClaimInfo> {
        validate::name("name", name)?;
        let store = self.backend.capabilities().backend;
        let record = op!(
            "coord.semaphore.inspect",
            store,
            name,
            self.backend.inspect(name)
        )?;
        Ok(crate::inspect::info(record))
    }

    /// [`Self::acquire_with`] on a name already checked (or made by coord
    /// itself, as the read-write locks' internal names are).
    pub(crate) async fn acquire_checked(&self, name: &str, opts: PermitOptions) -> Result<Permit> {
        self.acquire_meta(name, opts, None).await
    }

    async fn acquire_meta(
        &self,
        name: &str,
        opts: PermitOptions,
        meta: Option<Arc<[u8]>>,
    ) -> Result<Permit> {
        validate::permits(opts.permits, opts.permits_total)?;
        let most = self.backend.max_permits_per_request();
        if opts.permits > most {
            return Err(Error::invalid(
                "permits",
                format!(
                    "is {}; this store takes at most {most} permits at once",
                    opts.permits
                ),
            ));
        }
        let ttl = validate::ttl("ttl", opts.ttl, self.backend.capabilities())?;
        let queue = !opts.wait.is_zero();
        let request = PermitRequest {
            permits: opts.permits,
            total: opts.permits_total,
            ttl,
            queue,
        };
        let queueing = if queue && self.backend.fifo() {
            Queueing::FromFirstAttempt
        } else {
            Queueing::No
        };
        let span = tracing::debug_span!(
            "coord.semaphore.acquire",
            store = self.backend.capabilities().backend,
            name,
            permits = opts.permits,
            permits_total = opts.permits_total,
            outcome = tracing::field::Empty,
            waited_ms = tracing::field::Empty
        );
        let mut guard = acquire_claim(
            ClaimBackend::Semaphore(self.backend.clone()),
            "semaphore acquire",
            name,
            ttl,
            opts.wait,
            self.settings.poll_interval,
            queueing,
            |owner| {
                let (b, meta) = (self.backend.clone(), meta.clone());
                async move {
                    match meta {
                        Some(m) => {
                            b.try_acquire_with_metadata(name, &owner, &request, &m)
                                .await
                        }
                        None => b.try_acquire(name, &owner, &request).await,
                    }
                }
            },
            |owner| {
                let b = self.backend.clone();
                async move { b.subscribe(name, &owner).await }
            },
        )
        .instrument(span)
        .await?;
        if opts.watchdog {
            guard.keep_alive();
        }
        Ok(Permit {
            guard,
            permits: opts.permits,
            permits_total: opts.permits_total,
        })
    }

    /// Remove every grant of `name`, whoever holds it: an operator's tool.
    /// The holders' next renewal or release reports [`Error::NotHeld`] and
    /// their lost signals fire. Returns whether a live grant was removed.
    ///
    /// ```
    /// # async fn demo(sem: coord_core::Semaphores) -> coord_core::Result<()> {
    /// let removed = sem.force_release("slots").await?;
    /// println!("removed live permits: {removed}");
    /// # Ok(()) }
    /// ```
    pub async fn force_release(&self, name: &str) -> Result<bool> {
        validate::name("name", name)?;
        let store = self.backend.capabilities().backend;
        op!(
            "coord.semaphore.force_release",
            store,
            name,
            self.backend.force_release(name),
            crate::acquire::removed_or_free
        )
    }

    /// The raw backend, for the read-write locks built on it.
    pub(crate) fn backend(&self) -> &Stepped<dyn Semaphore> {
        &self.backend
    }
}
