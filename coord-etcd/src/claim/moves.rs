//! Lease moves of a held claim whose outcome this client never saw.
//!
//! An extend to another TTL moves the claim's key onto a new lease, in a
//! transaction that compares the key's create revision and the lease it
//! was on. If the caller never saw its answer (the call timed out or
//! failed, or was dropped mid-call), the transaction may still reach etcd
//! later, after a later extend of the same owner that kept the key on the
//! same lease: it would then put the key on its own lease, with that
//! lease's shorter TTL. So the claim's next extend moves the key onto a
//! fresh lease, comparing the lease it finds the key on (the claim's, or
//! one of those moves' if one landed): no move ever compared the fresh
//! lease, so each of them fails from then on, and their leases, which
//! carry nothing any more, are revoked. A release revokes them once the
//! key is deleted. They are not revoked at once: a move landing after its
//! lease's revocation fails, but one landing just before it would take the
//! key down with the lease while its holder's guard still counts it held.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::claim::Claims;
use crate::claim::entries::EntryKey;
use crate::client::lock;

/// The leases of moves whose outcome was never seen, per claim: (the
/// claim's create revision, the lease).
pub(crate) type Moves = Mutex<HashMap<EntryKey, Vec<(i64, i64)>>>;

impl Claims {
    /// Whether a move of the claim created at `rev` went unseen.
    pub(crate) fn unseen_moves(&self, ek: &EntryKey, rev: i64) -> bool {
        lock(&self.moves)
            .get(ek)
            .is_some_and(|m| m.iter().any(|(r, _)| *r == rev))
    }

    /// Whether `lease` is that of an unseen move of the claim created at
    /// `rev`.
    pub(crate) fn is_unseen_move(&self, ek: &EntryKey, rev: i64, lease: i64) -> bool {
        lock(&self.moves)
            .get(ek)
            .is_some_and(|m| m.contains(&(rev, lease)))
    }

    /// Revoke, in the background, the leases of the unseen moves of the
    /// claim: those of the claim created at `rev`, or every one.
    pub(crate) fn end_moves(&self, ek: &EntryKey, rev: Option<i64>) {
        let ended: Vec<i64> = {
            let mut moves = lock(&self.moves);
            let Some(list) = moves.get_mut(ek) else {
                return;
            };
            let (ended, kept): (Vec<_>, Vec<_>) = list
                .drain(..)
                .partition(|(r, _)| rev.is_none_or(|rev| *r == rev));
            if kept.is_empty() {
                moves.remove(ek);
            } else {
                *list = kept;
            }
            ended.into_iter().map(|(_, l)| l).collect()
        };
        for lease in ended {
            self.etcd.revoke_later(lease);
        }
    }
}

/// A move of the claim created at `rev` onto `lease`, on its way: unless
/// [`seen`](MoveOnItsWay::seen) is called, dropping it records the move
/// as unseen (see the module docs).
pub(crate) struct MoveOnItsWay<'a> {
    pub(crate) claims: &'a Arc<Claims>,
    pub(crate) ek: &'a EntryKey,
    pub(crate) rev: i64,
    pub(crate) lease: i64,
    pub(crate) seen: bool,
}

impl MoveOnItsWay<'_> {
    /// The move's answer arrived (whatever it said).
    pub(crate) fn seen(mut self) {
        self.seen = true;
    }
}

impl Drop for MoveOnItsWay<'_> {
    fn drop(&mut self) {
        if !self.seen {
            lock(&self.claims.moves)
                .entry(self.ek.clone())
                .or_default()
                .push((self.rev, self.lease));
        }
    }
}
