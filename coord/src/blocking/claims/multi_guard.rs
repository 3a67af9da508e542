//! [`MultiGuard`]: several locks taken together, released together.

use crate::blocking::{Rt, check};
use crate::{FencingToken, Result};

/// Several locks taken by [`Locks::acquire_all`](crate::blocking::Locks::acquire_all),
/// in sorted order. The blocking form of [`crate::MultiGuard`]; every lock
/// is released on drop.
#[must_use = "dropping it releases every lock; keep it while you rely on the locks"]
pub struct MultiGuard {
    /// `None` only once released (or dropped).
    inner: Option<coord_core::MultiGuard>,
    rt: Rt,
}

impl std::fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Some(m) => m.fmt(f),
            None => f.write_str("MultiGuard(ended)"),
        }
    }
}

impl Drop for MultiGuard {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            self.rt.end_on_drop(inner, coord_core::MultiGuard::release);
        }
    }
}

impl MultiGuard {
    pub(in crate::blocking) fn new(inner: coord_core::MultiGuard, rt: Rt) -> MultiGuard {
        MultiGuard {
            inner: Some(inner),
            rt,
        }
    }

    fn inner(&self) -> &coord_core::MultiGuard {
        self.inner
            .as_ref()
            .expect("a multi-guard holds its locks until it ends")
    }

    /// The held locks' names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.inner().names()
    }

    /// The fencing token of the lock called `name`.
    pub fn fencing_token(&self, name: &str) -> Option<FencingToken> {
        self.inner().fencing_token(name)
    }

    /// Whether every lock is still valid locally (see
    /// [`Guard::is_valid`](crate::blocking::Guard::is_valid)).
    pub fn is_valid(&self) -> bool {
        self.inner()
            .guards()
            .iter()
            .all(coord_core::Guard::is_valid)
    }

    /// Start the watchdog on every lock.
    pub fn keep_alive(&mut self) {
        let _entered = self.rt.enter();
        self.inner
            .as_mut()
            .expect("a multi-guard holds its locks until it ends")
            .keep_alive();
    }

    /// Release every lock, in reverse order. Returns the first error, after
    /// trying them all; inside an async runtime
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument), and they
    /// are released in the background, as on drop.
    pub fn release(mut self) -> Result<()> {
        check()?;
        let inner = self
            .inner
            .take()
            .expect("a multi-guard holds its locks until it ends");
        self.rt.block_on(inner.release())
    }
}
