//! Locks: exclusive, lease-bounded, fenced.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::acquire::{Queueing, acquire_claim, removed_or_free};
use crate::backend::Lock;
use crate::claim::{ClaimBackend, Guard, Ownership};
use crate::coord::{Coord, Settings};
use crate::error::{Error, Result};
use crate::types::{Capabilities, FencingToken};
use crate::{validate, wait};

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
    backend: Arc<dyn Lock>,
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
            backend,
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
    /// the attempt's owner token (sent again a few times over about 6 s if
    /// the store does not answer; after that it ends with its TTL).
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

    /// Run `work` while holding `name`, with the watchdog on, and release
    /// afterwards. If ownership is lost while `work` runs, `work` is stopped
    /// (its future dropped) and [`WithLockError::Lock`] carries
    /// [`Error::Lost`].
    ///
    /// `work` receives an [`Ownership`] with the fencing token to pass to
    /// the resources it writes.
    ///
    /// **The work's result is never thrown away.** Once `work` has
    /// finished, a failed release (the store briefly unavailable, or the
    /// lock found expired) is [`WithLockError::Release`], which carries the
    /// output next to the error: the work ran to completion and must not be
    /// redone. The lock then ends at its TTL at the latest. `?` converts
    /// either variant into [`Error`] (dropping the output knowingly); match
    /// on it where the output matters.
    ///
    /// ```
    /// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// use coord_core::{LockOptions, WithLockError};
    /// let locks = coord.locks()?;
    /// let opts = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(5));
    /// let total = match locks.with_lock("report", opts, |held| async move {
    ///     // ... write with held.fencing_token() ...
    ///     held.fencing_token().get()
    /// }).await {
    ///     Ok(total) => total,
    ///     // Done, but the release failed: keep the result, do not redo it.
    ///     Err(WithLockError::Release { output, .. }) => output,
    ///     Err(WithLockError::Lock(e)) => return Err(e),
    /// };
    /// # let _ = total; Ok(()) }
    /// ```
    pub async fn with_lock<F, Fut, T>(
        &self,
        name: &str,
        opts: LockOptions,
        work: F,
    ) -> std::result::Result<T, WithLockError<T>>
    where
        F: FnOnce(Ownership) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self
            .acquire_with(name, opts.watchdog(true))
            .await
            .map_err(WithLockError::Lock)?;
        hold_while(guard, work).await
    }

    /// Take every lock in `names`, all or nothing, in a deadlock-free order:
    /// the names are deduplicated and sorted, then taken one by one, so two
    /// callers with the same names in any order never deadlock (the PHP original's
    /// lock-ordering rule, made a function). Locks already taken are kept
    /// alive by the watchdog while later ones are awaited (and afterwards
    /// only if `opts.watchdog`), so none lapses before all are held. If one
    /// cannot be taken within `opts.wait` (shared by all), those already
    /// taken are released and the error is returned.
    ///
    /// ```
    /// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// use coord_core::LockOptions;
    /// let locks = coord.locks()?;
    /// let opts = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(5));
    /// let both = locks.acquire_all(["account:B", "account:A"], opts).await?;
    /// assert_eq!(both.names(), vec!["account:A", "account:B"]);
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn acquire_all<I, S>(&self, names: I, opts: LockOptions) -> Result<MultiGuard>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut sorted: Vec<String> = names.into_iter().map(|s| s.as_ref().to_owned()).collect();
        for n in &sorted {
            validate::name("names", n)?;
        }
        validate::ttl("ttl", opts.ttl, self.backend.capabilities())?;
        sorted.sort();
        sorted.dedup();
        let deadline = wait::deadline_in(opts.wait);
        let mut guards: Vec<Guard> = Vec::with_capacity(sorted.len());
        for n in &sorted {
            let left = deadline.saturating_duration_since(Instant::now());
            // The locks already taken must not lapse while a later one is
            // awaited: the watchdog keeps them alive until all are held.
            match self.acquire_with(n, opts.wait(left).watchdog(true)).await {
                Ok(g) => guards.push(g),
                Err(e) => {
                    release_all(guards).await;
                    return Err(e);
                }
            }
        }
        if let Some(lost) = guards.iter().find(|g| !g.is_valid()) {
            let name = lost.name().to_string();
            release_all(guards).await;
            return Err(Error::Lost { name });
        }
        if !opts.watchdog {
            guards.iter_mut().for_each(Guard::stop_watchdog);
        }
        Ok(MultiGuard { guards })
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

/// Release guards in reverse order, ignoring errors (they end at their TTL).
async fn release_all(guards: Vec<Guard>) {
    for g in guards.into_iter().rev() {
        let _ = g.release().await;
    }
}

/// Several locks taken by [`Locks::acquire_all`], in sorted order.
#[derive(Debug)]
#[must_use = "dropping a guard releases it in the background; keep it while you rely on the locks"]
pub struct MultiGuard {
    guards: Vec<Guard>,
}

impl MultiGuard {
    /// The held locks' names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.guards.iter().map(|g| g.name()).collect()
    }

    /// The guards, in the order they were taken.
    pub fn guards(&self) -> &[Guard] {
        &self.guards
    }

    /// The fencing token of the lock called `name`.
    pub fn fencing_token(&self, name: &str) -> Option<FencingToken> {
        self.guards
            .iter()
            .find(|g| g.name() == name)
            .map(|g| g.fencing_token())
    }

    /// Start the watchdog on every lock.
    pub fn keep_alive(&mut self) {
        self.guards.iter_mut().for_each(Guard::keep_alive);
    }

    /// Release every lock, in reverse order. Returns the first error, after
    /// trying them all.
    pub async fn release(self) -> Result<()> {
        let mut first = None;
        for g in self.guards.into_iter().rev() {
            if let Err(e) = g.release().await {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// Run `work` under `guard` (its watchdog on), stop it (drop its future)
/// if ownership is lost meanwhile, and end the claim afterwards: the
/// scoped forms [`Locks::with_lock`] and
/// [`Elections::with_leadership`](crate::Elections::with_leadership).
pub(crate) async fn hold_while<F, Fut, T>(
    guard: Guard,
    work: F,
) -> std::result::Result<T, WithLockError<T>>
where
    F: FnOnce(Ownership) -> Fut,
    Fut: Future<Output = T>,
{
    let name = guard.name().to_string();
    let lost = guard.lost();
    let fut = work(guard.ownership());
    tokio::select! {
        biased;
        _ = lost => {
            let _ = guard.release().await;
            Err(WithLockError::Lock(Error::Lost { name }))
        }
        output = fut => {
            match guard.release().await {
                Ok(()) => Ok(output),
                Err(Error::NotHeld { .. }) => Err(WithLockError::Release {
                    output,
                    error: Error::Lost { name },
                }),
                Err(error) => Err(WithLockError::Release { output, error }),
            }
        }
    }
}

/// Why [`Locks::with_lock`] (or
/// [`Elections::with_leadership`](crate::Elections::with_leadership)) did
/// not simply return the work's output. For a leadership, "lock" reads
/// "leadership" and "release" reads "resign".
#[derive(Debug)]
pub enum WithLockError<T> {
    /// The lock was not acquired, or it was lost while the work ran (the
    /// work was stopped before it finished: [`Error::Lost`]). There is no
    /// output.
    Lock(Error),
    /// The work finished, then releasing the lock failed: `error` says why
    /// ([`Error::Lost`] if the store no longer held it for us, so part of
    /// the work may have run unprotected). The lock ends at its TTL at the
    /// latest. `output` is the work's result: do not redo the work.
    Release {
        /// What the work returned.
        output: T,
        /// Why the release failed.
        error: Error,
    },
}

impl<T> WithLockError<T> {
    /// The error, dropping any output.
    pub fn error(&self) -> &Error {
        match self {
            WithLockError::Lock(e) | WithLockError::Release { error: e, .. } => e,
        }
    }

    /// The work's output, if it finished.
    pub fn into_output(self) -> Option<T> {
        match self {
            WithLockError::Lock(_) => None,
            WithLockError::Release { output, .. } => Some(output),
        }
    }
}

impl<T> std::fmt::Display for WithLockError<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WithLockError::Lock(e) => e.fmt(f),
            WithLockError::Release { error, .. } => write!(
                f,
                "the work under the lock finished, but releasing the lock failed \
                 (it ends at its TTL; do not redo the work): {error}"
            ),
        }
    }
}

impl<T: std::fmt::Debug> std::error::Error for WithLockError<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.error())
    }
}

impl<T> From<WithLockError<T>> for Error {
    /// The error; a finished work's output is dropped.
    fn from(e: WithLockError<T>) -> Error {
        match e {
            WithLockError::Lock(e) | WithLockError::Release { error: e, .. } => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_error_keeps_the_output_and_its_source() {
        let e: WithLockError<u32> = WithLockError::Release {
            output: 7,
            error: Error::Lost { name: "a".into() },
        };
        let source = std::error::Error::source(&e).expect("the release error is the source");
        assert_eq!(
            source.to_string(),
            Error::Lost { name: "a".into() }.to_string()
        );
        assert!(e.to_string().contains("do not redo the work"), "{e}");
        assert!(e.error().is_ownership_lost());
        assert_eq!(e.into_output(), Some(7));
        let e: WithLockError<u32> = WithLockError::Lock(Error::NotHeld { name: "a".into() });
        assert!(std::error::Error::source(&e).is_some());
        assert_eq!(e.into_output(), None);
    }
}
