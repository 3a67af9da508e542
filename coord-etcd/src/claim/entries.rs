//! This client's bookkeeping of its claims (locks, elections, named
//! leases): what it holds, queues or has an attempt in flight for, which
//! owners' last attempt was refused, and the sweep of long-expired claims.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use coord_core::util::Kind;
use coord_core::{Attempt, FencingToken, OwnerToken};
use etcd_client::KeyValue;
use tokio::time::Instant;

use crate::claim::Claims;
use crate::client::pool::Keeper;
use crate::client::turns::OneCall;
use crate::client::{AbortOnDrop, lock};

/// Where a local claim stands.
pub(crate) enum EntryState {
    /// An attempt with this lease is in flight (or its reply was lost).
    Pending,
    /// Granted; the claim ends at `deadline` unless extended.
    Held { deadline: Instant },
    /// Queued behind another key (FIFO locks only).
    Queued(Queued),
}

/// One claim of this client: its key, create revision (the fencing token),
/// and the lease the key is attached to.
pub(crate) struct Entry {
    pub(crate) key: Vec<u8>,
    pub(crate) rev: i64,
    pub(crate) lease: i64,
    /// The lease's TTL in seconds (a keepalive resets it to this).
    pub(crate) lease_ttl: u64,
    /// The lease's keepalive stream, if one is open.
    pub(crate) keeper: Option<Keeper>,
    pub(crate) state: EntryState,
}

/// A queued waiter's predecessor: its key and create revision.
pub(crate) type Pred = (Vec<u8>, i64);

/// A queued waiter's state.
pub(crate) struct Queued {
    /// The key just before ours.
    pub(crate) pred: Option<Pred>,
    /// `pred` was the queue's first key (the holder) at some point: a read
    /// showed it first, or its head marker was seen (see `handoff.rs`).
    /// Once it is gone, this waiter is the first key.
    pub(crate) pred_head: bool,
    /// `pred` (that create revision) is known deleted: a delete event after
    /// the read that began its watch, or absent at that read (not a
    /// cancelled watch).
    pub(crate) pred_deleted: bool,
    /// The server keeps our lease at least until then (send instant of its
    /// last answered keepalive or grant, plus its TTL), if known.
    pub(crate) fresh_until: Option<Instant>,
    /// When the predecessor's deletion was seen.
    pub(super) pred_gone_at: Option<Instant>,
    /// When this waiter last attempted (see `waiters.rs`).
    pub(super) last_attempt: Instant,
    /// The watch on the predecessor's key, while it is on.
    pub(super) watch: Option<AbortOnDrop>,
    /// The keepalive of our lease, ended with this state.
    pub(super) _keepalive: AbortOnDrop,
}

pub(crate) type EntryKey = (Kind, Box<str>, [u8; 16]);

pub(crate) fn entry_key(kind: Kind, name: &str, owner: &OwnerToken) -> EntryKey {
    (kind, name.into(), *owner.as_bytes())
}

/// How long a refused attempt is remembered so that the same owner's next
/// attempt queues (a waiter attempts again at once after subscribing).
pub(crate) const TRIED_MEMORY: Duration = Duration::from_secs(30);

/// When the local bookkeeping is first swept of long-expired claims.
pub(crate) const PRUNE_AT: usize = 1024;
/// How long an expired, never released claim is remembered (a late
/// `release` of it answers `false` either way).
const EXPIRED_MEMORY: Duration = Duration::from_secs(60);

impl Claims {
    /// Wait until no other call of this client on the claim `ek` (its
    /// kind, name and owner) is under way. Each call (attempt, extend,
    /// release, lease grant) reads the claim's record before a round trip
    /// and writes or removes it after, and undoes a concurrent one's
    /// outcome otherwise: an extend that lost to a release and re-acquire
    /// removed the new grant's record and revoked its lease; a release
    /// spared a lease a moving extend was revoking; two extends of
    /// different TTLs each dropped the other's key
    /// (tests/it/same_owner_one_client.rs). Calls on other claims never wait.
    pub(crate) async fn one_call(&self, ek: &EntryKey) -> OneCall<EntryKey> {
        self.turns.take(ek.clone()).await
    }

    pub(crate) fn remember_tried(&self, ek: EntryKey) {
        let now = Instant::now();
        let mut t = lock(&self.tried);
        if t.len() >= 256 {
            t.retain(|_, at| *at + TRIED_MEMORY > now);
        }
        t.insert(ek, now);
    }

    pub(crate) fn take_tried(&self, ek: &EntryKey) -> bool {
        lock(&self.tried)
            .remove(ek)
            .is_some_and(|at| at + TRIED_MEMORY > Instant::now())
    }

    /// Forget a local claim and revoke its lease in the background.
    pub(crate) fn drop_entry(self: &Arc<Self>, ek: &EntryKey) {
        if let Some(e) = lock(&self.entries).remove(ek) {
            self.etcd.revoke_later(e.lease);
        }
    }

    /// Forget the claim `ek` and end its lease, if the entry is still on
    /// `lease`: a raw extend with another TTL running beside this one may
    /// have moved the key (and the entry) to a new lease, which is not
    /// this call's to end (the move ended `lease` itself).
    pub(crate) fn drop_entry_of(self: &Arc<Self>, ek: &EntryKey, lease: i64) {
        let removed = {
            let mut entries = lock(&self.entries);
            match entries.get(ek) {
                Some(e) if e.lease == lease => entries.remove(ek),
                _ => None,
            }
        };
        if removed.is_some() {
            self.etcd.revoke_later(lease);
        }
    }

    /// Record a grant. If the owner released meanwhile (its lease is
    /// revoked), the grant is not reported.
    pub(crate) fn set_held(
        &self,
        ek: &EntryKey,
        rev: i64,
        lease: i64,
        deadline: Instant,
        keeper: Option<Keeper>,
    ) -> Attempt {
        let mut entries = lock(&self.entries);
        let attempt = match entries.get_mut(ek) {
            Some(e) if e.lease == lease => {
                e.rev = rev;
                e.keeper = keeper;
                e.state = EntryState::Held { deadline };
                Attempt::Granted(FencingToken(rev as u64))
            }
            _ => Attempt::Held { expires_in: None },
        };
        self.prune(&mut entries);
        attempt
    }

    /// Sweep claims whose TTL ran out long ago and that were never
    /// released (raw-trait users; guards always release): the server
    /// expired them, nothing is left to remember. A sweep runs when the map
    /// doubled since the last one, so sweeps cost O(1) per grant however
    /// many claims are live.
    pub(crate) fn prune(&self, entries: &mut HashMap<EntryKey, Entry>) {
        if entries.len() < self.prune_at.load(Ordering::Relaxed) {
            return;
        }
        let now = Instant::now();
        entries.retain(|_, e| {
            !matches!(e.state, EntryState::Held { deadline } if deadline + EXPIRED_MEMORY <= now)
        });
        self.prune_at
            .store((entries.len() * 2).max(PRUNE_AT), Ordering::Relaxed);
    }

    /// If `kv` is a claim this client holds, its remaining time.
    pub(crate) fn remaining_of_local(&self, kv: Option<&KeyValue>) -> Option<Duration> {
        let kv = kv?;
        let entries = lock(&self.entries);
        entries.values().find_map(|e| match e.state {
            EntryState::Held { deadline } if e.key == kv.key() && e.rev == kv.create_revision() => {
                Some(deadline.saturating_duration_since(Instant::now()))
            }
            _ => None,
        })
    }
}
