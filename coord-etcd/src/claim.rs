//! Claims: locks, elections and named leases. One key per holder or
//! waiter, each on an etcd lease of its own (see `attempt.rs`); this
//! client's bookkeeping of them, its queued lock waiters, handoffs,
//! releases and extends.

pub(crate) mod attempt;
pub(crate) mod entries;
pub(crate) mod handoff;
pub(crate) mod holding;
pub(crate) mod moves;
pub(crate) mod named_lease;
pub(crate) mod waiters;

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use crate::client::Etcd;
use crate::client::turns::Turns;
use entries::{Entry, EntryKey, PRUNE_AT};

/// This client's claims and what it knows of them.
pub(crate) struct Claims {
    pub(crate) etcd: Arc<Etcd>,
    /// This client's claims (held, queued, or with an attempt in flight).
    pub(crate) entries: Mutex<HashMap<EntryKey, Entry>>,
    /// The size of `entries` at which it is next swept.
    pub(crate) prune_at: AtomicUsize,
    /// One call at a time per claim (kind, name, owner): see
    /// [`Claims::one_call`].
    turns: Turns<EntryKey>,
    /// Owners whose one attempt was refused without writing anything: their
    /// next attempt (a waiter's, after subscribing) queues.
    pub(crate) tried: Mutex<HashMap<EntryKey, Instant>>,
    /// Lease moves of held claims whose outcome was never seen (see
    /// `moves.rs`).
    pub(crate) moves: moves::Moves,
}

impl Claims {
    pub(crate) fn new(etcd: Arc<Etcd>) -> Self {
        Claims {
            etcd,
            entries: Mutex::new(HashMap::new()),
            prune_at: AtomicUsize::new(PRUNE_AT),
            turns: Turns::default(),
            tried: Mutex::new(HashMap::new()),
            moves: Mutex::new(HashMap::new()),
        }
    }

    /// The etcd lease ids of this client's claims.
    pub(crate) fn leases(&self) -> Vec<i64> {
        crate::client::lock(&self.entries)
            .values()
            .map(|e| e.lease)
            .collect()
    }
}
