//! [`Permit`]: held semaphore permits, a blocking guard plus their count.

use std::ops::{Deref, DerefMut};

use super::{Claim, Guard};
use crate::Result;
use crate::blocking::Rt;

/// Semaphore permits that are held: a [`Guard`] (through `Deref`), plus
/// how many. The blocking form of [`crate::Permit`]; released on drop as
/// every guard.
#[must_use = "dropping a permit releases it; keep it while you rely on it"]
pub struct Permit {
    guard: Guard,
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.guard.fmt(f)
    }
}

impl Permit {
    pub(in crate::blocking) fn new(permit: coord_core::Permit, rt: Rt) -> Permit {
        Permit {
            guard: Guard::new(Claim::Permit(permit), rt),
        }
    }

    fn inner(&self) -> &coord_core::Permit {
        match self.guard.claim() {
            Claim::Permit(p) => p,
            _ => unreachable!("a blocking permit holds a permit"),
        }
    }

    /// How many permits this grant holds.
    pub fn permits(&self) -> u32 {
        self.inner().permits()
    }

    /// The name's `permits_total` this grant was taken under.
    pub fn permits_total(&self) -> u32 {
        self.inner().permits_total()
    }

    /// Give the permits back iff this owner still holds them, waking the
    /// waiters that can now be granted. Errors: as [`Guard::release`].
    pub fn release(self) -> Result<()> {
        self.guard.release()
    }

    /// The underlying guard, for code written against [`Guard`].
    pub fn into_guard(self) -> Guard {
        self.guard
    }
}

impl Deref for Permit {
    type Target = Guard;
    fn deref(&self) -> &Guard {
        &self.guard
    }
}

impl DerefMut for Permit {
    fn deref_mut(&mut self) -> &mut Guard {
        &mut self.guard
    }
}
