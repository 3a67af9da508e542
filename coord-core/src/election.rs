//! Leader election: leadership is a lease whose term is a fencing token.

use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use futures::Stream;
use tracing::Instrument;

use crate::acquire::{Queueing, acquire_claim};
use crate::backend::Election;
use crate::claim::{ClaimBackend, Guard, Ownership};
use crate::coord::{Coord, Settings};
use crate::error::{Error, Result};
use crate::late::Stepped;
use crate::lock::{WithLockError, hold_while};
use crate::types::{FencingToken, LeaderInfo};
use crate::wake::Waiter;
use crate::{validate, wait};

/// Elections on one store.
///
/// The winner is the candidate that won the race to the store (never a
/// random pick made after the fact); its term is a fencing token that
/// strictly increases over the terms of one election. At most one live
/// leader per term. When a leader resigns the next candidate is woken at
/// once; when it dies, its leadership expires after its TTL and the next
/// candidate takes over.
///
/// ```
/// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
/// use std::time::Duration;
/// let elections = coord.elections()?;
/// let mut leadership = elections
///     .campaign("scheduler", "node-a", Duration::from_secs(10), Duration::from_secs(30))
///     .await?;
/// leadership.keep_alive();
/// let current = elections.leader("scheduler").await?.expect("a leader");
/// assert_eq!(current.candidate, "node-a");
/// assert_eq!(current.term, leadership.term());
/// leadership.resign().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Elections {
    backend: Stepped<dyn Election>,
    settings: Settings,
}

impl std::fmt::Debug for Elections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elections")
            .field("backend", &self.backend.capabilities().backend)
            .finish_non_exhaustive()
    }
}

impl Coord {
    /// The elections of this store. Errors: [`Error::Unsupported`].
    pub fn elections(&self) -> Result<Elections> {
        Ok(Elections {
            backend: self
                .election
                .clone()
                .ok_or_else(|| self.unsupported("elections"))?,
            settings: self.settings,
        })
    }
}

impl Elections {
    /// One attempt to become leader of `name` as `candidate`. `Ok(None)` if
    /// somebody else leads. Cost: one round trip.
    pub async fn try_campaign(
        &self,
        name: &str,
        candidate: &str,
        ttl: Duration,
    ) -> Result<Option<Leadership>> {
        match self.campaign(name, candidate, ttl, Duration::ZERO).await {
            Ok(l) => Ok(Some(l)),
            Err(Error::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Campaign until elected or `wait` passes ([`Error::Timeout`]).
    /// Candidates are woken when the leader resigns, and retry at the
    /// leader's expiry. The leadership is not renewed unless you call
    /// [`Guard::keep_alive`] on it (through `Deref`), or use the scoped
    /// form [`with_leadership`](Elections::with_leadership), which does.
    /// Cancel-safe: a dropped campaign holds nothing (a grant that raced the
    /// cancellation is resigned in the background, as this candidate's
    /// grant; it expires at its TTL if the store does not answer).
    pub async fn campaign(
        &self,
        name: &str,
        candidate: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Leadership> {
        validate::name("name", name)?;
        validate::name("candidate", candidate)?;
        let ttl = validate::ttl("ttl", ttl, self.backend.capabilities())?;
        let span = tracing::debug_span!(
            "coord.election.campaign",
            store = self.backend.capabilities().backend,
            name,
            candidate,
            outcome = tracing::field::Empty,
            waited_ms = tracing::field::Empty
        );
        let guard = acquire_claim(
            ClaimBackend::Election(self.backend.clone()),
            "election campaign",
            name,
            ttl,
            wait,
            self.settings.poll_interval,
            Queueing::once_subscribed(self.backend.capabilities().fair),
            |owner| {
                let b = self.backend.clone();
                async move { b.try_campaign(name, candidate, &owner, ttl).await }
            },
            |_| self.backend.subscribe(name),
        )
        .instrument(span)
        .await?;
        Ok(Leadership {
            guard,
            candidate: candidate.to_string(),
        })
    }

    /// Campaign for `name` as `candidate` (waiting up to `wait`), run
    /// `work` as leader with the watchdog renewing the leadership, and
    /// resign afterwards: the scoped form, which keeps the leadership alive
    /// by default (a [`Leadership`] from [`campaign`](Elections::campaign)
    /// is renewed only after [`Guard::keep_alive`]). If the leadership is
    /// lost while `work` runs (the watchdog could not renew it in time, or
    /// it was force-ended), `work` is stopped (its future dropped) and the
    /// error is [`WithLockError::Lock`] with [`Error::Lost`]. `work` gets
    /// an [`Ownership`] whose fencing token is the term.
    ///
    /// **The work's result is never thrown away**: a failed resignation
    /// after `work` finished is [`WithLockError::Release`] with the output.
    ///
    /// ```
    /// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// let elections = coord.elections()?;
    /// let term = elections
    ///     .with_leadership("scheduler", "node-a", Duration::from_secs(10), Duration::from_secs(30),
    ///         |leader| async move {
    ///             // ... schedule, passing leader.fencing_token() to what it writes ...
    ///             leader.fencing_token()
    ///         })
    ///     .await?;
    /// # let _ = term; Ok(()) }
    /// ```
    pub async fn with_leadership<F, Fut, T>(
        &self,
        name: &str,
        candidate: &str,
        ttl: Duration,
        wait: Duration,
        work: F,
    ) -> std::result::Result<T, WithLockError<T>>
    where
        F: FnOnce(Ownership) -> Fut,
        Fut: Future<Output = T>,
    {
        let mut leadership = self
            .campaign(name, candidate, ttl, wait)
            .await
            .map_err(WithLockError::Lock)?;
        leadership.keep_alive();
        hold_while(leadership.guard, work).await
    }

    /// The live leader of `name` and its term, if any. Cost: one round trip.
    pub async fn leader(&self, name: &str) -> Result<Option<LeaderInfo>> {
        validate::name("name", name)?;
        let store = self.backend.capabilities().backend;
        op!(
            "coord.election.leader",
            store,
            name,
            self.backend.leader(name),
            leader_or_vacant
        )
    }

    /// The live leader of `name` as the store records it: its candidate,
    /// term, the owner id of its grant (a fingerprint, never the owner
    /// token) and its remaining time where the store can tell; `None` if
    /// the office is vacant. Cost: one round trip (etcd: two, the second
    /// for the remaining time of the grant's lease, in whole seconds).
    /// Errors: [`Error::Unsupported`] where the backend does not inspect
    /// elections ([`leader`](Self::leader) still answers there).
    pub async fn inspect(&self, name: &str) -> Result<Option<crate::LeaderDetails>> {
        validate::name("name", name)?;
        let store = self.backend.capabilities().backend;
        let record = op!(
            "coord.election.inspect",
            store,
            name,
            self.backend.inspect(name),
            |r: &Option<crate::LeaderRecord>| if r.is_some() { "leader" } else { "vacant" }
        )?;
        Ok(record.map(crate::inspect::leader))
    }

    /// End the leadership of `name` whoever holds it (an operator's tool):
    /// the other candidates are woken and one is elected with a higher
    /// term; the leader's next renewal reports [`Error::NotHeld`] and its
    /// lost signal fires. Returns whether a live leadership was ended. The
    /// leader is read ([`inspect`](Self::inspect)), then resigned as its
    /// owner (owner-checked), and read again if the office changed hands
    /// meanwhile. Cost: two round trips. Errors: [`Error::Unsupported`]
    /// where the store does not inspect elections.
    ///
    /// ```
    /// # async fn demo(elections: coord_core::Elections) -> coord_core::Result<()> {
    /// if elections.force_resign("scheduler").await? {
    ///     println!("the scheduler's leader was made to step down");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn force_resign(&self, name: &str) -> Result<bool> {
        validate::name("name", name)?;
        let store = self.backend.capabilities().backend;
        let b = &self.backend;
        op!(
            "coord.election.force_resign",
            store,
            name,
            crate::force::end_whoever_holds(
                store,
                "election force resign",
                name,
                || async { Ok(b.inspect(name).await?.map(|l| l.holder.owner)) },
                |owner| async move { b.resign(name, &owner).await },
            ),
            crate::acquire::removed_or_free
        )
    }

    /// A stream of leadership changes of `name`: first the current state,
    /// then every change it sees, in order; terms never go back, and a
    /// term it has seen end is never shown again, even by a stale read
    /// (`None` means the office is vacant). Driven by the store's notifications,
    /// with the polling fallback. Changes that happen faster than one round
    /// trip may be seen only as their end state. Retryable store errors are
    /// retried quietly; others are yielded and the stream goes on.
    pub fn observe(
        &self,
        name: &str,
    ) -> Result<impl Stream<Item = Result<Option<LeaderInfo>>> + Send + 'static> {
        validate::name("name", name)?;
        let state = ObserveState {
            backend: self.backend.clone(),
            name: name.to_string(),
            poll: self.settings.poll_interval,
            waiter: None,
            last: None,
            max_term: None,
        };
        Ok(futures::stream::unfold(state, |mut s| async move {
            // One span per item: from asking for it to the change it shows.
            let span = tracing::debug_span!(
                "coord.election.observe",
                store = s.backend.capabilities().backend,
                name = %s.name,
                outcome = tracing::field::Empty
            );
            let item = s.next().instrument(span.clone()).await;
            span.record(
                "outcome",
                match &item {
                    Ok(now) => leader_or_vacant(now),
                    Err(_) => "error",
                },
            );
            Some((item, s))
        }))
    }
}

/// The outcome of a leader read: a `leader` was found, or the office is
/// `vacant`.
fn leader_or_vacant(now: &Option<LeaderInfo>) -> &'static str {
    if now.is_some() { "leader" } else { "vacant" }
}

struct ObserveState {
    backend: Stepped<dyn Election>,
    name: String,
    poll: Duration,
    waiter: Option<Waiter>,
    last: Option<Option<LeaderInfo>>,
    max_term: Option<FencingToken>,
}

impl ObserveState {
    async fn next(&mut self) -> Result<Option<LeaderInfo>> {
        if self.waiter.is_none() {
            let store = self.backend.capabilities().backend;
            self.waiter = Some(match self.backend.subscribe(&self.name).await {
                Ok(w) => w,
                Err(e) => {
                    // Every failed store call counts, retried or not.
                    crate::metrics::error(store, &e);
                    if !e.is_retryable() {
                        return Err(e);
                    }
                    Waiter::never()
                }
            });
        }
        let mut backoff = Duration::from_millis(10);
        loop {
            let waiter = self.waiter.as_ref().expect("subscribed above");
            let notified = waiter.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let mut sleep = wait::jittered(self.poll);
            match self.backend.leader(&self.name).await {
                Ok(now) => {
                    backoff = Duration::from_millis(10);
                    // A term already seen is over once anything else was
                    // seen after it: a stale read (a lagging replica) that
                    // shows it, or a lower one, again is skipped.
                    let goes_back = match (&now, self.max_term) {
                        (Some(info), Some(max)) => info.term <= max,
                        _ => false,
                    };
                    let changed = self.last.as_ref() != Some(&now);
                    if changed && !goes_back {
                        if let Some(info) = &now {
                            self.max_term = Some(info.term);
                        }
                        self.last = Some(now.clone());
                        return Ok(now);
                    }
                }
                Err(e) if e.is_retryable() => {
                    crate::metrics::error(self.backend.capabilities().backend, &e);
                    tracing::debug!(error = %e, "observe: leader read failed, retrying");
                    sleep = backoff;
                    backoff = (backoff * 2).min(self.poll);
                }
                Err(e) => {
                    crate::metrics::error(self.backend.capabilities().backend, &e);
                    return Err(e);
                }
            }
            tokio::select! {
                biased;
                _ = &mut notified => {}
                _ = tokio::time::sleep(sleep) => {}
            }
        }
    }
}

/// Leadership of an election: a [`Guard`] (through `Deref`) whose fencing
/// token is the term, plus the candidate's identity.
#[derive(Debug)]
#[must_use = "dropping a leadership resigns it in the background"]
pub struct Leadership {
    guard: Guard,
    candidate: String,
}

impl Leadership {
    /// The term: a fencing token, strictly increasing over the terms of
    /// this election.
    pub fn term(&self) -> FencingToken {
        self.guard.fencing_token()
    }

    /// The candidate identity this leadership was won with.
    pub fn candidate(&self) -> &str {
        &self.candidate
    }

    /// Step down at once, waking the other candidates and observers.
    /// Errors: [`Error::NotHeld`] if the leadership had already expired.
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }
}

impl Deref for Leadership {
    type Target = Guard;
    fn deref(&self) -> &Guard {
        &self.guard
    }
}

impl DerefMut for Leadership {
    fn deref_mut(&mut self) -> &mut Guard {
        &mut self.guard
    }
}
