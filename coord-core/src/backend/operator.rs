//! What operators' tools need of a store: a health probe and listing.

use async_trait::async_trait;

use crate::error::{Error, Result};

/// What a store says of itself in a health probe.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerInfo {
    /// The server's name and version as it reports them, e.g.
    /// `redis 7.0.15`, `PostgreSQL 15.10`, `etcd 3.4.23`.
    pub version: String,
}

impl ServerInfo {
    /// A server that reports `version`.
    pub fn new(version: impl Into<String>) -> Self {
        ServerInfo {
            version: version.into(),
        }
    }
}

/// A health probe: the store-specific half of
/// [`Coord::health`](crate::Coord::health).
#[async_trait]
pub trait Probe: Send + Sync + 'static {
    /// One round trip to the store that reads no coord state (a `PING`
    /// or `INFO`, a `SHOW`, a status call), bounded by the backend's call
    /// timeout like every other call, returning what the server says of
    /// itself. [`Error::Unavailable`] when it does not answer.
    async fn probe(&self) -> Result<ServerInfo>;
}

/// A kind of named state, as [`Coord::list`](crate::Coord::list) lists
/// it. A store's [`Lister`] is asked for every kind but
/// [`Listed::RwLock`]: read-write locks are semaphores underneath, and
/// coord-core picks their names out of the semaphores'.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Listed {
    /// Locks.
    Lock,
    /// Leases.
    Lease,
    /// Elections.
    Election,
    /// Semaphores (read-write locks excluded).
    Semaphore,
    /// Read-write locks.
    RwLock,
    /// Work queues.
    Queue,
}

impl Listed {
    /// Every kind, in the order `coord ls` prints them.
    pub const ALL: [Listed; 6] = [
        Listed::Lock,
        Listed::Lease,
        Listed::Election,
        Listed::Semaphore,
        Listed::RwLock,
        Listed::Queue,
    ];

    /// The kind's name: `lock`, `lease`, `election`, `semaphore`,
    /// `rwlock`, `queue`.
    pub fn as_str(self) -> &'static str {
        match self {
            Listed::Lock => "lock",
            Listed::Lease => "lease",
            Listed::Election => "election",
            Listed::Semaphore => "semaphore",
            Listed::RwLock => "rwlock",
            Listed::Queue => "queue",
        }
    }
}

impl Listed {
    /// The refusal of a store asked to list a kind it has no names for
    /// (one added to [`Listed`] after the store was written).
    pub fn unlisted(self, backend: &'static str) -> Error {
        Error::Unsupported {
            backend,
            primitive: "listing",
            reason: "this kind has no names to list",
        }
    }
}

/// Listing names: the store-specific half of
/// [`Coord::list`](crate::Coord::list).
#[async_trait]
pub trait Lister: Send + Sync + 'static {
    /// Up to `limit` names of `kind` that start with `prefix` (every name
    /// when it is empty) and have state in the store now: a claim held
    /// or just released, a semaphore with grants or waiters, a queue with
    /// messages; in any order, each once. Names whose state has just ended
    /// may be among them: callers inspect each. It reads in steps (`SCAN`,
    /// range reads, a `SELECT` of the kind's live rows), never a command
    /// that blocks the store while it walks every key; each step bounded
    /// by the call timeout. [`Error::Unsupported`](crate::Error::Unsupported) for a
    /// kind whose keys this store's layout cannot tell apart.
    async fn names(&self, kind: Listed, prefix: &str, limit: usize) -> Result<Vec<String>>;
}
