//! The guard of a held claim: its validity, extend, the watchdog's start
//! and the lost-ownership signal.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::ownership::Ownership;
use super::watchdog::watchdog;
use super::{ClaimBackend, Inner, State, Unseen, deadline_after, lock, spawn_deadline_timer};
use crate::error::{Error, Result};
use crate::metrics;
use crate::types::{FencingToken, OwnerToken};
use crate::validate;

/// A held claim: a lock, a lease, or (inside [`Leadership`](crate::Leadership))
/// a leadership, or (inside [`Permit`](crate::Permit)) semaphore permits.
///
/// - [`fencing_token`](Guard::fencing_token) is the grant's fencing token;
///   pass it to every resource you write to.
/// - [`remaining`](Guard::remaining) is the local validity: measured on the
///   monotonic clock from BEFORE the grant request was sent, minus a drift
///   margin, so it never exceeds what the store would say.
/// - [`keep_alive`](Guard::keep_alive) starts the watchdog, which renews at
///   a third of the TTL and fires [`lost`](Guard::lost) if it cannot renew
///   before the validity deadline, i.e. before the store expires the claim.
/// - [`release`](Guard::release) stops the watchdog first (waiting for a
///   renewal in flight), then releases on the store, owner-checked.
///
/// # Dropping
/// Dropping a guard without calling `release` stops its watchdog and, if a
/// tokio runtime is available, starts a best-effort release in the
/// background (sent again while the store does not answer, for up to 10
/// minutes);
/// otherwise the claim is freed by its TTL. Call `release` to know that it
/// happened.
#[must_use = "dropping a guard releases it in the background; keep it while you rely on the claim"]
pub struct Guard {
    pub(super) inner: Arc<Inner>,
    watchdog: Option<(CancellationToken, JoinHandle<()>)>,
}

/// A lock that is held. See [`Guard`].
pub type LockGuard = Guard;
/// A lease that is held. See [`Guard`].
pub type LeaseGuard = Guard;

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("kind", &self.inner.backend.kind())
            .field("name", &self.inner.name)
            .field("fencing_token", &self.inner.token)
            .field("remaining", &self.remaining())
            .field("watchdog", &self.watchdog.is_some())
            .finish()
    }
}

impl Guard {
    pub(crate) fn new(
        backend: ClaimBackend,
        name: &str,
        owner: OwnerToken,
        token: FencingToken,
        ttl: Duration,
        sent_at: Instant,
    ) -> Guard {
        let held = metrics::Counted::held(backend.store(), backend.metric_kind());
        Guard {
            inner: Arc::new(Inner {
                held,
                backend,
                name: name.into(),
                owner,
                token,
                state: Mutex::new(State {
                    ttl,
                    deadline: deadline_after(sent_at, ttl),
                    counted: ttl,
                    unseen: Unseen::default(),
                }),
                released: AtomicBool::new(false),
                lost_flag: AtomicBool::new(false),
                lost_notify: Notify::new(),
                lost_token: OnceLock::new(),
                ended: Notify::new(),
                replan: Notify::new(),
                op: tokio::sync::Mutex::new(()),
                timer_started: AtomicBool::new(false),
                granted_at: Instant::now(),
                companion: Mutex::new(None),
            }),
            watchdog: None,
        }
    }

    /// Keep `other` while this claim is held: it ends after this one's
    /// release (or release on drop) has been answered, and as soon as this
    /// one is lost; its watchdog runs while this one's does (the ticket of
    /// a fair lock, see [`LockOptions::fair`](crate::LockOptions::fair)).
    pub(crate) fn attach(&mut self, mut other: Guard) {
        if self.watchdog.is_some() {
            other.keep_alive();
        } else {
            other.stop_watchdog();
        }
        *lock(&self.inner.companion) = Some(other);
    }

    /// The claim's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// A fingerprint of this grant's owner token (16 hex digits): what
    /// `inspect` shows as the holder's `owner_id`, so a process can tell
    /// its own grant. It cannot release or extend anything.
    ///
    /// ```
    /// # fn demo(g: coord_core::Guard) { assert_eq!(g.owner_id().len(), 16); }
    /// ```
    pub fn owner_id(&self) -> String {
        crate::inspect::owner_id(&self.inner.owner)
    }

    /// The fencing token of this grant (the term, for a leadership).
    pub fn fencing_token(&self) -> FencingToken {
        self.inner.token
    }

    /// The TTL the claim was last granted or renewed with.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl()
    }

    /// Time left before the local validity deadline; zero once it passed.
    /// Never more than the store would say (it is measured from before the
    /// request was sent, minus a drift margin).
    pub fn remaining(&self) -> Duration {
        self.inner
            .deadline()
            .saturating_duration_since(Instant::now())
    }

    /// Whether the claim is still valid locally: not released, not lost,
    /// deadline not passed.
    pub fn is_valid(&self) -> bool {
        !self.inner.is_released() && !self.inner.is_lost() && !self.remaining().is_zero()
    }

    /// The local validity deadline (tokio's monotonic clock): measured from
    /// before the grant or last renewal was sent, plus its TTL, minus the
    /// drift margin. [`remaining`](Guard::remaining) is the time until it.
    pub fn valid_until(&self) -> Instant {
        self.inner.deadline()
    }

    /// Whether the watchdog is running.
    pub fn has_watchdog(&self) -> bool {
        self.watchdog.is_some()
    }

    /// Extend the claim so it expires `ttl` from now, iff this owner still
    /// holds it (compare-and-expire on the store). Never resurrects an
    /// expired claim and never changes the fencing token. `ttl` becomes the
    /// claim's TTL: a running watchdog renews with it from now on (planning
    /// its next renewal from the new deadline, so a shorter TTL is renewed
    /// in time) and the lost signal follows the new deadline.
    ///
    /// Errors: [`Error::NotHeld`] if the claim was lost (the lost signal
    /// fires too): the store no longer holds it for this owner, or the
    /// guard was already lost (its lost signal fired, or its validity
    /// deadline passed without renewal; nothing is sent then, and the store
    /// ends the claim at its TTL), or the store's answer came only after
    /// the guard was lost (the store extended it; the guard stays lost, and
    /// its release or drop frees it). Once lost, a guard stays lost: acquire
    /// the claim again. [`Error::InvalidArgument`] for a bad TTL (nothing
    /// sent).
    /// Cost: one store round trip. Cancel-safe: if cancelled, the claim may
    /// or may not have been extended. The deadline moves later only on
    /// success; a `ttl` shorter than what is left brings it forward as the
    /// request is sent, whatever the outcome, since the store may have
    /// applied it even when the reply is an error or never comes (a running
    /// watchdog then renews with the claim's previous TTL at once). Such an
    /// unanswered extend may also land after a later renewal: until it can
    /// no longer ([`LATE_COPY_HORIZON`](crate::late::LATE_COPY_HORIZON)),
    /// every deadline is counted with its TTL if that is shorter.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        let ttl = validate::ttl("ttl", ttl, self.inner.backend.capabilities())?;
        let inner = &self.inner;
        let span = tracing::debug_span!(
            "coord.extend",
            store = inner.backend.store(),
            kind = inner.backend.kind(),
            name = %inner.name,
            outcome = tracing::field::Empty
        );
        let r = async {
            let _op = inner.op.lock().await;
            // Released, or lost: a lost guard stays lost, and extending it
            // on the store would keep a claim its holder was told is gone.
            if inner.is_released() || inner.lost_now() {
                return Err(Error::NotHeld {
                    name: inner.name.to_string(),
                });
            }
            let sent_at = Instant::now();
            // Once sent, a shorter TTL may be what the store keeps even if
            // the reply is lost: the local deadline must not outlive it.
            if inner.cap_deadline(deadline_after(sent_at, ttl)) {
                inner.replan.notify_waiters();
            }
            let n = inner.sending(sent_at, ttl);
            let renewed = inner.backend.renew(&inner.name, &inner.owner, ttl).await;
            metrics::observe(inner.backend.store(), &renewed);
            if renewed.is_ok() {
                inner.answered(n);
            }
            if renewed? {
                // Answered only after the guard was lost (its deadline
                // passed, or the signal fired, while the call was on its
                // way): the work under it was told to stop, so it must not
                // hear "extended" now.
                if inner.lost_now() {
                    return Err(Error::NotHeld {
                        name: inner.name.to_string(),
                    });
                }
                inner.renewed(n, sent_at, ttl);
                // A shorter TTL must bring the watchdog's next renewal and
                // the lost timer forward.
                inner.replan.notify_waiters();
                Ok(())
            } else {
                inner.mark_lost("extend found the claim gone");
                Err(Error::NotHeld {
                    name: inner.name.to_string(),
                })
            }
        }
        .instrument(span.clone())
        .await;
        span.record("outcome", end_outcome(&r));
        r
    }

    /// Same as [`extend`](Guard::extend), in lease words.
    pub async fn renew(&self, ttl: Duration) -> Result<()> {
        self.extend(ttl).await
    }

    /// Start the watchdog: it renews the claim with its TTL every third of
    /// the TTL until release. If renewals fail until the validity deadline,
    /// or the store says the claim is gone, [`lost`](Guard::lost) fires
    /// (before the store-side expiry) and the watchdog stops. Calling it
    /// again does nothing. Must be called within a tokio runtime.
    pub fn keep_alive(&mut self) {
        if self.watchdog.is_some() || self.inner.is_released() {
            return;
        }
        let stop = CancellationToken::new();
        let handle = tokio::spawn(watchdog(self.inner.clone(), stop.clone()));
        self.watchdog = Some((stop, handle));
        if let Some(c) = lock(&self.inner.companion).as_mut() {
            c.keep_alive();
        }
    }

    /// Builder form of [`keep_alive`](Guard::keep_alive).
    pub fn with_watchdog(mut self) -> Guard {
        self.keep_alive();
        self
    }

    /// A future that completes when ownership is lost: the watchdog could
    /// not renew in time, a renewal or extend found the claim gone, or the
    /// validity deadline passed without renewal. It does not complete on a
    /// voluntary release. Cancel-safe; owns what it needs (`'static`).
    ///
    /// For the deadline, it is a timer: it completes at or after
    /// [`valid_until`](Guard::valid_until), as late as the runtime gets to
    /// run it (on a loaded machine, milliseconds late or worse), while
    /// [`is_valid`](Guard::is_valid) and [`remaining`](Guard::remaining)
    /// turn at the deadline itself. Check those (and pass the fencing
    /// token) before acting on the claim; do not count on the signal alone.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.inner.clone().lost()
    }

    /// A cancellation token that is cancelled when ownership is lost (same
    /// conditions as [`lost`](Guard::lost)): hand it to work that should stop
    /// when the claim is gone.
    pub fn lost_token(&self) -> CancellationToken {
        spawn_deadline_timer(&self.inner);
        self.inner.token()
    }

    /// A cheap, clonable view of this claim for the code running under it.
    pub fn ownership(&self) -> Ownership {
        Ownership {
            inner: self.inner.clone(),
        }
    }

    /// The store's name, for metrics.
    pub(crate) fn store(&self) -> &'static str {
        self.inner.backend.store()
    }

    /// Stop the watchdog and let the claim end at its TTL, without a call
    /// to the store (nor one on drop).
    pub(crate) fn forget(mut self) {
        self.stop_watchdog();
        if !self.inner.released.swap(true, Ordering::AcqRel) {
            self.inner.ended.notify_waiters();
        }
    }

    pub(crate) fn stop_watchdog(&mut self) {
        if let Some((stop, _handle)) = self.watchdog.take() {
            stop.cancel();
        }
        if let Some(c) = lock(&self.inner.companion).as_mut() {
            c.stop_watchdog();
        }
    }
}

/// The `outcome` of an extend, release, ack or nack span.
pub(super) fn end_outcome(r: &Result<()>) -> &'static str {
    match r {
        Ok(()) => "ok",
        Err(Error::NotHeld { .. }) => "not_held",
        Err(_) => "error",
    }
}
