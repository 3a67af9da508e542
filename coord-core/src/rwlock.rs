//! Read-write locks: many readers or one writer, lease-bounded and fenced,
//! written once here on top of the store's FIFO [`Semaphore`].
//!
//! A read-write lock `name` is a semaphore of [`RW_PERMITS`] permits
//! (under a name users cannot write: it starts with a control character):
//! a reader takes one permit, a writer takes all of them. Because the
//! semaphore is FIFO (a request is granted only if it and every request
//! queued ahead of it fit), a writer waiting for the readers to leave
//! blocks the readers that come after it, so writers are never starved;
//! and the readers queued behind a writer are all let in together when it
//! releases. Each grant, read or write, carries a fencing token that rises
//! with every grant of the name, so a write token is above every token
//! issued before it, readers' included.

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use crate::coord::Coord;
use crate::error::{Error, Result};
use crate::semaphore::{PermitOptions, Semaphores};
use crate::validate;
use crate::{Guard, Holder, Permit};

/// The permits of every read-write lock's semaphore: a writer takes them
/// all, a reader one, so at most this many readers hold one at once (fewer
/// on a store that takes fewer permits per request, see
/// [`Semaphore::max_permits_per_request`](crate::Semaphore::max_permits_per_request):
/// etcd 64).
pub const RW_PERMITS: u32 = validate::MAX_PERMITS;

/// The semaphore name of read-write lock `name`. Names users give are
/// checked to hold no control character, so this never collides with a
/// semaphore of theirs.
fn semaphore_name(name: &str) -> String {
    format!("{RW_MARK}{name}")
}

/// What the semaphore of a read-write lock has before the lock's name
/// (no name a user gives contains a control character).
pub(crate) const RW_MARK: &str = "\u{1}rw\u{1}";

/// Read-write locks on one store: any number of readers, or one writer.
///
/// - **Writer-preferring, FIFO.** Requests are granted in arrival order:
///   a reader arriving while a writer waits queues behind the writer, so a
///   stream of readers cannot starve writers; the readers that queued
///   behind a writer are granted together once it releases.
/// - **Lease-bounded** both ways: a crashed reader or writer is gone after
///   its TTL. The guards are [`Guard`]s (through `Deref`): extend,
///   watchdog, lost signal and release work exactly as for locks.
/// - **Fenced**: every grant carries a fencing token, rising with each
///   grant of the name, readers' and writers' alike. A resource can reject
///   a write older than a read it already served.
/// - **No upgrade.** A reader cannot turn into a writer in place (two
///   readers upgrading at once would wait for each other for ever);
///   release the read lock, then take the write lock, and re-read what
///   you read under the new token.
///
/// Needs a store whose semaphores are FIFO ([`Semaphores::is_fifo`]);
/// on others [`Coord::rw_locks`] is [`Error::Unsupported`].
///
/// ```
/// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
/// use std::time::Duration;
/// let rw = coord.rw_locks()?;
/// let ttl = Duration::from_secs(30);
/// let r = rw.read("config", ttl, Duration::from_secs(5)).await?;
/// // ... read the config ...
/// r.release().await?;
/// let w = rw.write("config", ttl, Duration::from_secs(5)).await?;
/// println!("swapping the config with fencing token {}", w.fencing_token());
/// w.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RwLocks {
    semaphores: Semaphores,
}

impl Coord {
    /// The read-write locks of this store.
    ///
    /// Errors: [`Error::Unsupported`] when the store has no semaphores, or
    /// its semaphores do not queue waiters in order (writers could then be
    /// starved).
    ///
    /// ```
    /// # fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
    /// let rw = coord.rw_locks()?;
    /// # let _ = rw; Ok(()) }
    /// ```
    pub fn rw_locks(&self) -> Result<RwLocks> {
        let semaphores = self
            .semaphores()
            .map_err(|_| self.unsupported("read-write locks"))?;
        if !semaphores.is_fifo() {
            return Err(self.unsupported("read-write locks"));
        }
        Ok(RwLocks { semaphores })
    }
}

/// Who holds a read-write lock, as [`RwLocks::inspect`] reads it: a
/// writer or readers, never both.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct RwInfo {
    /// The writer, if one holds it.
    pub writer: Option<Holder>,
    /// The readers holding it.
    pub readers: Vec<Holder>,
    /// How many reads and writes wait, where the store can tell.
    pub waiters: Option<u64>,
}

/// Whether a grant is shared (read) or exclusive (write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RwMode {
    /// Shared with other readers.
    Read,
    /// Exclusive.
    Write,
}

impl RwLocks {
    /// Take `name` for reading: wait up to `wait` (zero: one attempt) while
    /// a writer holds it or waits for it.
    ///
    /// Errors: [`Error::Timeout`] when not granted in time (nothing is
    /// left in the queue); [`Error::InvalidArgument`] for a bad name or
    /// TTL (before any I/O); store errors as they come. Cancel-safe: if the
    /// future is dropped, at any point (leaving the queue after a timeout
    /// included), what it may have been granted and its place in the queue
    /// are released in the background.
    ///
    /// ```
    /// # async fn demo(rw: coord_core::RwLocks) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// let r = rw.read("catalog", Duration::from_secs(10), Duration::from_secs(1)).await?;
    /// assert_eq!(r.mode(), coord_core::RwMode::Read);
    /// r.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn read(&self, name: &str, ttl: Duration, wait: Duration) -> Result<RwGuard> {
        self.take(name, RwMode::Read, ttl, wait).await
    }

    /// Take `name` for writing: wait up to `wait` (zero: one attempt) for
    /// every reader and writer ahead to leave; readers arriving meanwhile
    /// queue behind this writer.
    ///
    /// Errors: as [`read`](RwLocks::read).
    ///
    /// ```
    /// # async fn demo(rw: coord_core::RwLocks) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// let mut w = rw.write("catalog", Duration::from_secs(10), Duration::from_secs(1)).await?;
    /// w.keep_alive(); // the watchdog renews it until release
    /// w.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn write(&self, name: &str, ttl: Duration, wait: Duration) -> Result<RwGuard> {
        self.take(name, RwMode::Write, ttl, wait).await
    }

    /// One attempt to read: `Ok(None)` while a writer holds or waits.
    ///
    /// ```
    /// # async fn demo(rw: coord_core::RwLocks) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// if let Some(r) = rw.try_read("catalog", Duration::from_secs(10)).await? {
    ///     r.release().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn try_read(&self, name: &str, ttl: Duration) -> Result<Option<RwGuard>> {
        none_if_busy(self.take(name, RwMode::Read, ttl, Duration::ZERO).await)
    }

    /// One attempt to write: `Ok(None)` while anybody holds it or waits.
    ///
    /// ```
    /// # async fn demo(rw: coord_core::RwLocks) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// match rw.try_write("catalog", Duration::from_secs(10)).await? {
    ///     Some(w) => w.release().await?,
    ///     None => println!("in use"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn try_write(&self, name: &str, ttl: Duration) -> Result<Option<RwGuard>> {
        none_if_busy(self.take(name, RwMode::Write, ttl, Duration::ZERO).await)
    }

    /// Remove every grant of `name`, readers' and writer's (an operator's
    /// tool): their next renewal or release reports [`Error::NotHeld`] and
    /// their lost signals fire. Returns whether a live grant was removed.
    ///
    /// ```
    /// # async fn demo(rw: coord_core::RwLocks) -> coord_core::Result<()> {
    /// let removed = rw.force_release("catalog").await?;
    /// # let _ = removed; Ok(()) }
    /// ```
    pub async fn force_release(&self, name: &str) -> Result<bool> {
        validate::name("name", name)?;
        let backend = self.semaphores.backend();
        op!(
            "coord.rwlock.force_release",
            backend.capabilities().backend,
            name,
            backend.force_release(&semaphore_name(name)),
            crate::acquire::removed_or_free
        )
    }

    /// Who holds `name`: its writer, or its readers (each with owner id,
    /// fencing token, remaining time), and how many requests wait where the
    /// store can tell. Cost: one round trip.
    ///
    /// ```
    /// # async fn demo(rw: coord_core::RwLocks) -> coord_core::Result<()> {
    /// let info = rw.inspect("catalog").await?;
    /// match &info.writer {
    ///     Some(w) => println!("written by {} (token {})", w.owner_id, w.fencing_token),
    ///     None => println!("{} readers, {:?} waiting", info.readers.len(), info.waiters),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, name: &str) -> Result<RwInfo> {
        validate::name("name", name)?;
        let backend = self.semaphores.backend();
        let record = op!(
            "coord.rwlock.inspect",
            backend.capabilities().backend,
            name,
            backend.inspect(&semaphore_name(name))
        )?;
        let info = crate::inspect::info(record);
        let total = RW_PERMITS.min(backend.max_permits_per_request());
        let (writers, readers): (Vec<_>, Vec<_>) = info
            .holders
            .into_iter()
            .partition(|h| h.permits >= total && total > 1);
        Ok(RwInfo {
            writer: writers.into_iter().next(),
            readers,
            waiters: info.waiters,
        })
    }

    async fn take(
        &self,
        name: &str,
        mode: RwMode,
        ttl: Duration,
        wait: Duration,
    ) -> Result<RwGuard> {
        validate::name("name", name)?;
        // A writer takes every permit: RW_PERMITS, or fewer on a store
        // that takes fewer at once (which then caps concurrent readers).
        let total = RW_PERMITS.min(self.semaphores.backend().max_permits_per_request());
        let permits = match mode {
            RwMode::Read => 1,
            RwMode::Write => total,
        };
        let opts = PermitOptions::new(total, ttl).permits(permits).wait(wait);
        let permit = self
            .semaphores
            .acquire_checked(&semaphore_name(name), opts)
            .await
            .map_err(|e| rename(e, name))?;
        Ok(RwGuard {
            permit,
            mode,
            name: name.to_string(),
        })
    }
}

/// Errors name the user's lock, not its internal semaphore.
fn rename(e: Error, name: &str) -> Error {
    match e {
        Error::Timeout {
            operation: _,
            name: _,
            waited,
        } => Error::Timeout {
            operation: "read-write lock acquire",
            name: name.to_string(),
            waited,
        },
        other => other,
    }
}

fn none_if_busy(r: Result<RwGuard>) -> Result<Option<RwGuard>> {
    match r {
        Ok(g) => Ok(Some(g)),
        Err(Error::Timeout { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A held read or write lock: a [`Guard`] through `Deref`
/// ([`fencing_token`](Guard::fencing_token), [`extend`](Guard::extend),
/// [`keep_alive`](Guard::keep_alive), [`lost`](Guard::lost)), plus its
/// mode. Dropping it releases it in the background, as every guard.
///
/// ```
/// # async fn demo(rw: coord_core::RwLocks) -> coord_core::Result<()> {
/// use std::time::Duration;
/// let r = rw.read("catalog", Duration::from_secs(10), Duration::ZERO).await?;
/// println!("{} read with token {}", r.name(), r.fencing_token());
/// r.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "dropping a read-write guard releases it in the background"]
pub struct RwGuard {
    permit: Permit,
    mode: RwMode,
    name: String,
}

impl RwGuard {
    /// Read or write.
    pub fn mode(&self) -> RwMode {
        self.mode
    }

    /// The lock's name (as given to [`RwLocks::read`] or
    /// [`RwLocks::write`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The underlying guard, for code written against [`Guard`].
    pub fn into_guard(self) -> Guard {
        self.permit.into_guard()
    }

    /// Release it iff still held (compare-and-delete), waking the waiters
    /// that can now be granted. Errors: [`Error::NotHeld`] if it had
    /// expired or been removed (nothing changed).
    pub async fn release(self) -> Result<()> {
        let name = self.name;
        self.permit.release().await.map_err(|e| match e {
            Error::NotHeld { .. } => Error::NotHeld { name },
            other => other,
        })
    }
}

impl Deref for RwGuard {
    type Target = Guard;
    fn deref(&self) -> &Guard {
        &self.permit
    }
}

impl DerefMut for RwGuard {
    fn deref_mut(&mut self) -> &mut Guard {
        &mut self.permit
    }
}
