//! Late copies of attempts, for backend authors.
//!
//! An attempt the client gave up on (its call timed out on a slow network,
//! its connection broke after the request left, or the acquire was
//! cancelled mid-call) may still reach the store afterwards, when the
//! acquire has ended and released. Landing then, it would queue a place
//! nobody waits for (holding up every later waiter of a FIFO name until the
//! place lapses) or take permits nobody releases (until their TTL). Landing
//! while its owner holds the claim (its retry was granted, then extended),
//! it would be taken for the holder retrying and set the expiry back to its
//! own, shorter TTL: another owner would be granted while the holder's
//! guard is still valid.
//!
//! **The rule.** Every mutating call of the claim traits carries a
//! [`Step`]: its owner, a stamp (the stamps of one process rise strictly,
//! so an owner's calls are ordered by when they were made, whichever
//! connection carries them) and whether it must leave a mark. The core
//! keeps the book of which owners have a step that may still land
//! ([`Unanswered`], one per handle: [`Stepped`] wraps each backend the
//! core calls), so no backend keeps one. A store that can refuse a late
//! copy on the server:
//! - leaves the stamp of a release, or of an extend, told to
//!   [`mark`](Step::mark) as the owner's mark on the name for a while
//!   (the owner had a step that went unanswered; nearly always it has
//!   not, and nothing is left);
//! - refuses an attempt of the owner stamped before its mark, changing
//!   nothing (it answers as if the name were held);
//! - refuses an extend (a renewal) stamped before its mark with
//!   [`superseded`], changing nothing: its caller, still waiting, can
//!   retry, and the retry is stamped after the mark.
//!
//! So a step whose reply never came cannot land after a later step of
//! its owner and undo it: a late attempt does not take a claim its owner
//! released, a late extend does not set the expiry back to its own,
//! shorter TTL.
//!
//! A record that lives only as long as one owner's hold (a queue delivery:
//! each pop is a consumer of its own) can be that owner's memory itself:
//! it keeps the stamp of the last extend applied to it, and the store
//! refuses an extend stamped no later (as [`superseded`]), with nothing
//! to remember on the client.
//!
//! Releases and extends after answered steps (nearly all) leave no mark, so an idle
//! name still leaves nothing behind. An owner token shared between
//! processes is not covered (only the process that gave up knows); stamps
//! of different processes compare by their wall clocks. Nor is a release
//! whose reply never came: its copy may free a claim its owner took again
//! meanwhile, so an owner token is not used on a name again within
//! [`LATE_COPY_HORIZON`] of such a release (core's guards never use one
//! again at all).
//!
//! ```
//! use coord_core::OwnerToken;
//! use coord_core::late::{Unanswered, stamp};
//!
//! let unanswered = Unanswered::default();
//! let owner = OwnerToken::random();
//! let (first, second) = (stamp(), stamp());
//! assert!(second > first);
//!
//! // An attempt whose reply arrived.
//! let pending = unanswered.attempt("jobs", owner);
//! pending.answered();
//! assert!(!unanswered.contains("jobs", &owner));
//!
//! // An attempt dropped before its reply (an error, a timeout, a cancel).
//! drop(unanswered.attempt("jobs", owner));
//! let seen = unanswered.seen("jobs", &owner).expect("unanswered");
//! // ... the release leaves its mark; meanwhile nothing else went
//! // unanswered, so the owner is forgotten.
//! unanswered.forget("jobs", &owner, seen);
//! assert!(!unanswered.contains("jobs", &owner));
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::OwnerToken;
pub use crate::types::Step;

mod stepped;
pub use stepped::Stepped;

/// How long an owner stays in [`Unanswered`] without being released
/// (a permit leaked with `mem::forget`) before a sweep may drop it: far
/// above the marks backends leave (10–30 s).
pub const UNANSWERED_MEMORY: Duration = Duration::from_secs(300);

/// How long after it was sent a request whose reply never came is taken
/// to be able to reach the store: a late copy later than that is assumed
/// gone. Guards count their deadlines with the TTL of an extend that may
/// still land for this long (`Guard::extend`); it is above the marks stores
/// leave for late attempts (10 s, or twice the call timeout) for any call
/// timeout up to 15 s.
pub const LATE_COPY_HORIZON: Duration = Duration::from_secs(30);

/// How many owners [`Unanswered`] holds before it drops those older than
/// [`UNANSWERED_MEMORY`].
const PRUNE_AT: usize = 1024;

pub use crate::stamp::stamp;

/// The error for a step the store refused because a later step of the same
/// owner, stamped after it, left its mark there first (see the module
/// docs): nothing was changed. Retryable: the retry is stamped after the
/// mark.
pub fn superseded(backend: &'static str, operation: &'static str) -> crate::Error {
    crate::Error::Unavailable {
        backend,
        operation,
        message: "a later step of the same owner reached the store first, so this one changed \
                  nothing"
            .into(),
        source: None,
    }
}

/// The owners (per name) one of whose attempts went unanswered: the client
/// gave up on it, so it may still reach the store. See the module docs.
#[derive(Debug, Default)]
pub struct Unanswered {
    /// When each was recorded, and the record's number.
    map: Mutex<HashMap<(String, OwnerToken), (Instant, u64)>>,
    next: AtomicU64,
}

/// Which record of an owner a release saw ([`Unanswered::seen`]), so that
/// [`Unanswered::forget`] forgets that one only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen(u64);

impl Unanswered {
    fn map(&self) -> MutexGuard<'_, HashMap<(String, OwnerToken), (Instant, u64)>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn mark(&self, name: &str, owner: OwnerToken) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut map = self.map();
        if map.len() >= PRUNE_AT {
            map.retain(|_, (at, _)| at.elapsed() < UNANSWERED_MEMORY);
        }
        map.insert((name.to_string(), owner), (Instant::now(), n));
    }

    /// An attempt of `owner` on `name` about to be sent: unless
    /// [`Pending::answered`] is called, dropping the result records the
    /// owner as having an unanswered attempt.
    pub fn attempt<'a>(&'a self, name: &'a str, owner: OwnerToken) -> Pending<'a> {
        Pending {
            set: self,
            name,
            owner,
            answered: false,
        }
    }

    /// How many (name, owner) pairs the book holds.
    pub fn len(&self) -> usize {
        self.map().len()
    }

    /// Whether the book holds nobody.
    pub fn is_empty(&self) -> bool {
        self.map().is_empty()
    }

    /// Whether an attempt of `owner` on `name` went unanswered (and the
    /// owner was not [`forget`](Self::forget)-ten since).
    pub fn contains(&self, name: &str, owner: &OwnerToken) -> bool {
        let map = self.map();
        // Nearly always empty: no key to build.
        !map.is_empty() && map.contains_key(&(name.to_string(), *owner))
    }

    /// The record of `owner` on `name`, if an attempt of it went
    /// unanswered: its release must leave a mark, then
    /// [`forget`](Self::forget) what it saw.
    pub fn seen(&self, name: &str, owner: &OwnerToken) -> Option<Seen> {
        let map = self.map();
        if map.is_empty() {
            return None;
        }
        map.get(&(name.to_string(), *owner)).map(|(_, n)| Seen(*n))
    }

    /// Send `step`, an attempt of its owner on `name` (an acquire, a
    /// grant, a campaign), with `send`: unless its reply arrives (an error
    /// counts as no reply), the owner is remembered as having a step that
    /// may still land.
    pub async fn attempt_with<T, F, Fut>(&self, name: &str, step: Step, send: F) -> crate::Result<T>
    where
        F: FnOnce(Step) -> Fut,
        Fut: std::future::Future<Output = crate::Result<T>>,
    {
        let pending = self.attempt(name, step.owner);
        let value = send(step).await?;
        pending.answered();
        Ok(value)
    }

    /// Send an extend or renewal of `owner` on `name` with `send`: its step
    /// says to mark if a step of the owner went unanswered, and is stamped
    /// once the book was read, so its mark comes after every step it
    /// marks against; unanswered itself
    /// (an error, a timeout, a drop), it is remembered like an attempt.
    /// The owner stays remembered until its release
    /// ([`ending`](Self::ending)), so every step until then marks. A store
    /// refuses a step stamped before the owner's mark with [`superseded`]
    /// (retryable: the retry is stamped after the mark).
    pub async fn step<T, F, Fut>(&self, name: &str, owner: OwnerToken, send: F) -> crate::Result<T>
    where
        F: FnOnce(Step) -> Fut,
        Fut: std::future::Future<Output = crate::Result<T>>,
    {
        let step = Step {
            mark: self.contains(name, &owner),
            stamp: crate::stamp::stamp(),
            owner,
        };
        let pending = self.attempt(name, step.owner);
        let value = send(step).await?;
        pending.answered();
        Ok(value)
    }

    /// Send the release (or resign, or revoke) of `owner` on `name` with
    /// `send`: its step says to mark if a step of the owner went
    /// unanswered, and is stamped once the book was read, so its mark
    /// comes after every step it marks against;
    /// once answered, the owner is forgotten unless another step of it
    /// went unanswered meanwhile.
    pub async fn ending<T, F, Fut>(
        &self,
        name: &str,
        owner: OwnerToken,
        send: F,
    ) -> crate::Result<T>
    where
        F: FnOnce(Step) -> Fut,
        Fut: std::future::Future<Output = crate::Result<T>>,
    {
        let seen = self.seen(name, &owner);
        let step = Step {
            mark: seen.is_some(),
            stamp: crate::stamp::stamp(),
            owner,
        };
        let value = send(step).await?;
        if let Some(seen) = seen {
            self.forget(name, &step.owner, seen);
        }
        Ok(value)
    }

    /// Forget `owner` on `name` (its release left its mark), unless an
    /// attempt of it went unanswered since the release saw `seen`: that
    /// attempt may be stamped after the mark, so the owner's next release
    /// must leave one again.
    pub fn forget(&self, name: &str, owner: &OwnerToken, seen: Seen) {
        let mut map = self.map();
        let key = (name.to_string(), *owner);
        if map.get(&key).is_some_and(|(_, n)| *n == seen.0) {
            map.remove(&key);
        }
    }
}

/// One attempt on its way (see [`Unanswered::attempt`]).
#[derive(Debug)]
#[must_use = "dropping it at once records the attempt as unanswered"]
pub struct Pending<'a> {
    set: &'a Unanswered,
    name: &'a str,
    owner: OwnerToken,
    answered: bool,
}

impl Pending<'_> {
    /// The attempt's reply arrived (whatever it said).
    pub fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.set.mark(self.name, self.owner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::{Future, ready};
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    /// `f`'s output, polled once (the futures here never wait).
    fn now<F: Future>(f: F) -> F::Output {
        match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(v) => v,
            Poll::Pending => panic!("pending"),
        }
    }

    #[test]
    fn stamps_rise_strictly_across_threads() {
        let all: Vec<i64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..1000).map(|_| stamp()).collect::<Vec<_>>()))
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        let mut sorted = all.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), all.len(), "a stamp repeated");
    }

    #[test]
    fn a_stepped_backend_shows_its_books_size_and_no_owner() {
        let stepped = Stepped::new(std::sync::Arc::new(()));
        let owner = OwnerToken::random();
        drop(stepped.book().attempt("n", owner));
        assert_eq!(stepped.book().len(), 1);
        let shown = format!("{stepped:?}");
        assert_eq!(shown, "Stepped { unanswered: 1, .. }");
        assert!(!shown.contains(&owner.to_hex()));
    }

    #[test]
    fn only_dropped_attempts_are_remembered_per_name() {
        let u = Unanswered::default();
        let (a, b) = (OwnerToken::random(), OwnerToken::random());
        u.attempt("n", a).answered();
        drop(u.attempt("n", b));
        assert!(!u.contains("n", &a));
        assert!(u.contains("n", &b));
        assert!(!u.contains("m", &b));
        let seen = u.seen("n", &b).unwrap();
        u.forget("n", &b, seen);
        assert!(!u.contains("n", &b));
    }

    /// A step: unanswered (dropped mid-call, or failed), it is remembered
    /// and the owner's next steps are told to mark until its release,
    /// which marks and forgets it; an attempt never marks.
    #[test]
    fn a_step_marks_after_an_unanswered_one_until_the_release() {
        let u = Unanswered::default();
        let o = OwnerToken::random();
        // Answered: nothing remembered, nothing to mark.
        let r = now(u.step("n", o, |s: Step| {
            assert!(!s.mark && s.owner == o);
            ready(Ok(true))
        }));
        assert!(r.unwrap());
        assert!(!u.contains("n", &o));
        // Dropped before its answer: remembered.
        {
            let never = std::future::pending::<crate::Result<bool>>();
            let mut f = Box::pin(u.step("n", o, |_| never));
            assert!(
                pin!(&mut f)
                    .poll(&mut Context::from_waker(Waker::noop()))
                    .is_pending()
            );
        }
        assert!(u.contains("n", &o));
        // Every later step marks, with a later stamp, and keeps the owner
        // remembered; an attempt does not mark.
        let mut last = 0;
        for _ in 0..2 {
            let r = now(u.step("n", o, |s: Step| {
                assert!(s.mark && s.stamp > last);
                last = s.stamp;
                ready(Ok(()))
            }));
            r.unwrap();
            assert!(u.contains("n", &o));
        }
        now(u.attempt_with("n", o.step(), |s: Step| {
            assert!(!s.mark);
            ready(Ok(()))
        }))
        .unwrap();
        // Failed (refused as superseded, or unanswered): still remembered.
        let r = now(u.step("n", o, |_| {
            ready(Err::<bool, _>(superseded("test", "extend")))
        }));
        assert!(matches!(r, Err(crate::Error::Unavailable { .. })), "{r:?}");
        assert!(u.contains("n", &o));
        // The release marks, and forgets.
        now(u.ending("n", o, |s: Step| {
            assert!(s.mark);
            ready(Ok(true))
        }))
        .unwrap();
        assert!(!u.contains("n", &o));
        // An attempt that failed is remembered.
        let r = now(u.attempt_with("n", o.step(), |_| ready(Err::<(), _>(superseded("t", "a")))));
        assert!(r.is_err());
        assert!(u.contains("n", &o));
    }

    /// A release and an extend are stamped after the book was read: a
    /// step of the owner that went unanswered before they read it was
    /// stamped before their mark, so the mark refuses its late copy.
    #[test]
    fn releases_and_extends_are_stamped_after_the_steps_they_mark_against() {
        let u = Unanswered::default();
        let o = OwnerToken::random();
        // A step of the owner goes unanswered.
        let unanswered = o.step();
        drop(u.attempt("n", o));
        let sent = now(u.step("n", o, |s: Step| ready(Ok(s)))).unwrap();
        assert!(sent.mark && sent.stamp > unanswered.stamp, "{sent:?}");
        let sent = now(u.ending("n", o, |s: Step| ready(Ok(s)))).unwrap();
        assert!(sent.mark && sent.stamp > unanswered.stamp, "{sent:?}");
    }

    /// Past [`PRUNE_AT`] owners, recording one more drops those recorded
    /// longer than [`UNANSWERED_MEMORY`] ago (a leaked permit's owner is
    /// not kept forever), and keeps the others.
    #[test]
    fn owners_past_the_memory_are_pruned_once_there_are_many() {
        let u = Unanswered::default();
        let now = Instant::now();
        // The monotonic clock starts near boot: older instants may not exist.
        let Some(old) = now.checked_sub(UNANSWERED_MEMORY + Duration::from_secs(1)) else {
            return;
        };
        let kept = OwnerToken::random();
        {
            let mut map = u.map();
            for i in 0..PRUNE_AT - 1 {
                map.insert((format!("n{i}"), OwnerToken::random()), (old, i as u64));
            }
            map.insert(("kept".to_string(), kept), (now, 0));
        }
        let o = OwnerToken::random();
        drop(u.attempt("fresh", o));
        assert!(u.contains("fresh", &o) && u.contains("kept", &kept));
        assert_eq!(u.map().len(), 2, "owners past the memory were kept");
    }

    /// A release forgets only the record it saw: an attempt of the same
    /// owner dropped unanswered during the release is remembered.
    #[test]
    fn a_release_keeps_an_attempt_unanswered_since_it_looked() {
        let u = Unanswered::default();
        let o = OwnerToken::random();
        drop(u.attempt("n", o));
        let seen = u.seen("n", &o).unwrap();
        drop(u.attempt("n", o));
        u.forget("n", &o, seen);
        assert!(
            u.contains("n", &o),
            "the newer unanswered attempt was forgotten"
        );
        let again = u.seen("n", &o).unwrap();
        assert_ne!(again, seen);
        u.forget("n", &o, again);
        assert!(!u.contains("n", &o));
    }
}
