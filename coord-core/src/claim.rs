//! Guards for held claims (locks, leases, leadership, semaphore permits): validity deadline,
//! extend, release, release-on-drop, the watchdog and the lost-ownership
//! signal. Written once for every backend.

mod backend;
mod guard;
mod ownership;
mod release;
mod watchdog;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics;
use crate::types::{FencingToken, OwnerToken};

pub(crate) use backend::{ClaimBackend, End, EndClaim, end_retrying};
pub use guard::{Guard, LeaseGuard, LockGuard};
pub use ownership::Ownership;

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
