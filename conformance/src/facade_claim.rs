//! The single-holder claims taken through the facade (locks, leases,
//! elections), for scenarios that run on each of them alike.

use std::time::Duration;

use coord_core::{Coord, Error, Guard, Leadership, Result};

/// A kind of single-holder claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FacadeClaim {
    /// `Coord::locks`.
    Lock,
    /// `Coord::leases` (one grant, no wait).
    Lease,
    /// `Coord::elections` (candidate `late`).
    Election,
}

/// A claim held through the facade.
#[derive(Debug)]
pub enum Held {
    /// A lock's or a lease's guard.
    Guard(Guard),
    /// An election's leadership.
    Leader(Leadership),
}

impl Held {
    /// Release (resign) it; panics on a store error.
    pub async fn release(self) {
        match self {
            Held::Guard(g) => g.release().await.unwrap(),
            Held::Leader(l) => l.resign().await.unwrap(),
        }
    }
}

impl FacadeClaim {
    /// Take `name` with `ttl`, waiting up to `wait` (a lease: one grant):
    /// `Ok(None)` when refused or timed out waiting.
    pub async fn take(
        self,
        c: &Coord,
        name: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Held>> {
        let r = match self {
            FacadeClaim::Lock => c.locks()?.acquire(name, ttl, wait).await.map(Held::Guard),
            FacadeClaim::Lease => match c.leases()?.grant(name, ttl).await {
                Ok(Some(g)) => Ok(Held::Guard(g)),
                Ok(None) => return Ok(None),
                Err(e) => Err(e),
            },
            FacadeClaim::Election => c
                .elections()?
                .campaign(name, "late", ttl, wait)
                .await
                .map(Held::Leader),
        };
        match r {
            Ok(h) => Ok(Some(h)),
            Err(Error::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The kind's name as stores record it (`lock`, `lease`, `election`).
    pub fn kind(self) -> &'static str {
        match self {
            FacadeClaim::Lock => "lock",
            FacadeClaim::Lease => "lease",
            FacadeClaim::Election => "election",
        }
    }
}
