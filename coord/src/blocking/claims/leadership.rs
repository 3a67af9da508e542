//! [`Leadership`]: a won election, a blocking guard plus its term and
//! candidate.

use std::ops::{Deref, DerefMut};

use super::{Claim, Guard};
use crate::blocking::Rt;
use crate::{FencingToken, Result};

/// Leadership of an election: a [`Guard`] (through `Deref`) whose fencing
/// token is the term, plus the candidate's identity. The blocking form of
/// [`crate::Leadership`]; resigned on drop.
#[must_use = "dropping a leadership resigns it"]
pub struct Leadership {
    guard: Guard,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.guard.fmt(f)
    }
}

impl Leadership {
    pub(in crate::blocking) fn new(leadership: coord_core::Leadership, rt: Rt) -> Leadership {
        Leadership {
            guard: Guard::new(Claim::Leadership(leadership), rt),
        }
    }

    fn inner(&self) -> &coord_core::Leadership {
        match self.guard.claim() {
            Claim::Leadership(l) => l,
            _ => unreachable!("a blocking leadership holds a leadership"),
        }
    }

    /// The term: a fencing token, strictly increasing over the terms of
    /// this election.
    pub fn term(&self) -> FencingToken {
        self.inner().term()
    }

    /// The candidate identity this leadership was won with.
    pub fn candidate(&self) -> &str {
        self.inner().candidate()
    }

    /// Step down at once, waking the other candidates and observers.
    /// Errors: as [`Guard::release`].
    pub fn resign(self) -> Result<()> {
        self.guard.release()
    }

    /// The guard alone (the candidate identity dropped).
    pub(in crate::blocking) fn into_guard(self) -> Guard {
        self.guard
    }
}

impl Deref for Leadership {
    type Target = Guard;
    fn deref(&self) -> &Guard {
        &self.guard
    }
}

impl DerefMut for Leadership {
    fn deref_mut(&mut self) -> &mut Guard {
        &mut self.guard
    }
}
