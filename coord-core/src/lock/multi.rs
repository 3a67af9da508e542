//! Several locks taken all or nothing, in a deadlock-free order.

use tokio::time::Instant;

use super::{LockOptions, Locks};
use crate::claim::Guard;
use crate::error::{Error, Result};
use crate::types::FencingToken;
use crate::{validate, wait};

impl Locks {
    /// Take every lock in `names`, all or nothing, in a deadlock-free order:
    /// the names are deduplicated and sorted, then taken one by one, so two
    /// callers with the same names in any order never deadlock. Locks already taken are kept
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
