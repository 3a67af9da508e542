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
//! A backend that can refuse such a copy on the server does three things:
//! - it sends a [`stamp`] with every attempt, every release and every
//!   extend: the stamps of one process rise strictly, so an owner's calls
//!   are ordered by when they were made, whichever connection carries them;
//! - it wraps every attempt in [`Unanswered::attempt`] and calls
//!   [`Pending::answered`] once the reply arrived, so the owners with an
//!   attempt that may still be on its way are known;
//! - it sends every release through [`Unanswered::ending`]: the release of
//!   such an owner leaves a mark with its stamp on the server for a while,
//!   and an attempt of that owner stamped before the mark is refused there
//!   and changes nothing; once answered, the owner is forgotten unless
//!   another attempt of it went unanswered meanwhile (that one may be
//!   stamped after the mark, so the owner's next release or extend must
//!   mark again). ([`Unanswered::seen`] and [`Unanswered::forget`] are the
//!   two halves, for a store that needs them apart.)
//!
//! Extends (and renewals) are steps of the owner as attempts are: one that
//! went unanswered may land after a later extend of the same owner and set
//! the expiry back to its own, shorter TTL. So a backend sends every
//! extend through [`Unanswered::step`], which stamps it, tells the store to
//! mark when a step of the owner went unanswered, and remembers it when it
//! goes unanswered itself; the store refuses an extend stamped before the
//! owner's mark, and the caller of such a refused extend (one still
//! waiting, its extend overtaken by a marking one) gets [`superseded`],
//! which changes nothing and can be retried.
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

    /// Send a step of `owner` on `name` (an extend, a renewal) with `send`,
    /// as every store does it: the step is stamped (`stamp`, called after
    /// the owner's unanswered steps were looked up) and told to mark if a
    /// step of the owner went unanswered; unanswered itself (an error, a
    /// timeout, a drop), it is remembered like an attempt; the owner is
    /// forgotten once the store says the mark was left. A step the store
    /// refused as stamped before the owner's mark is
    /// [`superseded`] (retryable: the retry is stamped after the mark).
    pub async fn step<T, F, Fut>(
        &self,
        (name, owner): (&str, &OwnerToken),
        (backend, operation): (&'static str, &'static str),
        stamp: impl FnOnce() -> i64,
        send: F,
    ) -> crate::Result<T>
    where
        F: FnOnce(Step) -> Fut,
        Fut: std::future::Future<Output = crate::Result<Answer<T>>>,
    {
        let seen = self.seen(name, owner);
        let step = Step {
            stamp: stamp(),
            mark: seen.is_some(),
        };
        let pending = self.attempt(name, *owner);
        let answer = send(step).await?;
        pending.answered();
        match answer {
            Answer::Superseded => Err(superseded(backend, operation)),
            Answer::Done { value, marked } => {
                if let (true, Some(seen)) = (marked, seen) {
                    self.forget(name, owner, seen);
                }
                Ok(value)
            }
        }
    }

    /// Send the release (or resign) of `owner` on `name` with `send`, as
    /// every store does it: if a step of the owner went unanswered, the
    /// release is told to mark ([`Step::mark`], with a stamp taken after
    /// every step of the owner was sent) and, once answered, the owner is
    /// forgotten unless another step of it went unanswered meanwhile. The
    /// stamp is taken either way, for stores that send it with every
    /// release.
    pub async fn ending<T, F, Fut>(
        &self,
        (name, owner): (&str, &OwnerToken),
        stamp: impl FnOnce() -> i64,
        send: F,
    ) -> crate::Result<T>
    where
        F: FnOnce(Step) -> Fut,
        Fut: std::future::Future<Output = crate::Result<T>>,
    {
        let seen = self.seen(name, owner);
        let step = Step {
            stamp: stamp(),
            mark: seen.is_some(),
        };
        let value = send(step).await?;
        if let Some(seen) = seen {
            self.forget(name, owner, seen);
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

/// A step of an owner as [`Unanswered::step`] sends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// The step's stamp, taken after every earlier step of the owner was
    /// sent.
    pub stamp: i64,
    /// Whether the step must leave its stamp as the owner's mark: a step
    /// of the owner went unanswered, and its late copy must be refused.
    pub mark: bool,
}

/// What the store answered to a [`Step`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer<T> {
    /// Applied (or found nothing to apply to): its result, and whether the
    /// owner's mark is now at least the step's stamp.
    Done {
        /// The step's result.
        value: T,
        /// Whether the mark was left (only asked of a marking step).
        marked: bool,
    },
    /// Refused, changing nothing: stamped before the owner's mark.
    Superseded,
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

    /// A step: unanswered (dropped mid-call), it is remembered and the
    /// owner's next step is told to mark; forgotten once a step says it
    /// marked, not when the store marked nothing; a refusal is
    /// `superseded` (retryable) and counts as answered.
    #[test]
    fn a_step_marks_after_an_unanswered_one_and_forgets_only_once_marked() {
        use std::future::{Future, ready};
        use std::pin::pin;
        use std::task::{Context, Poll, Waker};
        fn now<F: Future>(f: F) -> F::Output {
            match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
                Poll::Ready(v) => v,
                Poll::Pending => panic!("pending"),
            }
        }
        let u = Unanswered::default();
        let o = OwnerToken::random();
        let ids = ("n", &o);
        let op = ("test", "extend");
        let answered = |marked| {
            ready(Ok(Answer::Done {
                value: true,
                marked,
            }))
        };
        // Answered: nothing remembered, nothing to mark.
        let r = now(u.step(
            ids,
            op,
            || 1,
            |s: Step| {
                assert!(!s.mark);
                answered(false)
            },
        ));
        assert!(r.unwrap());
        assert!(!u.contains("n", &o));
        // Dropped before its answer: remembered.
        {
            let never = std::future::pending::<crate::Result<Answer<bool>>>();
            let mut f = Box::pin(u.step(ids, op, || 2, |_| never));
            assert!(
                pin!(&mut f)
                    .poll(&mut Context::from_waker(Waker::noop()))
                    .is_pending()
            );
        }
        assert!(u.contains("n", &o));
        // The next step is told to mark; the store marked nothing (the
        // claim ended): still remembered, so the release marks.
        let r = now(u.step(
            ids,
            op,
            || 3,
            |s: Step| {
                assert!(s.mark && s.stamp == 3);
                ready(Ok(Answer::Done {
                    value: false,
                    marked: false,
                }))
            },
        ));
        assert!(!r.unwrap());
        assert!(u.contains("n", &o));
        // Refused: superseded, retryable, and answered (not remembered
        // anew), the earlier record kept.
        let r = now(u.step(ids, op, || 4, |_| ready(Ok(Answer::<bool>::Superseded))));
        assert!(matches!(r, Err(crate::Error::Unavailable { .. })), "{r:?}");
        assert!(u.contains("n", &o));
        // Marked: forgotten.
        let r = now(u.step(
            ids,
            op,
            || 5,
            |s: Step| {
                assert!(s.mark);
                answered(true)
            },
        ));
        assert!(r.unwrap());
        assert!(!u.contains("n", &o));
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
