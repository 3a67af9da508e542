//! Locks: exclusive, lease-bounded, fenced.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::acquire::{Queueing, acquire_claim, removed_or_free};
use crate::backend::Lock;
use crate::claim::{ClaimBackend, Guard};
use crate::coord::{Coord, Settings};
use crate::error::{Error, Result};
use crate::late::Stepped;
use crate::types::Capabilities;
use crate::validate;

mod multi;
mod scoped;

pub use multi::MultiGuard;
pub use scoped::WithLockError;
pub(crate) use scoped::hold_while;

/// The semaphore that hands out the tickets of fair lock `name` (no name
/// a user gives contains a control character).
fn ticket_name(name: &str) -> String {
    format!("\u{1}fair\u{1}{name}")
}

/// How to take a lock: its TTL, how long to wait, and whether the watchdog
/// keeps it alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockOptions {
    /// Time-to-live of the grant (and of each renewal).
    pub ttl: Duration,
    /// How long `acquire` waits for the lock; zero means one attempt.
    pub wait: Duration,
    /// Start the watchdog on the guard.
    pub watchdog: bool,
    /// Fair: waiters that asked with `fair` are granted in arrival order.
    /// Each first takes a ticket, the one permit of a FIFO semaphore kept
    /// beside the lock (its place in that queue expires if its client
    /// crashes), then the lock itself. The ticket has the lock's TTL and is
    /// renewed while the lock's watchdog runs; it is given back once the
    /// lock's release has been answered, and at once when the lock is lost,
    /// so it never outlives the lock by more than its TTL. Exclusion and the fencing
    /// token are the lock's own, so fair and unfair acquirers of one name
    /// still exclude each other (an unfair one simply does not queue). On
    /// a store whose locks already queue in order (etcd) no ticket is
    /// taken. [`Error::Unsupported`] where the store has no FIFO
    /// semaphores (Redlock). Cost: the ticket's acquire and release, two
    /// more round trips per grant, and its renewals.
    pub fair: bool,
}

impl LockOptions {
    /// A TTL, no waiting, no watchdog, not fair.
    pub fn new(ttl: Duration) -> Self {
        LockOptions {
            ttl,
            wait: Duration::ZERO,
            watchdog: false,
            fair: false,
        }
    }

    /// Wait up to `wait` for the lock.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Keep the lock alive with the watchdog until release.
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }

    /// Grant the waiters that ask with `fair` in arrival order (see the
    /// field [`fair`](LockOptions#structfield.fair)).
    ///
    /// ```
    /// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// use coord_core::LockOptions;
    /// let opts = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(30)).fair(true);
    /// let guard = coord.locks()?.acquire_with("ledger", opts).await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn fair(mut self, on: bool) -> Self {
        self.fair = on;
        self
    }
}

/// Locks on one store: exclusive, lease-bounded, owner-checked, fenced.
///
/// **Not reentrant.** Every acquire is an owner of its own: a task (or
/// another task of the same process) that acquires a name it already
/// holds waits for its own guard like any other client, so `acquire`
/// times out after its wait and `try_acquire` returns `None`. Pass the
/// guard (or its [`Ownership`](crate::Ownership)) down instead of taking
/// the lock again.
///
/// Cheap to clone. Get one with [`Coord::locks`].
///
/// ```
/// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
/// use std::time::Duration;
/// let locks = coord.locks()?;
/// let guard = locks.acquire("order:42", Duration::from_secs(30), Duration::from_secs(5)).await?;
/// println!("holding {} with fencing token {}", guard.name(), guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Locks {
    backend: Stepped<dyn Lock>,
    settings: Settings,
    /// The FIFO semaphores fair locks take their tickets from, if the
    /// store has them.
    tickets: Option<crate::Semaphores>,
}

impl std::fmt::Debug for Locks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locks")
            .field("backend", &self.backend.capabilities().backend)
            .finish_non_exhaustive()
    }
}

impl Coord {
    /// The locks of this store.
    ///
    /// Errors: [`Error::Unsupported`] if the backend has no locks.
    pub fn locks(&self) -> Result<Locks> {
        let tickets = self.semaphores().ok().filter(|s| s.is_fifo());
        Ok(Locks {
            backend: self.lock.clone().ok_or_else(|| self.unsupported("locks"))?,
            settings: self.settings,
            tickets,
        })
    }
}

impl Locks {
    /// A fair lock (see [`LockOptions::fair`]): the ticket first, in
    /// arrival order, then the lock within what is left of the wait; the
    /// ticket rides on the lock's guard and ends after it.
    async fn acquire_fair(
        &self,
        name: &str,
        opts: LockOptions,
        meta: Option<Arc<[u8]>>,
    ) -> Result<Guard> {
        validate::name("name", name)?;
        validate::ttl("ttl", opts.ttl, self.backend.capabilities())?;
        let Some(tickets) = &self.tickets else {
            return Err(Error::Unsupported {
                backend: self.backend.capabilities().backend,
                primitive: "fair locks",
                reason: "fair locks queue on the store's FIFO semaphores, which this store has not",
            });
        };
        let started = Instant::now();
        // The ticket lives as the lock does: the same TTL, and a watchdog
        // only while the lock's runs (see `Guard::attach`), so a lock that
        // expires or is lost takes its ticket with it.
        let ticket_opts = crate::PermitOptions::new(1, opts.ttl)
            .wait(opts.wait)
            .watchdog(true);
        let ticket = match tickets
            .acquire_checked(&ticket_name(name), ticket_opts)
            .await
        {
            Ok(t) => t,
            Err(Error::Timeout { .. }) => {
                return Err(Error::Timeout {
                    operation: "lock acquire",
                    name: name.to_string(),
                    waited: started.elapsed(),
                });
            }
            Err(e) => return Err(e),
        };
        let rest = LockOptions {
            wait: opts.wait.saturating_sub(started.elapsed()),
            fair: false,
            ..opts
        };
        match Box::pin(self.acquire_inner(name, rest, meta)).await {
            Ok(mut guard) => {
                guard.attach(ticket.into_guard());
                Ok(guard)
            }
            Err(e) => {
                // Given back before the refusal is reported, so a refused
                // attempt leaves nothing behind (a failure leaves it to
                // its TTL; it is sent again in the background).
                let _ = ticket.release().await;
                Err(match e {
                    Error::Timeout {
                        operation, name, ..
                    } => Error::Timeout {
                        operation,
                        name,
                        waited: started.elapsed(),
                    },
                    other => other,
                })
            }
        }
    }

    /// Locks over a raw backend, with these settings.
    pub fn new(backend: Arc<dyn Lock>, settings: Settings) -> Self {
        Locks {
            backend: Stepped::new(backend),
            settings,
            tickets: None,
        }
    }

    /// The same locks with `tickets`, FIFO semaphores of the same store,
    /// for fair locks ([`LockOptions::fair`]).
    pub fn with_tickets(mut self, tickets: crate::Semaphores) -> Self {
        self.tickets = Some(tickets);
        self
    }

    /// What the backend promises.
    pub fn capabilities(&self) -> &Capabilities {
        self.backend.capabilities()
    }

    /// One attempt to take `name` for `ttl`. `Ok(None)` if somebody else
    /// holds it.
    ///
    /// Errors: [`Error::InvalidArgument`] (nothing sent) for a bad name or
    /// TTL; store errors. Cost: one round trip. Cancel-safe in the sense that
    /// a cancelled attempt that did take the lock leaves it to its TTL.
    pub async fn try_acquire(&self, name: &str, ttl: Duration) -> Result<Option<Guard>> {
        match self.acquire_with(name, LockOptions::new(ttl)).await {
            Ok(g) => Ok(Some(g)),
            Err(Error::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Take `name` for `ttl`, waiting up to `wait` for it to be free.
    /// Waiters are woken by the store when the lock is released (and retry
    /// at the holder's expiry and at a jittered poll interval at the
    /// latest).
    ///
    /// Errors: [`Error::Timeout`] if it stayed busy (nothing is held);
    /// [`Error::InvalidArgument`] (nothing sent); store errors.
    /// Cost uncontended: one round trip. Cancel-safe: if the future is
    /// dropped mid-wait, whatever this attempt may have been granted (or a
    /// queueing store's place in line) is released in the background with
    /// the attempt's owner token (sent again while the store does not
    /// answer, for up to 10 minutes; after that it ends with its TTL).
    pub async fn acquire(&self, name: &str, ttl: Duration, wait: Duration) -> Result<Guard> {
        self.acquire_with(name, LockOptions::new(ttl).wait(wait))
            .await
    }

    /// Take `name` as `opts` say. See [`acquire`](Locks::acquire).
    pub async fn acquire_with(&self, name: &str, opts: LockOptions) -> Result<Guard> {
        self.acquire_inner(name, opts, None).await
    }

    /// Take `name` as `opts` say, storing `metadata` (who, why) with the
    /// grant for [`inspect`](Locks::inspect) to show. At most
    /// [`MAX_METADATA_BYTES`](crate::inspect::MAX_METADATA_BYTES) as JSON,
    /// checked before any I/O.
    ///
    /// ```
    /// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// use coord_core::LockOptions;
    /// let locks = coord.locks()?;
    /// let who = serde_json::json!({"host": "web-3", "pid": 4242, "job": "nightly"});
    /// let guard = locks
    ///     .acquire_with_metadata("nightly", LockOptions::new(Duration::from_secs(30)), &who)
    ///     .await?;
    /// let info = locks.inspect("nightly").await?;
    /// assert_eq!(info.holders[0].metadata.as_ref(), Some(&who));
    /// assert_eq!(info.holders[0].owner_id, guard.owner_id());
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn acquire_with_metadata(
        &self,
        name: &str,
        opts: LockOptions,
        metadata: &serde_json::Value,
    ) -> Result<Guard> {
        let meta = crate::inspect::metadata_bytes(metadata)?;
        self.acquire_inner(name, opts, Some(meta.into())).await
    }

    /// Take `name` as `opts` say (with `metadata`, if given, as
    /// [`acquire_with_metadata`](Locks::acquire_with_metadata) stores it),
    /// or, if it stayed busy for `opts.wait`, say who holds it:
    /// [`Acquired::Held`](crate::Acquired::Held) with the holder's
    /// [`owner_id`](Guard::owner_id), fencing token, remaining time and
    /// metadata, read right after the last refused attempt. What a CLI or an
    /// operator page shows instead of a bare "busy".
    ///
    /// Errors: as [`acquire_with`](Locks::acquire_with), except that a
    /// lock that stayed busy is not an error. Cost: as `acquire_with`, plus
    /// one round trip when refused.
    pub async fn acquire_or_holders(
        &self,
        name: &str,
        opts: LockOptions,
        metadata: Option<&serde_json::Value>,
    ) -> Result<crate::Acquired<Guard>> {
        let meta = crate::inspect::optional_metadata(metadata)?;
        match self.acquire_inner(name, opts, meta).await {
            Ok(g) => Ok(crate::Acquired::Granted(g)),
            Err(Error::Timeout { .. }) => crate::inspect::after_refusal(self.inspect(name)).await,
            Err(e) => Err(e),
        }
    }

    /// Who holds `name`, as the store records it: the holder's
    /// [`owner_id`](Guard::owner_id), fencing token, remaining time and
    /// metadata (none when it is free), and queued waiters where the store
    /// can tell. An operator's view: by the time it is read it may have
    /// changed. Cost: one round trip.
    ///
    /// ```
    /// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
    /// let info = coord.locks()?.inspect("nightly").await?;
    /// println!("{} holder(s), waiters {:?}", info.holders.len(), info.waiters);
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, name: &str) -> Result<crate::ClaimInfo> {
        validate::name("name", name)?;
        let store = self.backend.capabilities().backend;
        let record = op!(
            "coord.lock.inspect",
            store,
            name,
            self.backend.inspect(name)
        )?;
        Ok(crate::inspect::info(record))
    }

    async fn acquire_inner(
        &self,
        name: &str,
        opts: LockOptions,
        meta: Option<Arc<[u8]>>,
    ) -> Result<Guard> {
        if opts.fair && !self.backend.capabilities().fair {
            return self.acquire_fair(name, opts, meta).await;
        }
        validate::name("name", name)?;
        let ttl = validate::ttl("ttl", opts.ttl, self.backend.capabilities())?;
        let span = tracing::debug_span!(
            "coord.lock.acquire",
            store = self.backend.capabilities().backend,
            name,
            outcome = tracing::field::Empty,
            waited_ms = tracing::field::Empty
        );
        let mut guard = acquire_claim(
            ClaimBackend::Lock(self.backend.clone()),
            "lock acquire",
            name,
            ttl,
            opts.wait,
            self.settings.poll_interval,
            Queueing::once_subscribed(self.backend.capabilities().fair),
            |owner| {
                let (b, meta) = (self.backend.clone(), meta.clone());
                async move {
                    match meta {
                        Some(m) => b.try_acquire_with_metadata(name, &owner, ttl, &m).await,
                        None => b.try_acquire(name, &owner, ttl).await,
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
        Ok(guard)
    }

    /// Remove `name` whoever holds it: an operator's tool. The holder's
    /// next renewal or release reports [`Error::NotHeld`] and its lost
    /// signal fires. Returns whether a live lock was removed.
    pub async fn force_release(&self, name: &str) -> Result<bool> {
        validate::name("name", name)?;
        let store = self.backend.capabilities().backend;
        op!(
            "coord.lock.force_release",
            store,
            name,
            self.backend.force_release(name),
            removed_or_free
        )
    }
}
