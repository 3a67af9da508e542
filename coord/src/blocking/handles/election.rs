//! [`Elections`]: blocking campaigns and leadership, and
//! [`LeaderChanges`], an election's changes as a blocking iterator.

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};

use super::hold_while;
use crate::blocking::claims::Leadership;
use crate::blocking::{Rt, check};
use crate::{LeaderDetails, LeaderInfo, Ownership, Result, WithLockError};

/// Leader elections on one store: the blocking form of
/// [`crate::Elections`]. Cheap to clone. Get one with
/// [`Coord::elections`](crate::blocking::Coord::elections).
#[derive(Clone)]
pub struct Elections {
    pub(super) inner: coord_core::Elections,
    pub(super) rt: Rt,
}

impl std::fmt::Debug for Elections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Elections {
    /// One attempt to become leader of `name` as `candidate`. `Ok(None)` if
    /// somebody else leads.
    pub fn try_campaign(
        &self,
        name: &str,
        candidate: &str,
        ttl: Duration,
    ) -> Result<Option<Leadership>> {
        let l = self
            .rt
            .block_on(self.inner.try_campaign(name, candidate, ttl))?;
        Ok(l.map(|l| Leadership::new(l, self.rt.clone())))
    }

    /// Campaign until elected or `wait` passes ([`Error::Timeout`](crate::Error::Timeout)). The
    /// leadership is not renewed unless you call
    /// [`keep_alive`](crate::blocking::Guard::keep_alive) on it.
    pub fn campaign(
        &self,
        name: &str,
        candidate: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Leadership> {
        let l = self
            .rt
            .block_on(self.inner.campaign(name, candidate, ttl, wait))?;
        Ok(Leadership::new(l, self.rt.clone()))
    }

    /// Campaign for `name` (waiting up to `wait`), run `work` as leader
    /// with the watchdog on, then resign: see
    /// [`crate::Elections::with_leadership`]. `work` runs on this thread to
    /// its end (a blocking closure cannot be stopped): if the leadership
    /// was lost meanwhile, the output comes back as
    /// [`WithLockError::Release`] with [`Error::Lost`](crate::Error::Lost).
    pub fn with_leadership<F, T>(
        &self,
        name: &str,
        candidate: &str,
        ttl: Duration,
        wait: Duration,
        work: F,
    ) -> std::result::Result<T, WithLockError<T>>
    where
        F: FnOnce(Ownership) -> T,
    {
        let mut leadership = self
            .campaign(name, candidate, ttl, wait)
            .map_err(WithLockError::Lock)?;
        leadership.keep_alive();
        hold_while(leadership.into_guard(), work)
    }

    /// The live leader of `name` and its term, if any.
    pub fn leader(&self, name: &str) -> Result<Option<LeaderInfo>> {
        self.rt.block_on(self.inner.leader(name))
    }

    /// The live leader of `name` as the store records it; `None` if the
    /// office is vacant.
    pub fn inspect(&self, name: &str) -> Result<Option<LeaderDetails>> {
        self.rt.block_on(self.inner.inspect(name))
    }

    /// The leadership changes of `name`, as an iterator that blocks for
    /// each: first the current state, then every change it sees (see
    /// [`crate::Elections::observe`]). It never ends; use
    /// [`LeaderChanges::next_timeout`] to wait a bounded time.
    pub fn observe(&self, name: &str) -> Result<LeaderChanges> {
        // The stream is built without waiting; it does its I/O when asked
        // for its items, in the client's runtime.
        let stream = self.inner.observe(name)?;
        Ok(LeaderChanges {
            stream: Box::pin(stream),
            rt: self.rt.clone(),
        })
    }
}

/// The leadership changes of an election, from [`Elections::observe`]:
/// `Ok(None)` means the office is vacant. Each `next` blocks until the
/// next change; inside an async runtime it yields
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) at once.
pub struct LeaderChanges {
    stream: Pin<Box<dyn Stream<Item = Result<Option<LeaderInfo>>> + Send>>,
    rt: Rt,
}

impl std::fmt::Debug for LeaderChanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderChanges").finish_non_exhaustive()
    }
}

impl LeaderChanges {
    /// The next change, waiting up to `timeout` for it; `None` if none came
    /// in time (the next call goes on waiting for it).
    pub fn next_timeout(&mut self, timeout: Duration) -> Option<Result<Option<LeaderInfo>>> {
        if let Err(e) = check() {
            return Some(Err(e));
        }
        let stream = &mut self.stream;
        self.rt.runtime().block_on(async move {
            tokio::time::timeout(timeout, stream.next())
                .await
                .ok()
                .flatten()
        })
    }
}

impl Iterator for LeaderChanges {
    type Item = Result<Option<LeaderInfo>>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Err(e) = check() {
            return Some(Err(e));
        }
        self.rt.runtime().block_on(self.stream.next())
    }
}
