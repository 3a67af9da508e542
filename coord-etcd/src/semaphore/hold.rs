//! Semaphore grants once made: owner-checked release and extend, and the
//! operator's force_release (see `semaphore.rs` for the layout).

use std::sync::Arc;
use std::time::Duration;

use coord_core::{Error, OwnerToken, Result};
use etcd_client::{
    Compare, CompareOp, DeleteOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse,
};
use tokio::time::Instant;

use crate::client::keys::{BACKEND, prefix_end};
use crate::client::{corrupt, first_page, header_rev, is_compacted, kvs, lock, secs};
use crate::semaphore::Semaphores;
use crate::semaphore::{Grant, Names, QUEUE_ENTRY_TTL, SemKey, slots_of};

/// Reads and deletes of a release whose owner's keys keep changing
/// between them (other clients of the same owner at work) before it gives
/// up with `Error::Unavailable`.
const RELEASE_ROUNDS: usize = 5;

impl Semaphores {
    /// Delete `owner`'s grant (its key and slots) and its place in the
    /// queue, each only at the create revision it was written with: a key
    /// deleted and written again (its lease reused for the next claim, by
    /// this client or by the client whose grant this one adopted) is
    /// another owner's. `Ok(true)` iff a grant of the owner was deleted.
    pub(crate) async fn sem_release(
        self: &Arc<Self>,
        name: &str,
        owner: &OwnerToken,
    ) -> Result<bool> {
        let op = "semaphore release";
        let sk: SemKey = (name.into(), *owner.as_bytes());
        let n = self.sem_names(name, owner);
        // A grant whose key and create revision are known, and no place
        // on record: one transaction (nearly every release). Otherwise
        // the owner's keys are found by their values first.
        // The grant recorded now: the record is forgotten at the end only
        // if it still holds that grant (or one this release deleted).
        let (read, known) = match lock(&self.sems).get(&sk) {
            None => (None, None),
            Some(s) => {
                let read = s.grant.as_ref().map(|g| (g.lease, g.rev));
                let no_place = s.waiter.is_none() && s.place.is_none();
                let known = s
                    .grant
                    .as_ref()
                    .filter(|g| g.rev > 0 && no_place)
                    .map(|g| (g.key.clone(), g.rev, s.slots.clone()));
                (read, known)
            }
        };
        let (held, gone) = match known {
            Some((key, rev, slots)) => {
                let mut then = vec![TxnOp::delete(
                    key.clone(),
                    Some(DeleteOptions::new().with_prev_key()),
                )];
                then.extend(slots.iter().map(|i| TxnOp::delete(n.slot(*i), None)));
                let txn = Txn::new()
                    .when([Compare::create_revision(key, CompareOp::Equal, rev)])
                    .and_then(then);
                let resp = self.etcd.txn(op, txn).await?;
                if resp.succeeded() {
                    (true, kvs(&resp, 0).iter().map(KeyValue::lease).collect())
                } else {
                    // Not the grant this client knows any more (released
                    // and granted again to the owner through another
                    // client, say): the owner's live grant, if any, is
                    // found by its value (tests/it/semaphore_grant_revisions/).
                    self.sem_release_found(&n, op).await?
                }
            }
            None => self.sem_release_found(&n, op).await?,
        };
        // A grant of the owner recorded by an attempt through this client
        // since the read above, and not deleted here, was answered
        // Granted: its record (and lease) stay, whatever this release
        // found (tests/it/semaphore_extend_racing_release.rs). Checked and removed under one
        // lock.
        let local = {
            let mut m = lock(&self.sems);
            let newer = m
                .get(&sk)
                .and_then(|s| s.grant.as_ref())
                .is_some_and(|g| Some((g.lease, g.rev)) != read && !gone.contains(&g.lease));
            if newer { None } else { m.remove(&sk) }
        };
        let Some(local) = local else {
            return Ok(held);
        };
        // Own leases whose keys this answered transaction deleted carry no
        // keys now: they serve the next claims. Any other own lease is
        // revoked (a write on it may still land). An adopted lease is left
        // to the client that created it.
        let now = Instant::now();
        // Unseen moves' leases carry nothing once the grant is deleted.
        for l in &local.moves {
            self.etcd.revoke_later(*l);
        }
        // (A place on the grant's lease is never expected; it goes with
        // the grant's.)
        let grant_lease = local.grant.as_ref().map(|g| g.lease);
        if let Some(g) = local.grant.filter(|g| g.own) {
            if gone.contains(&g.lease) && g.deadline > now {
                self.etcd
                    .put_spare(g.lease, g.ttl, g.deadline, local.keeper);
            } else {
                self.etcd.revoke_later(g.lease);
            }
        }
        if let Some(w) = local
            .waiter
            .filter(|w| w.own && grant_lease != Some(w.lease))
        {
            if gone.contains(&w.lease) {
                let ttl = QUEUE_ENTRY_TTL.as_secs();
                self.etcd
                    .put_spare(w.lease, ttl, w.at + QUEUE_ENTRY_TTL, None);
            } else {
                self.etcd.revoke_later(w.lease);
            }
        }
        Ok(held)
    }

    /// Release the owner's grant and place as one snapshot finds them (by
    /// the owner their values name), each deleted at its create revision;
    /// read again if either changed meanwhile. Returns whether a grant was
    /// deleted and the leases of the keys deleted.
    async fn sem_release_found(&self, n: &Names, op: &'static str) -> Result<(bool, Vec<i64>)> {
        for _ in 0..RELEASE_ROUNDS {
            let (grant, place) = self.sem_find(n, op).await?;
            let mut when = Vec::new();
            let mut then = Vec::new();
            for kv in grant.iter().chain(place.iter()) {
                let key = kv.key().to_vec();
                when.push(Compare::create_revision(
                    key.clone(),
                    CompareOp::Equal,
                    kv.create_revision(),
                ));
                then.push(TxnOp::delete(
                    key,
                    Some(DeleteOptions::new().with_prev_key()),
                ));
            }
            if when.is_empty() {
                return Ok((false, Vec::new()));
            }
            let deletes = then.len();
            if let Some(kv) = &grant {
                then.extend(
                    slots_of(kv.value())
                        .iter()
                        .map(|i| TxnOp::delete(n.slot(*i), None)),
                );
            }
            let resp = self
                .etcd
                .txn(op, Txn::new().when(when).and_then(then))
                .await?;
            if resp.succeeded() {
                let gone = (0..deletes)
                    .flat_map(|i| kvs(&resp, i))
                    .map(|kv| kv.lease())
                    .collect();
                return Ok((grant.is_some(), gone));
            }
        }
        Err(Error::Unavailable {
            backend: BACKEND,
            operation: op,
            message: "the owner's grant or place changed under every release attempt".into(),
            source: None,
        })
    }

    /// Refresh `owner`'s live grant to `ttl`: a keepalive of its lease, or
    /// (another TTL, or a grant adopted from another client) a move of its
    /// keys to a new lease of this client's, keeping the create revision
    /// of its key (the fencing token). Never brings a grant back, and acts
    /// only on the grant at the create revision this client knows, else on
    /// the owner's live grant found by its value. Answers the create
    /// revision (fencing token) of the grant it refreshed, `None` if none:
    /// a caller answering a token answers that one, never one read before
    /// (that grant may have been released and made again meanwhile).
    pub(crate) async fn sem_extend(
        self: &Arc<Self>,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Option<i64>> {
        let op = "semaphore extend";
        let sk: SemKey = (name.into(), *owner.as_bytes());
        let n = self.sem_names(name, owner);
        let ttl_s = secs(ttl);
        let known = self.sem_local(&sk, |s| s.grant.clone());
        // Whether `kv` is the grant `g` this client knows.
        let is_it = |g: &Grant, kv: &KeyValue| {
            n.owns(kv.value()) && (g.rev == 0 || kv.create_revision() == g.rev)
        };
        // The grant's key, read after a keepalive of its lease where the
        // TTL is the lease's: a key gone (released, removed, expired) is
        // never brought back, and one written again is another grant.
        let mut refreshed = None;
        // After a move whose answer was never seen, the grant goes onto a
        // fresh lease (see `SemLocal::moves`).
        let fresh = self.sem_local(&sk, |s| !s.moves.is_empty());
        if let Some(g) = known.as_ref().filter(|g| g.ttl == ttl_s && !fresh) {
            let since = Instant::now();
            refreshed = Some((g.lease, since, self.etcd.keepalive_once(g.lease, op).await?));
        }
        // The one this client knows (at its create revision), else the one
        // whose value names the owner.
        let kv = match &known {
            Some(g) => self
                .etcd
                .get(op, g.key.clone(), None)
                .await?
                .into_iter()
                .next()
                .filter(|kv| is_it(g, kv)),
            None => None,
        };
        // Not (or no longer) the grant this client knows: the owner's live
        // grant, if any, found by its value (a stale record must not answer
        // for a grant made again through another client).
        let kv = match kv {
            Some(kv) => Some(kv),
            None => self.sem_find(&n, op).await?.0,
        };
        if let (Some((lease, since, alive)), Some(kv)) = (refreshed, &kv) {
            if kv.lease() == lease {
                if !alive {
                    self.sem_forget_of(&sk, known.as_ref());
                    return Ok(None);
                }
                self.sem_local(&sk, |s| {
                    if let Some(g) = s.grant.as_mut().filter(|x| x.lease == lease) {
                        g.deadline = since + Duration::from_secs(ttl_s);
                        g.rev = kv.create_revision();
                    }
                });
                return Ok(Some(kv.create_revision()));
            }
            // Moved to another lease (by an extend of this owner through
            // another client): moved again, to one of this client's.
        }
        let Some(kv) = kv else {
            self.sem_forget_of(&sk, known.as_ref());
            return Ok(None);
        };
        let slots = slots_of(kv.value());
        let (lease, keeper, since) = self.sem_lease(ttl_s, op).await?;
        let put =
            |k: Vec<u8>, v: Vec<u8>| TxnOp::put(k, v, Some(PutOptions::new().with_lease(lease)));
        let mut kv = kv;
        let mut tries = 0;
        let resp = loop {
            let mut then = vec![put(kv.key().to_vec(), kv.value().to_vec())];
            then.extend(
                slots
                    .iter()
                    .map(|i| put(n.slot(*i), owner.to_hex().into_bytes())),
            );
            // The grant at its create revision, on the lease it was read
            // on (so this move, landing late after a later one, fails: the
            // grant is on a fresh lease by then).
            let when = [
                Compare::create_revision(kv.key().to_vec(), CompareOp::Equal, kv.create_revision()),
                Compare::lease(kv.key().to_vec(), CompareOp::Equal, kv.lease()),
            ];
            let txn = Txn::new()
                .when(when)
                .and_then(then)
                .or_else([TxnOp::get(kv.key().to_vec(), None)]);
            // Unanswered (an error, or dropped mid-call), the move may have
            // landed or still land: the new lease may carry the live grant,
            // so it is not revoked (it ends at its TTL, nobody keeping it
            // alive) but recorded; the record stays as it was, and the next
            // extend or release finds the grant by its key.
            let mut way = Unseen {
                shared: self,
                sk: &sk,
                lease,
                seen: false,
            };
            let resp = self.etcd.txn(op, txn).await?;
            way.seen = true;
            drop(way);
            if resp.succeeded() {
                break resp;
            }
            // Moved onto another lease meanwhile (an extend of this owner
            // through another client, or a copy of an unseen move of this
            // one): moved again, from there.
            match kvs(&resp, 0).into_iter().next() {
                Some(now) if now.create_revision() == kv.create_revision() && tries < 3 => {
                    kv = now;
                    tries += 1;
                }
                _ => break resp,
            }
        };
        // Answered: the moves never seen carry nothing now (the grant is
        // on `lease`, or gone), and no copy of one can move it.
        let moved = self.sem_local(&sk, |s| std::mem::take(&mut s.moves));
        for l in moved {
            self.etcd.revoke_later(l);
        }
        if !resp.succeeded() {
            self.etcd
                .put_spare(lease, ttl_s, since + Duration::from_secs(ttl_s), keeper);
            self.sem_forget_of(&sk, known.as_ref());
            return Ok(None);
        }
        // The lease the grant was on carries nothing now; this client's
        // own is revoked, another client's left to it.
        if let Some(g) = known.filter(|g| g.own) {
            self.etcd.revoke_later(g.lease);
        }
        self.sem_local(&sk, |s| {
            s.grant = Some(Grant {
                lease,
                ttl: ttl_s,
                deadline: since + Duration::from_secs(ttl_s),
                key: kv.key().to_vec(),
                rev: kv.create_revision(),
                own: true,
            });
            s.keeper = keeper;
            s.slots = slots;
        });
        Ok(Some(kv.create_revision()))
    }

    /// The owner's grant and its (earliest) place in the queue, found by
    /// the owner their values name, in one snapshot (pages read at one
    /// revision): for an owner this client has no record of (keys are
    /// named by leases, not owners).
    async fn sem_find(
        &self,
        n: &Names,
        op: &'static str,
    ) -> Result<(Option<KeyValue>, Option<KeyValue>)> {
        let ((h, he), (w, we)) = (n.range(b"h/"), n.range(b"w/"));
        let mut tries = 0;
        let (holds, waits) = loop {
            let txn = Txn::new().and_then([
                first_page(h.clone(), &he, false),
                first_page(w.clone(), &we, false),
            ]);
            let resp = self.etcd.txn(op, txn).await?;
            let rev = header_rev(&resp);
            let mut pages = resp.op_responses().into_iter().filter_map(|r| match r {
                TxnOpResponse::Get(g) => Some(g),
                _ => None,
            });
            let (Some(hg), Some(wg)) = (pages.next(), pages.next()) else {
                return Err(corrupt(op, "a semaphore read's answer"));
            };
            let read = async {
                let holds = self.etcd.rest_of(op, hg, &he, rev, false).await?;
                let waits = self.etcd.rest_of(op, wg, &we, rev, false).await?;
                Ok::<_, Error>((holds, waits))
            };
            match read.await {
                Ok(lists) => break lists,
                Err(e) if is_compacted(&e) && tries < 3 => tries += 1,
                Err(e) => return Err(e),
            }
        };
        let grant = holds.into_iter().find(|kv| n.owns(kv.value()));
        let place = waits
            .into_iter()
            .filter(|kv| n.owns(kv.value()))
            .min_by_key(KeyValue::create_revision);
        Ok((grant, place))
    }

    /// Delete every grant of `name` (keys and slots) in one transaction.
    pub(crate) async fn sem_force_release(&self, name: &str) -> Result<bool> {
        let base = self.etcd.keys.sem(name);
        let range = |p: &[u8]| {
            let k = [&base[..], p].concat();
            let e = prefix_end(&k);
            (k, e)
        };
        let ((h, he), (s, se)) = (range(b"h/"), range(b"s/"));
        let txn = Txn::new().and_then([
            // Counted, not answered with the keys deleted (a busy name's
            // grants would not fit in one answer).
            TxnOp::delete(h, Some(DeleteOptions::new().with_range(he))),
            TxnOp::delete(s, Some(DeleteOptions::new().with_range(se))),
        ]);
        let resp = self.etcd.txn("semaphore force_release", txn).await?;
        Ok(matches!(
            resp.op_responses().first(),
            Some(TxnOpResponse::Delete(d)) if d.deleted() > 0
        ))
    }
}

/// A grant move onto `lease` on its way: dropped unseen, it records the
/// lease in `SemLocal::moves`.
struct Unseen<'a> {
    shared: &'a Arc<Semaphores>,
    sk: &'a SemKey,
    lease: i64,
    seen: bool,
}

impl Drop for Unseen<'_> {
    fn drop(&mut self) {
        if !self.seen {
            let lease = self.lease;
            self.shared.sem_local(self.sk, |s| s.moves.push(lease));
        }
    }
}
