//! `coord release --force KIND NAME`: end what anyone holds of a lock,
//! semaphore, read-write lock, lease or leadership. One code path for the
//! command and the dashboard's force release (`coord ui`).

use clap::ValueEnum;
use coord::{Coord, Error};

/// What a force release ends.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum ReleaseKind {
    /// A lock.
    Lock,
    /// Every permit of a semaphore.
    Semaphore,
    /// Every reader and the writer of a read-write lock.
    Rwlock,
    /// A lease.
    Lease,
    /// The leadership of an election (another candidate is elected).
    Election,
}

impl ReleaseKind {
    /// What is released, in words: `lock`, `the leadership of election`.
    pub fn what(self) -> &'static str {
        match self {
            ReleaseKind::Lock => "lock",
            ReleaseKind::Semaphore => "semaphore",
            ReleaseKind::Rwlock => "read-write lock",
            ReleaseKind::Lease => "lease",
            ReleaseKind::Election => "the leadership of election",
        }
    }
}

/// Force-release `name` of `kind`, held by anyone; whether it was held.
/// The holders learn they lost it at their next renewal.
pub async fn force_release(coord: &Coord, kind: ReleaseKind, name: &str) -> Result<bool, Error> {
    match kind {
        ReleaseKind::Lock => coord.locks()?.force_release(name).await,
        ReleaseKind::Semaphore => coord.semaphores()?.force_release(name).await,
        ReleaseKind::Rwlock => coord.rw_locks()?.force_release(name).await,
        ReleaseKind::Lease => coord.leases()?.force_revoke(name).await,
        ReleaseKind::Election => coord.elections()?.force_resign(name).await,
    }
}
