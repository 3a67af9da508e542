//! What a holder does with its claim (locks, elections, named leases):
//! release, extend, and an operator's force release; and reading the head
//! of a claim's queue.

use std::sync::Arc;
use std::time::Duration;

use coord_core::util::Kind;
use coord_core::{OwnerToken, Result};
use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, KeyValue, PutOptions, Txn, TxnOp,
};
use tokio::time::Instant;

use crate::claim::Claims;
use crate::claim::entries::{Entry, EntryState, entry_key};
use crate::claim::moves::MoveOnItsWay;
use crate::client::keys::{prefix_end, split_lease_value};
use crate::client::{kvs, lock, secs};

impl Claims {
    /// Release (or resign, or leave the queue, or revoke a named lease):
    /// revoke the lease of the owner's key, whether it holds or waits.
    /// `Ok(true)` iff it held a claim whose TTL had not run out. After the
    /// client's other calls on the claim ([`Claims::one_call`]).
    pub(crate) async fn release_claim(
        self: &Arc<Self>,
        kind: Kind,
        name: &str,
        owner: &OwnerToken,
        op: &'static str,
    ) -> Result<bool> {
        let ek = entry_key(kind, name, owner);
        let _turn = self.one_call(&ek).await;
        let released = self.release_claim_now(kind, name, owner, op).await;
        // A move of the claim this client never saw the answer of carries
        // nothing once the claim's key is deleted (`moves.rs`); revoked
        // before, its lease might take the key down first, and the release
        // find nothing to delete.
        self.end_moves(&ek, None);
        released
    }

    async fn release_claim_now(
        self: &Arc<Self>,
        kind: Kind,
        name: &str,
        owner: &OwnerToken,
        op: &'static str,
    ) -> Result<bool> {
        let now = Instant::now();
        let ek = entry_key(kind, name, owner);
        lock(&self.tried).remove(&ek);
        let entry = lock(&self.entries).remove(&ek);
        if let Some(e) = entry {
            if let EntryState::Held { deadline } = e.state {
                // Named leases share one key per name (`keys.single`);
                // every other claim's key is its own (named by its lease).
                let own_key = kind != Kind::Lease;
                return self.release_held(e, deadline, now, own_key, op).await;
            }
            if let Err(err) = self.etcd.revoke(e.lease, op).await {
                self.etcd.revoke_later(e.lease);
                return Err(err);
            }
            // A place in line, or an attempt whose outcome is unknown, is
            // gone with its lease. The owner may still hold the claim
            // through another client (a raw-trait caller retrying there):
            // a release by owner frees it wherever it was taken.
            if kind == Kind::Lease {
                return Ok(false);
            }
            return self.release_unknown(kind, name, &owner.to_hex(), op).await;
        }
        // Not known here (another handle of this owner, or the cleanup of
        // an attempt whose bookkeeping is gone): find the key.
        let hex = owner.to_hex();
        if kind != Kind::Lease {
            return self.release_unknown(kind, name, &hex, op).await;
        }
        let key = self.etcd.keys.single(kind, name);
        let kv = self.etcd.get(op, key, None).await?.into_iter().next();
        let Some(kv) = kv.filter(|kv| split_lease_value(kv.value()).0 == hex.as_bytes()) else {
            return Ok(false);
        };
        // Delete the key at its create revision, never revoke its lease:
        // that lease is another client's (or one whose bookkeeping is
        // gone), and once its holder released it, a spare carrying that
        // client's next claim (tests/it/cross_client_owner.rs).
        self.delete_at(&kv, op).await
    }

    /// Release a lock or leadership of an owner this client has no
    /// bookkeeping of: read the name's queue for the key whose value names
    /// the owner (keys are named by leases, not owners) and, if it is the
    /// first (the owner holds), delete it at its create revision; a place
    /// in line is another client's waiting acquire and stays. Never by
    /// revoking its lease: a lease
    /// outlives the claim it carried (it is a spare for its client's next
    /// claim), so between the read and a revoke it may come to carry a
    /// claim of another owner. The client whose lease it was finds the key
    /// gone at its next extend or release and ends the lease then (or it
    /// lapses with its TTL). `Ok(true)` iff it deleted the holder's key.
    async fn release_unknown(
        &self,
        kind: Kind,
        name: &str,
        hex: &str,
        op: &'static str,
    ) -> Result<bool> {
        let queue = self.etcd.keys.queue(kind, name);
        let end = prefix_end(&queue);
        // The whole queue, in pages at one revision (one snapshot).
        let (queued, _) = self.etcd.range_paged(op, &queue, &end, false).await?;
        let first = queued.iter().map(KeyValue::create_revision).min();
        let Some(kv) = queued
            .iter()
            .find(|kv| split_lease_value(kv.value()).0 == hex.as_bytes())
        else {
            return Ok(false);
        };
        if Some(kv.create_revision()) != first {
            // A place in line of another client's waiting acquire: the
            // owner does not hold, so nothing changes (that client's handoff
            // trusts its place to live as long as its lease and its own
            // release; tests/it/owner_queued_through_another_client/).
            return Ok(false);
        }
        self.delete_at(kv, op).await
    }

    /// Delete `kv`'s key if it is still that key (its create revision):
    /// `Ok(true)` iff it was deleted.
    async fn delete_at(&self, kv: &KeyValue, op: &'static str) -> Result<bool> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                kv.key().to_vec(),
                CompareOp::Equal,
                kv.create_revision(),
            )])
            .and_then([TxnOp::delete(kv.key().to_vec(), None)]);
        Ok(self.etcd.txn(op, txn).await?.succeeded())
    }

    /// Release a held claim: delete its key if it is still this claim's.
    /// Once that is answered no write on the claim's lease is in flight and
    /// the lease carries no keys, so it serves the next claim of its TTL;
    /// otherwise (the key gone already: expired, or force-released) the
    /// lease is revoked.
    ///
    /// A key of this claim alone (`own_key`: its name carries the lease of
    /// the claim's first attempt, which no other claim writes while this
    /// one lives: see `claim/attempt.rs`) takes a plain delete that returns what
    /// was there: the claim was live until now iff the key deleted has
    /// this claim's create revision. A key re-created by a late copy of
    /// one of this claim's attempts is then deleted too, which is what its
    /// owner wants. On
    /// etcd 3.4 a write transaction costs the server about three times a
    /// plain delete (`examples/lock_speed.rs`, `txn` against `kv`). A key
    /// shared by every owner of the name (named leases) takes a
    /// transaction that deletes it only at this claim's create revision.
    async fn release_held(
        self: &Arc<Self>,
        e: Entry,
        deadline: Instant,
        now: Instant,
        own_key: bool,
        op: &'static str,
    ) -> Result<bool> {
        let ours = if own_key {
            self.etcd
                .call_kv(op, |mut c| {
                    let key = e.key.clone();
                    async move {
                        c.delete(key, Some(DeleteOptions::new().with_prev_key()))
                            .await
                    }
                })
                .await
                .map(|r| r.prev_kvs().iter().any(|kv| kv.create_revision() == e.rev))
        } else {
            let txn = Txn::new()
                .when([Compare::create_revision(
                    e.key.clone(),
                    CompareOp::Equal,
                    e.rev,
                )])
                .and_then([TxnOp::delete(e.key.clone(), None)]);
            self.etcd.txn(op, txn).await.map(|r| r.succeeded())
        };
        match ours {
            Ok(true) => {
                // The server keeps the lease at least until the claim's
                // deadline (its last grant or keepalive came after the
                // attempt or extend that set it began).
                self.etcd
                    .put_spare(e.lease, e.lease_ttl, deadline, e.keeper);
                Ok(deadline > now)
            }
            Ok(false) => {
                self.etcd.revoke_later(e.lease);
                Ok(false)
            }
            Err(err) => {
                self.etcd.revoke_later(e.lease);
                Err(err)
            }
        }
    }

    /// Extend (renew a leadership, renew a named lease): only the holder,
    /// never resurrecting. The same TTL refreshes the key's lease; another
    /// TTL moves the key (keeping its create revision) to a new lease.
    /// After the client's other calls on the claim ([`Claims::one_call`]).
    pub(crate) async fn extend_claim(
        self: &Arc<Self>,
        kind: Kind,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
        op: &'static str,
    ) -> Result<bool> {
        let _turn = self.one_call(&entry_key(kind, name, owner)).await;
        self.extend_claim_now(kind, name, owner, ttl, op).await
    }

    /// [`extend_claim`](Self::extend_claim) for a caller that has the
    /// claim's turn.
    pub(crate) async fn extend_claim_now(
        self: &Arc<Self>,
        kind: Kind,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
        op: &'static str,
    ) -> Result<bool> {
        let start = Instant::now();
        let ek = entry_key(kind, name, owner);
        // Ok: the live claim; Err: the lease of a claim whose TTL ran out.
        let found = {
            let mut entries = lock(&self.entries);
            match entries.get(&ek) {
                Some(
                    e @ Entry {
                        state: EntryState::Held { deadline },
                        ..
                    },
                ) => {
                    if *deadline <= start {
                        let lease = e.lease;
                        entries.remove(&ek);
                        Some(Err(lease))
                    } else {
                        Some(Ok((e.key.clone(), e.rev, e.lease, e.lease_ttl)))
                    }
                }
                _ => None,
            }
        };
        // The keepalive stream of the claim's lease, if one is open.
        let kept = lock(&self.entries)
            .get_mut(&ek)
            .and_then(|e| e.keeper.take());
        let (key, rev, lease, lease_ttl) = match found {
            Some(Ok(live)) => live,
            Some(Err(lease)) => {
                // Expired: end it on the server now too, so that nobody
                // sees it after this answer.
                if self.etcd.revoke(lease, op).await.is_err() {
                    self.etcd.revoke_later(lease);
                }
                // The key may sit on an unseen move's lease instead.
                self.end_moves(&ek, None);
                return Ok(false);
            }
            None => return Ok(false),
        };
        // The key must still be this claim's (its create revision) and on
        // this claim's lease: a named lease granted again to the same owner
        // through another client moves the key to that client's lease, and
        // refreshing ours would then keep nothing alive.
        let check = Txn::new().when([
            Compare::create_revision(key.clone(), CompareOp::Equal, rev),
            Compare::lease(key.clone(), CompareOp::Equal, lease),
        ]);
        let ttl_s = secs(ttl);
        let mut keeper = None;
        // A move this client never saw the answer of may still land: the
        // key goes onto a fresh lease, which that move never compared
        // (`moves.rs`).
        let fresh = self.unseen_moves(&ek, rev);
        let new_lease = if ttl_s == lease_ttl && !fresh {
            // etcd takes a transaction of compares only for a serializable
            // read (every op in it is a serializable range, vacuously:
            // `isTxnSerializable`), and the member that gets it answers
            // from its own state without asking the leader: one that has
            // not applied the grant yet says the key is not ours (seen as
            // "renew while live" failing on a loaded 3-node cluster). A
            // range op that is not serializable makes it linearizable.
            let check = check.and_then([TxnOp::get(
                key.clone(),
                Some(GetOptions::new().with_count_only()),
            )]);
            let (resp, alive) =
                tokio::join!(self.etcd.txn(op, check), self.etcd.refresh(lease, kept, op));
            let (alive, k) = alive?;
            if !resp?.succeeded() || !alive {
                self.drop_entry_of(&ek, lease);
                return Ok(false);
            }
            keeper = k;
            lease
        } else {
            // Check the old lease still lives (so an expired claim is never
            // resurrected), then move the key. After an unseen move, the
            // key may live on that move's lease instead.
            let (alive, new) = tokio::join!(
                self.etcd.keepalive_once(lease, op),
                self.etcd.grant_lease(ttl_s, op)
            );
            let new = new?;
            if !alive.inspect_err(|_| self.etcd.revoke_later(new))? && !fresh {
                self.etcd.revoke_later(new);
                self.drop_entry_of(&ek, lease);
                return Ok(false);
            }
            // The key at its create revision on the lease it is on, so
            // that this move, landing late after a later one, fails. After
            // an unseen move the key may sit on that move's lease: compared
            // on the lease it is found on, if it is one of those.
            let mut on = lease;
            let mut tries = 0;
            let resp = loop {
                let txn = Txn::new()
                    .when([
                        Compare::create_revision(key.clone(), CompareOp::Equal, rev),
                        Compare::lease(key.clone(), CompareOp::Equal, on),
                    ])
                    .and_then([TxnOp::put(
                        key.clone(),
                        Vec::new(),
                        Some(PutOptions::new().with_lease(new).with_ignore_value()),
                    )])
                    .or_else([TxnOp::get(key.clone(), None)]);
                // Unanswered, the move may still land: its lease is kept,
                // and the next extend moves the key on (`moves.rs`).
                let way = MoveOnItsWay {
                    claims: self,
                    ek: &ek,
                    rev,
                    lease: new,
                    seen: false,
                };
                let resp = self.etcd.txn(op, txn).await?;
                way.seen();
                if resp.succeeded() || !fresh || tries == 3 {
                    break resp;
                }
                match kvs(&resp, 0).into_iter().next() {
                    Some(kv)
                        if kv.create_revision() == rev
                            && self.is_unseen_move(&ek, rev, kv.lease()) =>
                    {
                        on = kv.lease();
                        tries += 1;
                    }
                    _ => break resp,
                }
            };
            if !resp.succeeded() {
                self.etcd.revoke_later(new);
                self.end_moves(&ek, Some(rev));
                self.drop_entry_of(&ek, lease);
                return Ok(false);
            }
            self.etcd.revoke_later(lease);
            self.end_moves(&ek, Some(rev));
            new
        };
        let mut entries = lock(&self.entries);
        match entries.get_mut(&ek) {
            Some(e) if e.rev == rev && e.lease == lease => {
                e.lease = new_lease;
                e.lease_ttl = ttl_s;
                e.keeper = keeper;
                e.state = EntryState::Held {
                    deadline: start + ttl,
                };
                Ok(true)
            }
            _ => {
                drop(entries);
                if new_lease != lease {
                    self.etcd.revoke_later(new_lease);
                }
                Ok(false)
            }
        }
    }

    /// Remove the holder, whoever it is: delete the key read as the head,
    /// by its create revision. Never by revoking the key's lease: a lease
    /// outlives the claim it carried (a released claim's lease is a spare
    /// that carries its client's next claim), so between the read and the
    /// revoke the lease may come to carry a claim nobody asked to remove
    /// (tests/it/force_release.rs). The holder's lease, left without the key,
    /// is ended by the holder (its next extend or release finds the key
    /// gone) or lapses with its TTL.
    pub(crate) async fn force_release_claim(
        &self,
        kind: Kind,
        name: &str,
        op: &'static str,
    ) -> Result<bool> {
        for _ in 0..5 {
            let Some(first) = self.etcd.head(kind, name, op).await? else {
                return Ok(false);
            };
            if self.delete_at(&first, op).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }
}
