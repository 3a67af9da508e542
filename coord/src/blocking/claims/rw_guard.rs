//! [`RwGuard`]: a held read or write lock, a blocking guard plus its mode.

use std::ops::{Deref, DerefMut};

use super::{Claim, Guard};
use crate::blocking::Rt;
use crate::{Result, RwMode};

/// A held read or write lock: a [`Guard`] (through `Deref`), plus its mode.
/// The blocking form of [`crate::RwGuard`]; released on drop.
#[must_use = "dropping a read-write guard releases it"]
pub struct RwGuard {
    guard: Guard,
}

impl std::fmt::Debug for RwGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.guard.fmt(f)
    }
}

impl RwGuard {
    pub(in crate::blocking) fn new(rw: coord_core::RwGuard, rt: Rt) -> RwGuard {
        RwGuard {
            guard: Guard::new(Claim::Rw(rw), rt),
        }
    }

    fn inner(&self) -> &coord_core::RwGuard {
        match self.guard.claim() {
            Claim::Rw(r) => r,
            _ => unreachable!("a blocking read-write guard holds a read-write guard"),
        }
    }

    /// Read or write.
    pub fn mode(&self) -> RwMode {
        self.inner().mode()
    }

    /// The lock's name (as given to [`RwLocks::read`](crate::blocking::RwLocks::read)
    /// or [`RwLocks::write`](crate::blocking::RwLocks::write)).
    pub fn name(&self) -> &str {
        self.inner().name()
    }

    /// The underlying guard, for code written against [`Guard`].
    pub fn into_guard(self) -> Guard {
        self.guard
    }

    /// Release it iff still held, waking the waiters that can now be
    /// granted. Errors: as [`Guard::release`].
    pub fn release(self) -> Result<()> {
        self.guard.release()
    }
}

impl Deref for RwGuard {
    type Target = Guard;
    fn deref(&self) -> &Guard {
        &self.guard
    }
}

impl DerefMut for RwGuard {
    fn deref_mut(&mut self) -> &mut Guard {
        &mut self.guard
    }
}
