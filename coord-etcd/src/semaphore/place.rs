//! A semaphore waiter's place in the queue (`w/<lease hex>`, see
//! `semaphore.rs` for the layout): joining the queue, renewing a place,
//! and what becomes of the place's lease once the owner is granted.

use std::sync::Arc;
use std::time::Duration;

use coord_core::Result;
use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp};
use tokio::time::Instant;

use crate::client::kvs;
use crate::semaphore::Semaphores;
use crate::semaphore::view::Basis;
use crate::semaphore::{Names, Place, QUEUE_ENTRY_TTL, SemKey};

/// A place is renewed by an attempt at most this often.
const RENEW_AFTER: Duration = Duration::from_secs(5);

impl Semaphores {
    /// The owner is granted (on lease `grant`): its place in the queue is
    /// gone. The place's lease serves the next key only if the answered
    /// grant transaction deleted the place on it (`deleted`: the lease of
    /// the place it deleted). Otherwise the place was never seen (its write
    /// went unanswered and may still land) or lapsed: the lease is revoked,
    /// so a late copy of that write fails instead of queueing the owner on
    /// a spare that lives on.
    /// A place adopted from another client (see `SemLocal`) leaves its
    /// lease alone.
    pub(crate) fn sem_place_done(self: &Arc<Self>, sk: &SemKey, deleted: Option<i64>, grant: i64) {
        let place = self.sem_local(sk, |s| {
            s.place = None;
            s.waiter.take()
        });
        if let Some(w) = place.filter(|w| w.own) {
            if deleted == Some(w.lease) {
                let ttl = QUEUE_ENTRY_TTL.as_secs();
                self.etcd
                    .put_spare(w.lease, ttl, w.at + QUEUE_ENTRY_TTL, None);
            } else if w.lease != grant {
                self.etcd.revoke_later(w.lease);
            }
        }
    }

    /// Join the queue, or renew the owner's place in it (`place`: as the
    /// attempt's read saw it). A new place is written only while `basis`
    /// (what that read's check of the total rests on) still stands, so the
    /// name never has places or grants of two totals; `Ok(false)` if it
    /// no longer did: nothing was written, the caller reads again soon.
    pub(crate) async fn sem_keep_place(
        self: &Arc<Self>,
        sk: &SemKey,
        n: &Names,
        value: &[u8],
        place: Option<&KeyValue>,
        basis: &Basis,
    ) -> Result<bool> {
        let op = "semaphore queue";
        let ttl = QUEUE_ENTRY_TTL.as_secs();
        if let Some(kv) = place {
            let now = Instant::now();
            let fresh = self.sem_local(sk, |s| {
                s.waiter
                    .is_some_and(|w| w.lease == kv.lease() && w.at + RENEW_AFTER > now)
            });
            if fresh {
                return Ok(true);
            }
            if self.etcd.keepalive_once(kv.lease(), op).await? {
                // On the lease this client recorded: its own; on another:
                // queued through another client (the same owner), adopted
                // (see `SemLocal`).
                let old = self.sem_local(sk, |s| {
                    let own = s.waiter.is_some_and(|w| w.own && w.lease == kv.lease());
                    s.waiter.replace(Place {
                        lease: kv.lease(),
                        at: now,
                        own,
                    })
                });
                if let Some(o) = old.filter(|o| o.own && o.lease != kv.lease()) {
                    self.etcd.revoke_later(o.lease);
                }
                return Ok(true);
            }
            // The place lapsed with its lease: queue again, at the back.
        }
        let (lease, _, since) = self.sem_lease(ttl, op).await?;
        // The place's key: the one last written (a write whose reply was
        // lost may land: compared to be absent), else named by this lease.
        // Recorded first, with the lease: a release revokes it even if the
        // reply is lost (and a drop mid-call at once).
        let (old, old_key, key) = self.sem_local(sk, |s| {
            let old_key = s.place.clone();
            let key = s.place.get_or_insert_with(|| n.wait_on(lease)).clone();
            let place = Place {
                lease,
                at: since,
                own: true,
            };
            (s.waiter.replace(place), old_key, key)
        });
        let named_here = key == n.wait_on(lease);
        let mut when = vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)];
        when.extend(basis.compares(n));
        let txn = Txn::new()
            .when(when)
            .and_then([TxnOp::put(
                key.clone(),
                value.to_vec(),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key, Some(GetOptions::new().with_keys_only()))]);
        let resp = self.sem_txn_on(sk, lease, None, op, txn).await;
        if let Ok(r) = &resp {
            if !r.succeeded() && kvs(r, 0).is_empty() {
                // The basis fell (and the key is absent): this answered
                // transaction wrote nothing, the lease serves the next key.
                self.sem_local(sk, |s| {
                    s.waiter = old;
                    s.place = old_key;
                });
                self.etcd
                    .put_spare(lease, ttl, since + QUEUE_ENTRY_TTL, None);
                return Ok(false);
            }
            if !r.succeeded() {
                // Our place exists already (a lost reply's write landed):
                // keep that one, and its lease. This lease wrote nothing;
                // one a key is named by is not a spare (never expected: a
                // spare's keys were deleted).
                self.sem_local(sk, |s| s.waiter = old);
                if named_here {
                    self.etcd.revoke_later(lease);
                } else {
                    self.etcd
                        .put_spare(lease, ttl, since + QUEUE_ENTRY_TTL, None);
                }
                return Ok(true);
            }
        }
        // The old lease (if any) carried no place: it lapsed or never was.
        // An adopted one is left to its client.
        if let Some(o) = old.filter(|o| o.own) {
            self.etcd.revoke_later(o.lease);
        }
        resp.map(|_| true)
    }
}
