//! Lock handoff without reading the queue again: a queued
//! waiter that knows its predecessor was the holder, and sees that key
//! deleted, is the first key itself, so it holds without another read.
//!
//! Why that is sound: keys only join a queue at the back (a new key's
//! create revision is above every existing one), and a waiter's
//! predecessor is the key created just before its own, read in one
//! transaction. If the predecessor was the first key at some revision, no
//! key before it existed then or can exist later; none between it and the
//! waiter existed at the read or can exist later. Once its deletion is
//! seen, the waiter's key (which dies only with its own lease, or by its
//! own owner's release) is the first.
//!
//! How a waiter learns that its predecessor was the holder: (a) the read
//! that queued it showed that key first, or (b) its watch of that key saw a
//! put on it after its creation (or a version above 1 when it began): the
//! **head marker** that a claim which becomes held after queueing writes
//! on its own key (same value, same lease, guarded by its create revision,
//! sent after the grant without waiting for it), or an extend with another
//! TTL, which only a holder does. No other path puts an existing lock key:
//! attempts write only a key that does not exist. A marker wakes nobody.
//!
//! The grant's validity basis: the waiter's lease must be known to live a
//! TTL from the attempt's start, less the reuse slack
//! ([`reuse_slack`](crate::client::pool::reuse_slack)); the waiter's keepalives
//! record that, and a waiter that learns it is next in line refreshes its
//! lease at once. Otherwise the handoff sends one keepalive (no
//! transaction), and a lease the server no longer has falls back to the
//! full attempt.

use std::sync::Arc;
use std::time::Duration;

use coord_core::util::Kind;
use coord_core::{Attempt, Result};
use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp};
use tokio::time::Instant;

use crate::claim::Claims;
use crate::claim::entries::Pred;
use crate::claim::entries::{Entry, EntryKey, EntryState};
use crate::client::lock;
use crate::client::pool::fresh_enough;

/// Whether `pred` is the queue's first key `head` (both read in one
/// transaction).
pub(crate) fn is_head(head: Option<&KeyValue>, pred: Option<&KeyValue>) -> bool {
    head.zip(pred).is_some_and(|(h, p)| h.key() == p.key())
}

impl Claims {
    /// The watch of `ek`'s predecessor `pred` saw that it was the holder:
    /// remember it (waking nobody), and refresh `ek`'s lease now so that
    /// the handoff needs no request.
    pub(crate) fn pred_was_head(self: &Arc<Self>, ek: &EntryKey, pred: &Pred) {
        let lease = match lock(&self.entries).get_mut(ek) {
            Some(Entry {
                state: EntryState::Queued(q),
                lease,
                lease_ttl,
                ..
            }) if q.pred.as_ref() == Some(pred) && !q.pred_head => {
                q.pred_head = true;
                Some((*lease, *lease_ttl))
            }
            _ => None,
        };
        let Some((lease, ttl)) = lease else { return };
        let shared = self.clone();
        let ek = ek.clone();
        tokio::spawn(async move {
            let sent = Instant::now();
            if let Ok(alive) = shared
                .etcd
                .keepalive_once(lease, "lock wait keepalive")
                .await
            {
                shared.set_fresh(&ek, lease, alive.then(|| sent + Duration::from_secs(ttl)));
            }
        });
    }

    /// Record how long the server keeps queued `ek`'s `lease` (`None`: it
    /// no longer has it).
    pub(crate) fn set_fresh(&self, ek: &EntryKey, lease: i64, fresh_until: Option<Instant>) {
        if let Some(Entry {
            state: EntryState::Queued(q),
            lease: l,
            ..
        }) = lock(&self.entries).get_mut(ek)
        {
            if *l == lease {
                q.fresh_until = match fresh_until {
                    Some(f) => q.fresh_until.max(Some(f)),
                    None => None,
                };
            }
        }
    }

    /// The handoff (see the module doc): `Some` grant if queued lock `ek`
    /// (key created at `rev` on `lease`, whose TTL is the attempt's) saw
    /// its predecessor, once the holder, deleted; `None` when the full
    /// attempt must read the queue.
    pub(crate) async fn handoff_grant(
        self: &Arc<Self>,
        ek: &EntryKey,
        key: &[u8],
        (rev, lease): (i64, i64),
        start: Instant,
        ttl: Duration,
        op: &'static str,
    ) -> Result<Option<Attempt>> {
        if ek.0 != Kind::Lock {
            return Ok(None);
        }
        let fresh = match lock(&self.entries).get(ek) {
            Some(Entry {
                state: EntryState::Queued(q),
                rev: r,
                lease: l,
                ..
            }) if *r == rev && *l == lease && q.pred_head && q.pred_deleted => q.fresh_until,
            _ => return Ok(None),
        };
        let deadline = match fresh.filter(|f| fresh_enough(*f, start, ttl)) {
            Some(f) => f,
            // Sent after the attempt began: the lease lives a TTL from then.
            None if self.etcd.keepalive_once(lease, op).await? => start + ttl,
            None => return Ok(None),
        };
        let granted = {
            let mut entries = lock(&self.entries);
            match entries.get_mut(ek) {
                Some(e) if e.rev == rev && e.lease == lease => {
                    e.keeper = None;
                    e.state = EntryState::Held { deadline };
                    true
                }
                _ => false,
            }
        };
        if !granted {
            return Ok(Some(Attempt::Held { expires_in: None }));
        }
        self.head_marker(ek, key, rev);
        Ok(Some(Attempt::Granted(coord_core::FencingToken(rev as u64))))
    }

    /// Write the head marker of lock key `key` (created at `rev`), which
    /// now holds after queueing: the same key put again, value and lease
    /// kept, only while it is that key. Sent in the background; if a
    /// release applies first, nothing is written.
    pub(crate) fn head_marker(self: &Arc<Self>, ek: &EntryKey, key: &[u8], rev: i64) {
        if ek.0 != Kind::Lock {
            return;
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.to_vec(),
                CompareOp::Equal,
                rev,
            )])
            .and_then([TxnOp::put(
                key.to_vec(),
                Vec::new(),
                Some(PutOptions::new().with_ignore_value().with_ignore_lease()),
            )]);
        let shared = self.clone();
        tokio::spawn(async move {
            if let Err(e) = shared.etcd.txn("lock head marker", txn).await {
                tracing::debug!(error = %e, "a lock head marker failed; the next waiter reads the queue");
            }
        });
    }
}
