//! Guards for held claims (locks, leases, leadership, semaphore permits): validity deadline,
//! extend, release, release-on-drop, the watchdog and the lost-ownership
//! signal. Written once for every backend.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backend::{Election, Lease, Lock, Semaphore};
use crate::error::{Error, Result};
use crate::metrics;
use crate::queue_backend::{Lane, MessageId, Queue};
use crate::types::{Capabilities, FencingToken, OwnerToken};
use crate::validate;

/// The store operations a guard needs, for each kind of claim.
#[derive(Clone)]
pub(crate) enum ClaimBackend {
    Lock(Arc<dyn Lock>),
    Lease(Arc<dyn Lease>),
    Election(Arc<dyn Election>),
    Semaphore(Arc<dyn Semaphore>),
    /// A queue delivery: the claim is message `id` of `lane`, in flight to
    /// the guard's owner token; release gives it back (a nack, no delay).
    Delivery {
        queue: Arc<dyn Queue>,
        lane: Lane,
        id: MessageId,
    },
}

/// How a guard ends: released (a delivery: given back at once), or, for a
/// delivery, acked or given back after a delay.
#[derive(Debug, Clone, Copy)]
pub(crate) enum End {
    Release,
    Ack,
    Nack(Duration),
}

impl ClaimBackend {
    /// The store's name (`Capabilities::backend`), for metrics.
    pub(crate) fn store(&self) -> &'static str {
        self.capabilities().backend
    }

    /// The `kind` label of metrics: `lock`, `lease`, `leadership`, `permit`.
    pub(crate) fn metric_kind(&self) -> &'static str {
        match self {
            ClaimBackend::Semaphore(_) => "permit",
            ClaimBackend::Delivery { .. } => "delivery",
            other => other.kind(),
        }
    }

    pub(crate) fn kind(&self) -> &'static str {
        match self {
            ClaimBackend::Lock(_) => "lock",
            ClaimBackend::Lease(_) => "lease",
            ClaimBackend::Election(_) => "leadership",
            ClaimBackend::Semaphore(_) => "semaphore permit",
            ClaimBackend::Delivery { .. } => "queue delivery",
        }
    }

    fn capabilities(&self) -> &Capabilities {
        match self {
            ClaimBackend::Lock(b) => b.capabilities(),
            ClaimBackend::Lease(b) => b.capabilities(),
            ClaimBackend::Election(b) => b.capabilities(),
            ClaimBackend::Semaphore(b) => b.capabilities(),
            ClaimBackend::Delivery { queue, .. } => queue.capabilities(),
        }
    }

    async fn renew(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        match self {
            ClaimBackend::Lock(b) => b.extend(name, owner, ttl).await,
            ClaimBackend::Lease(b) => b.renew(name, owner, ttl).await,
            ClaimBackend::Election(b) => b.renew(name, owner, ttl).await,
            ClaimBackend::Semaphore(b) => b.extend(name, owner, ttl).await,
            ClaimBackend::Delivery { queue, lane, id } => {
                queue.extend(name, *lane, *id, owner, ttl).await
            }
        }
    }

    pub(crate) async fn release(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        self.end(name, owner, End::Release).await
    }

    pub(crate) async fn end(&self, name: &str, owner: &OwnerToken, end: End) -> Result<bool> {
        match self {
            ClaimBackend::Lock(b) => b.release(name, owner).await,
            ClaimBackend::Lease(b) => b.revoke(name, owner).await,
            ClaimBackend::Election(b) => b.resign(name, owner).await,
            ClaimBackend::Semaphore(b) => b.release(name, owner).await,
            ClaimBackend::Delivery { queue, lane, id } => match end {
                End::Ack => queue.ack(name, *lane, *id, owner).await,
                End::Release => queue.nack(name, *lane, *id, owner, Duration::ZERO).await,
                End::Nack(delay) => queue.nack(name, *lane, *id, owner, delay).await,
            },
        }
    }
}

/// The undo of an operation that may have left a claim on the store for
/// `owner` (an acquire dropped or failed midway, a release, ack or nack
/// whose reply never came): end it as that owner (`end`), sent again while
/// the store does not answer. Owner-checked, so it never touches another
/// owner's claim, and ending what is not there changes nothing.
pub(crate) struct EndClaim<'a> {
    pub(crate) backend: &'a ClaimBackend,
    pub(crate) name: &'a str,
    pub(crate) owner: OwnerToken,
    pub(crate) end: End,
}

/// End `owner`'s claim on `name` the way `end` says, sending it again
/// while the store does not answer.
pub(crate) async fn end_retrying(
    backend: &ClaimBackend,
    name: &str,
    owner: &OwnerToken,
    end: End,
) -> Result<bool> {
    crate::settle::retrying(backend.store(), "end_claim", name, || {
        backend.end(name, owner, end)
    })
    .await
}

impl crate::settle::Undo for EndClaim<'_> {
    fn start(self) {
        let (backend, name, owner, end) = (
            self.backend.clone(),
            self.name.to_string(),
            self.owner,
            self.end,
        );
        crate::settle::spawn(async move {
            let _ = end_retrying(&backend, &name, &owner, end).await;
        });
    }
}

/// The safety margin taken off every validity deadline, for clock drift
/// between this process and the store: 1 % of the TTL plus 2 ms (as in
/// Redlock).
pub fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

struct State {
    ttl: Duration,
    deadline: Instant,
    /// The TTL `deadline` was counted with: `ttl`, or shorter while an
    /// extend with a shorter TTL may still land ([`Unseen`]). The watchdog
    /// plans its next renewal from it.
    counted: Duration,
    /// Extends and renewals whose outcome this guard never saw.
    unseen: Unseen,
}

/// The extends and renewals of one guard whose reply never came (an error,
/// a timeout, a cancelled `extend`): each may still reach the store later,
/// after a renewal that was answered, and set the claim's expiry to its own
/// TTL counted from when it lands. Until such a request can no longer land
/// ([`LATE_COPY_HORIZON`](crate::late::LATE_COPY_HORIZON) after it was
/// sent), the guard counts every deadline with the shortest of their TTLs,
/// so the local deadline never outlives the store's expiry whichever
/// copy lands last. The same for every store and every kind of claim.
#[derive(Default)]
struct Unseen {
    /// `(number, ttl, may land until)`, at most a few.
    requests: Vec<(u64, Duration, Instant)>,
    next: u64,
}

impl Unseen {
    /// A request with `ttl` about to be sent at `sent_at`; its number, for
    /// [`Unseen::seen`].
    fn sent(&mut self, ttl: Duration, sent_at: Instant) -> u64 {
        let now = Instant::now();
        self.requests.retain(|(_, _, until)| *until > now);
        self.next += 1;
        let until = sent_at + crate::late::LATE_COPY_HORIZON;
        self.requests.push((self.next, ttl, until));
        self.next
    }

    /// The store answered request `n`: it landed, no copy of it is left.
    fn seen(&mut self, n: u64) {
        self.requests.retain(|(m, _, _)| *m != n);
    }

    /// The TTL to count a deadline with, for a renewal with `ttl`.
    fn counted(&self, ttl: Duration) -> Duration {
        let now = Instant::now();
        self.requests
            .iter()
            .filter(|(_, _, until)| *until > now)
            .map(|(_, t, _)| *t)
            .fold(ttl, Duration::min)
    }
}

/// `m`, locked; a panic elsewhere while it was held does not poison it
/// for the rest.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Inner {
    backend: ClaimBackend,
    name: Box<str>,
    owner: OwnerToken,
    token: FencingToken,
    state: Mutex<State>,
    released: AtomicBool,
    /// Set when ownership is lost (never on a voluntary release); waiters
    /// of `lost_notify` are woken and the token, if anybody asked for one,
    /// is cancelled. The token is made on demand to keep the uncontended
    /// path free of allocations it does not need.
    lost_flag: AtomicBool,
    lost_notify: Notify,
    lost_token: OnceLock<CancellationToken>,
    /// Woken on release, to end helper tasks.
    ended: Notify,
    /// Woken when an explicit extend moved the deadline or changed the TTL,
    /// so the watchdog and the lost timer plan again.
    replan: Notify,
    /// Serialises renewals with release, so no renewal outlives release.
    op: tokio::sync::Mutex<()>,
    timer_started: AtomicBool,
    /// When it was granted, for the hold-time metric.
    granted_at: Instant,
    /// This claim in `coord_held`, until it ends.
    held: metrics::Counted,
    /// A claim that ends after this one (see [`Guard::attach`]).
    companion: Mutex<Option<Guard>>,
}

impl Inner {
    fn deadline(&self) -> Instant {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .deadline
    }

    fn ttl(&self) -> Duration {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).ttl
    }

    /// The TTL the deadline was counted with (see [`State::counted`]).
    fn counted(&self) -> Duration {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).counted
    }

    /// An extend or renewal with `ttl` about to be sent at `sent_at`: until
    /// [`Inner::renewed`] or [`Inner::answered`] says its reply came, it may
    /// land any time later.
    fn sending(&self, sent_at: Instant, ttl: Duration) -> u64 {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.unseen.sent(ttl, sent_at)
    }

    /// The reply to request `n` came, whatever it said.
    fn answered(&self, n: u64) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.unseen.seen(n);
    }

    /// Request `n`, sent at `sent_at` with `ttl`, renewed the claim. The
    /// deadline is counted with the shortest TTL of the requests that may
    /// still land.
    fn renewed(&self, n: u64, sent_at: Instant, ttl: Duration) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.unseen.seen(n);
        let counted = s.unseen.counted(ttl);
        s.ttl = ttl;
        s.counted = counted;
        s.deadline = deadline_after(sent_at, counted);
    }

    /// Bring the deadline forward to `at` if that is earlier (an extend
    /// with a shorter TTL is on its way: once sent, it may land whatever
    /// its caller hears). Returns whether it moved.
    fn cap_deadline(&self, at: Instant) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let earlier = at < s.deadline;
        if earlier {
            s.deadline = at;
        }
        earlier
    }

    fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    fn is_lost(&self) -> bool {
        self.lost_flag.load(Ordering::Acquire)
    }

    fn record_release(&self) {
        self.held.end();
        metrics::released(
            self.backend.store(),
            self.backend.metric_kind(),
            self.granted_at.elapsed(),
        );
    }

    fn mark_lost(&self, why: &'static str) {
        let first = !self.lost_flag.swap(true, Ordering::AcqRel);
        // The token before anything else, and by every caller, not only the
        // first: a second caller returns from `lost()` right after this, and
        // must not do so while the first is still logging (tests/it/lost_signal.rs
        // in coord-memory). `token()` covers a token made after the flag.
        if let Some(t) = self.lost_token.get() {
            t.cancel();
        }
        if first {
            self.held.end();
            tracing::warn!(kind = self.backend.kind(), name = %self.name, why, "ownership lost");
            metrics::lost(self.backend.store(), self.backend.metric_kind());
            self.lost_notify.notify_waiters();
            // Dropped, it is released in the background.
            drop(self.take_companion());
        }
    }

    /// The claim that ends after this one, if any is left.
    fn take_companion(&self) -> Option<Guard> {
        lock(&self.companion).take()
    }

    /// End the companion, after this claim's end was answered.
    async fn end_companion(&self) {
        if let Some(c) = self.take_companion() {
            // Its end is not this claim's: a failure leaves it to its TTL.
            let _ = Box::pin(c.end_own(End::Release)).await;
        }
    }

    /// Whether ownership is lost: the signal fired, or the validity
    /// deadline passed without renewal (which fires it now, whether or not
    /// anybody runs the lost timer). Once lost, a guard stays lost.
    fn lost_now(&self) -> bool {
        if self.is_lost() {
            return true;
        }
        if Instant::now() >= self.deadline() {
            self.mark_lost("validity deadline passed without renewal");
            return true;
        }
        false
    }

    fn token(&self) -> CancellationToken {
        let t = self.lost_token.get_or_init(CancellationToken::new).clone();
        if self.is_lost() {
            t.cancel();
        }
        t
    }

    /// Completes when ownership is lost: the lost token fired, or the
    /// validity deadline passed without a renewal.
    async fn lost(self: Arc<Self>) {
        loop {
            let notified = self.lost_notify.notified();
            let ended = self.ended.notified();
            let replanned = self.replan.notified();
            tokio::pin!(notified);
            tokio::pin!(ended);
            tokio::pin!(replanned);
            notified.as_mut().enable();
            ended.as_mut().enable();
            replanned.as_mut().enable();
            if self.is_lost() {
                // Whoever sees the flag makes sure the token agrees before
                // returning (mark_lost may still be between the two).
                if let Some(t) = self.lost_token.get() {
                    t.cancel();
                }
                return;
            }
            if self.is_released() {
                // A voluntary release is not a loss: never complete.
                return std::future::pending().await;
            }
            let deadline = self.deadline();
            tokio::select! {
                biased;
                _ = &mut notified => {}
                _ = &mut ended => {}
                _ = &mut replanned => {}
                _ = tokio::time::sleep_until(deadline) => {
                    if !self.is_released() && Instant::now() >= self.deadline() {
                        self.mark_lost("validity deadline passed without renewal");
                        return;
                    }
                }
            }
        }
    }
}

fn deadline_after(sent_at: Instant, ttl: Duration) -> Instant {
    sent_at + ttl.saturating_sub(drift(ttl))
}

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
/// background (sent again for about 6 s while the store does not answer);
/// otherwise the claim is freed by its TTL. Call `release` to know that it
/// happened.
#[must_use = "dropping a guard releases it in the background; keep it while you rely on the claim"]
pub struct Guard {
    inner: Arc<Inner>,
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

    /// Release the claim iff this owner still holds it (compare-and-delete
    /// on the store), after stopping the watchdog and waiting for any
    /// renewal in flight. Wakes a waiter.
    ///
    /// Errors: [`Error::NotHeld`] if it had already expired or been taken
    /// over (nothing was changed on the store); store errors as they come
    /// (the release may or may not have landed: it is sent again in the
    /// background, for about 6 s while the store does not answer, and the
    /// claim ends at its TTL at the latest). Cost: one round trip.
    /// Cancel-safe: if the future is dropped before the store answers, the
    /// guard counts as released and the release is sent again in the
    /// background.
    pub async fn release(self) -> Result<()> {
        self.end(End::Release).await
    }

    /// End the claim as `end` says (see [`release`](Guard::release)).
    pub(crate) async fn end(self, end: End) -> Result<()> {
        let inner = self.inner.clone();
        let r = self.end_own(end).await;
        inner.end_companion().await;
        r
    }

    /// End this claim alone (see [`end`](Guard::end)).
    async fn end_own(mut self, end: End) -> Result<()> {
        self.stop_watchdog();
        let inner = self.inner.clone();
        let (store, kind) = (inner.backend.store(), inner.backend.kind());
        let span = match end {
            End::Release => tracing::debug_span!(
                "coord.release",
                store = store,
                kind,
                name = %inner.name,
                outcome = tracing::field::Empty
            ),
            End::Ack => tracing::debug_span!(
                "coord.queue.ack",
                store = store,
                kind,
                name = %inner.name,
                outcome = tracing::field::Empty
            ),
            End::Nack(_) => tracing::debug_span!(
                "coord.queue.nack",
                store = store,
                kind,
                name = %inner.name,
                outcome = tracing::field::Empty
            ),
        };
        let r = async move {
            let _op = inner.op.lock().await;
            if inner.released.swap(true, Ordering::AcqRel) {
                return Err(Error::NotHeld {
                    name: inner.name.to_string(),
                });
            }
            inner.ended.notify_waiters();
            inner.record_release();
            // The guard counts as ended from here on, so the cleanup that
            // its drop would start is off: keep one armed until the store
            // answered. Dropped midway, or answered with an error (the
            // call may or may not have landed), the end is sent again in
            // the background as this owner.
            let again = crate::settle::Armed::new(EndClaim {
                backend: &inner.backend,
                name: &inner.name,
                owner: inner.owner,
                end,
            });
            let r = again
                .settle_with(inner.backend.end(&inner.name, &inner.owner, end))
                .await;
            metrics::observe(inner.backend.store(), &r);
            if r? {
                Ok(())
            } else {
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

    /// Same as [`release`](Guard::release), in lease words.
    pub async fn revoke(self) -> Result<()> {
        self.release().await
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.stop_watchdog();
        if self.inner.is_released() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(name = %self.inner.name, "guard dropped outside a runtime; the TTL will free it");
            return;
        };
        let inner = self.inner.clone();
        let span = tracing::debug_span!(
            "coord.release",
            store = inner.backend.store(),
            kind = inner.backend.kind(),
            name = %inner.name,
            on_drop = true,
            outcome = tracing::field::Empty
        );
        rt.spawn(
            async move {
                let _op = inner.op.lock().await;
                if inner.released.swap(true, Ordering::AcqRel) {
                    return;
                }
                inner.ended.notify_waiters();
                inner.record_release();
                if matches!(inner.backend, ClaimBackend::Delivery { .. }) {
                    metrics::queue_op(inner.backend.store(), "give_back");
                }
                let r = end_retrying(&inner.backend, &inner.name, &inner.owner, End::Release).await;
                inner.end_companion().await;
                let span = tracing::Span::current();
                match r {
                    Ok(true) => {
                        span.record("outcome", "ok");
                    }
                    Ok(false) => {
                        span.record("outcome", "not_held");
                    }
                    Err(e) => {
                        span.record("outcome", "error");
                        metrics::error(inner.backend.store(), &e);
                        tracing::debug!(name = %inner.name, error = %e, "release on drop failed; the TTL will free it");
                    }
                }
            }
            .instrument(span),
        );
    }
}

/// Fire the lost token at the validity deadline even without a watchdog.
fn spawn_deadline_timer(inner: &Arc<Inner>) {
    if inner.timer_started.swap(true, Ordering::AcqRel) {
        return;
    }
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let inner2 = inner.clone();
    rt.spawn(async move {
        let ended = inner2.ended.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        if inner2.is_released() {
            return;
        }
        tokio::select! {
            biased;
            _ = &mut ended => {}
            _ = inner2.clone().lost() => {}
        }
    });
}

/// The `outcome` of an extend, release, ack or nack span.
fn end_outcome(r: &Result<()>) -> &'static str {
    match r {
        Ok(()) => "ok",
        Err(Error::NotHeld { .. }) => "not_held",
        Err(_) => "error",
    }
}

async fn watchdog(inner: Arc<Inner>, stop: CancellationToken) {
    let span = tracing::debug_span!(
        "coord.watchdog",
        store = inner.backend.store(),
        kind = inner.backend.kind(),
        name = %inner.name,
        outcome = tracing::field::Empty
    );
    let watched = inner.clone();
    async move {
        loop {
            // Renew when two thirds of the TTL are left: a third of the TTL
            // after each renewal, and at once for a watchdog started late.
            // An explicit extend re-plans (its TTL may be shorter).
            let replanned = inner.replan.notified();
            tokio::pin!(replanned);
            replanned.as_mut().enable();
            let counted = inner.counted();
            let renew_at = inner
                .deadline()
                .checked_sub(counted * 2 / 3)
                .unwrap_or_else(Instant::now);
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = &mut replanned => continue,
                _ = tokio::time::sleep_until(renew_at.max(Instant::now() + Duration::from_millis(1))) => {}
            }
            if inner.is_lost() {
                return;
            }
            // Renew, retrying until the validity deadline.
            loop {
                let op = tokio::select! {
                    biased;
                    g = inner.op.lock() => g,
                    _ = stop.cancelled() => return,
                };
                if stop.is_cancelled() || inner.is_released() || inner.is_lost() {
                    return;
                }
                let deadline = inner.deadline();
                let sent_at = Instant::now();
                if sent_at >= deadline {
                    inner.mark_lost("watchdog could not renew before the validity deadline");
                    return;
                }
                let ttl = inner.ttl();
                let n = inner.sending(sent_at, ttl);
                let r = tokio::time::timeout_at(
                    deadline,
                    inner.backend.renew(&inner.name, &inner.owner, ttl),
                )
                .await;
                if matches!(r, Ok(Ok(_))) {
                    inner.answered(n);
                }
                drop(op);
                if !matches!(r, Ok(Ok(true))) {
                    metrics::renewal(inner.backend.store(), inner.backend.metric_kind(), false);
                }
                if let Ok(Err(e)) = &r {
                    metrics::error(inner.backend.store(), e);
                }
                match r {
                    Ok(Ok(true)) if inner.is_lost() => {
                        // Lost while the renewal was on its way: stays lost.
                        return;
                    }
                    Ok(Ok(true)) => {
                        metrics::renewal(inner.backend.store(), inner.backend.metric_kind(), true);
                        inner.renewed(n, sent_at, ttl);
                        tracing::trace!("renewed");
                        break;
                    }
                    Ok(Ok(false)) => {
                        inner.mark_lost("the store no longer holds the claim for this owner");
                        return;
                    }
                    Ok(Err(e)) if !e.is_retryable() => {
                        tracing::warn!(error = %e, "renewal failed");
                        inner.mark_lost("renewal failed with a non-retryable error");
                        return;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "renewal failed; retrying until the validity deadline");
                    }
                    Err(_) => {
                        inner.mark_lost("renewal did not complete before the validity deadline");
                        return;
                    }
                }
                let retry = (ttl / 20).max(Duration::from_millis(5));
                let until = (Instant::now() + retry).min(deadline);
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep_until(until) => {}
                }
            }
        }
    }
    .instrument(span.clone())
    .await;
    // It ends when the claim is released (or the watchdog stopped), or
    // when ownership was lost.
    span.record(
        "outcome",
        if watched.is_lost() { "lost" } else { "stopped" },
    );
}

/// A cheap, clonable view of a held claim, for the code running under it
/// (what [`Locks::with_lock`](crate::Locks::with_lock) hands its closure).
#[derive(Clone)]
pub struct Ownership {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Ownership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ownership")
            .field("name", &self.inner.name)
            .field("fencing_token", &self.inner.token)
            .finish_non_exhaustive()
    }
}

impl Ownership {
    /// The claim's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }
    /// The grant's fencing token.
    pub fn fencing_token(&self) -> FencingToken {
        self.inner.token
    }
    /// Time left before the local validity deadline.
    pub fn remaining(&self) -> Duration {
        self.inner
            .deadline()
            .saturating_duration_since(Instant::now())
    }
    /// Whether the claim is still valid locally.
    pub fn is_valid(&self) -> bool {
        !self.inner.is_released() && !self.inner.is_lost() && !self.remaining().is_zero()
    }
    /// Completes when ownership is lost; see [`Guard::lost`].
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.inner.clone().lost()
    }
    /// Cancelled when ownership is lost; see [`Guard::lost_token`].
    pub fn lost_token(&self) -> CancellationToken {
        spawn_deadline_timer(&self.inner);
        self.inner.token()
    }
}
