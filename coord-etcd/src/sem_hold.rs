//! Semaphore grants once made: owner-checked release and extend, and the
//! operator's force_release (see `semaphore.rs` for the layout).

use std::sync::Arc;
use std::time::Duration;

use coord_core::{OwnerToken, Result};
use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, KeyValue, PutOptions, Txn, TxnOp,
};
use tokio::time::Instant;

use crate::backend::{Shared, kvs, lock, secs};
use crate::keys::prefix_end;
use crate::semaphore::{Grant, Names, QUEUE_ENTRY_TTL, SemKey, slots_of};

impl Shared {
    /// Delete `owner`'s grant (its key and slots) iff it exists, and its
    /// place in the queue either way.
    pub(crate) async fn sem_release(
        self: &Arc<Self>,
        name: &str,
        owner: &OwnerToken,
    ) -> Result<bool> {
        let op = "semaphore release";
        let sk: SemKey = (name.into(), *owner.as_bytes());
        let n = self.sem_names(name, owner);
        let known = lock(&self.sems).get(&sk).and_then(|s| {
            let hold = s.hold.clone().filter(|_| s.grant.is_some())?;
            Some((s.slots.clone(), hold, s.place.clone()))
        });
        // The grant's key (the one this client wrote: it is the owner's
        // whenever it exists, see `SemLocal::hold`), else the one whose
        // value names the owner, deleted only at its create revision.
        let (slots, hold, place, rev) = match known {
            Some((slots, hold, place)) => (slots, hold, place, None),
            None => {
                let (grant, place) = self.sem_find(&n, op).await?;
                let local = lock(&self.sems).get(&sk).and_then(|s| s.place.clone());
                let place = place.map(|kv| kv.key().to_vec()).or(local);
                match grant {
                    Some(kv) => (
                        slots_of(kv.value()),
                        kv.key().to_vec(),
                        place,
                        Some(kv.create_revision()),
                    ),
                    // Compared below to exist: it never does.
                    None => (Vec::new(), n.nothing(), place, None),
                }
            }
        };
        let place = place.unwrap_or_else(|| n.nothing());
        let del = || Some(DeleteOptions::new().with_prev_key());
        let held = match rev {
            Some(r) => Compare::create_revision(hold.clone(), CompareOp::Equal, r),
            None => Compare::create_revision(hold.clone(), CompareOp::Greater, 0),
        };
        let mut then = vec![
            TxnOp::delete(place.clone(), del()),
            TxnOp::delete(hold, del()),
        ];
        then.extend(slots.iter().map(|i| TxnOp::delete(n.slot(*i), None)));
        let txn = Txn::new()
            .when([held])
            .and_then(then)
            .or_else([TxnOp::delete(place, del())]);
        let resp = self.txn(op, txn).await?;
        let mut gone: Vec<i64> = kvs(&resp, 0).iter().map(|kv| kv.lease()).collect();
        if resp.succeeded() {
            gone.extend(kvs(&resp, 1).iter().map(|kv| kv.lease()));
        }
        // Leases whose keys this answered transaction deleted carry no
        // keys now: they serve the next claims. Any other is revoked.
        let local = lock(&self.sems).remove(&sk).unwrap_or_default();
        let now = Instant::now();
        let mut rest = gone;
        if let Some(g) = local.grant {
            if rest.contains(&g.lease) && g.deadline > now {
                rest.retain(|l| *l != g.lease);
                self.put_spare(g.lease, g.ttl, g.deadline, local.keeper);
            } else {
                rest.push(g.lease);
            }
        }
        if let Some((w, at)) = local.waiter {
            if rest.contains(&w) {
                rest.retain(|l| *l != w);
                self.put_spare(w, QUEUE_ENTRY_TTL.as_secs(), at + QUEUE_ENTRY_TTL, None);
            } else {
                rest.push(w);
            }
        }
        rest.sort_unstable();
        rest.dedup();
        for l in rest {
            self.revoke_later(l);
        }
        Ok(resp.succeeded())
    }

    /// Refresh `owner`'s live grant to `ttl`: a keepalive of its lease, or
    /// (another TTL) a move of its keys to a new lease, keeping the create
    /// revision of its key (the fencing token). Never brings a grant back.
    pub(crate) async fn sem_extend(
        self: &Arc<Self>,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<bool> {
        let op = "semaphore extend";
        let sk: SemKey = (name.into(), *owner.as_bytes());
        let n = self.sem_names(name, owner);
        let ttl_s = secs(ttl);
        let hold = self.sem_local(&sk, |s| s.hold.clone().filter(|_| s.grant.is_some()));
        let known = self.sem_local(&sk, |s| s.grant).filter(|g| g.ttl == ttl_s);
        if let (Some(g), Some(hold)) = (known, &hold) {
            // Refresh first, then check the key is still ours on it: a
            // key gone (released, removed, expired) is never brought back.
            let since = Instant::now();
            if !self.keepalive_once(g.lease, op).await? {
                self.sem_forget(&sk);
                return Ok(false);
            }
            let kv = self.get(op, hold.clone(), None).await?;
            if kv.first().is_some_and(|kv| kv.lease() == g.lease) {
                self.sem_local(&sk, |s| {
                    if let Some(g) = &mut s.grant {
                        g.deadline = since + Duration::from_secs(ttl_s);
                    }
                });
                return Ok(true);
            }
            self.sem_forget(&sk);
            return Ok(false);
        }
        // The grant's key: the one this client wrote, else the one whose
        // value names the owner (moved only at its create revision).
        let kv = match hold {
            Some(h) => self.get(op, h, None).await?.into_iter().next(),
            None => self.sem_find(&n, op).await?.0,
        };
        let Some(kv) = kv.filter(|kv| n.owns(kv.value())) else {
            self.sem_forget(&sk);
            return Ok(false);
        };
        let slots = slots_of(kv.value());
        let (lease, keeper, since) = self.sem_lease(ttl_s, op).await?;
        let put =
            |k: Vec<u8>, v: Vec<u8>| TxnOp::put(k, v, Some(PutOptions::new().with_lease(lease)));
        let mut then = vec![put(kv.key().to_vec(), kv.value().to_vec())];
        then.extend(
            slots
                .iter()
                .map(|i| put(n.slot(*i), owner.to_hex().into_bytes())),
        );
        let txn = Txn::new()
            .when([Compare::create_revision(
                kv.key().to_vec(),
                CompareOp::Equal,
                kv.create_revision(),
            )])
            .and_then(then);
        let resp = match self.txn(op, txn).await {
            Ok(r) => r,
            Err(e) => {
                self.revoke_later(lease);
                return Err(e);
            }
        };
        if !resp.succeeded() {
            self.put_spare(lease, ttl_s, since + Duration::from_secs(ttl_s), keeper);
            self.sem_forget(&sk);
            return Ok(false);
        }
        self.revoke_later(kv.lease());
        self.sem_local(&sk, |s| {
            s.grant = Some(Grant {
                lease,
                ttl: ttl_s,
                deadline: since + Duration::from_secs(ttl_s),
            });
            s.keeper = keeper;
            s.slots = slots;
            s.hold = Some(kv.key().to_vec());
        });
        Ok(true)
    }

    /// The owner's grant and its (earliest) place in the queue, found by
    /// the owner their values name, in one snapshot: for an owner this
    /// client has no record of (keys are named by leases, not owners).
    async fn sem_find(
        &self,
        n: &Names,
        op: &'static str,
    ) -> Result<(Option<KeyValue>, Option<KeyValue>)> {
        let get = |p: &[u8]| {
            let (k, e) = n.range(p);
            TxnOp::get(k, Some(GetOptions::new().with_range(e)))
        };
        let resp = self
            .txn(op, Txn::new().and_then([get(b"h/"), get(b"w/")]))
            .await?;
        let grant = kvs(&resp, 0).into_iter().find(|kv| n.owns(kv.value()));
        let place = kvs(&resp, 1)
            .into_iter()
            .filter(|kv| n.owns(kv.value()))
            .min_by_key(KeyValue::create_revision);
        Ok((grant, place))
    }

    /// Delete every grant of `name` (keys and slots) in one transaction.
    pub(crate) async fn sem_force_release(&self, name: &str) -> Result<bool> {
        let base = self.keys.sem(name);
        let range = |p: &[u8]| {
            let k = [&base[..], p].concat();
            let e = prefix_end(&k);
            (k, e)
        };
        let ((h, he), (s, se)) = (range(b"h/"), range(b"s/"));
        let txn = Txn::new().and_then([
            TxnOp::delete(h, Some(DeleteOptions::new().with_range(he).with_prev_key())),
            TxnOp::delete(s, Some(DeleteOptions::new().with_range(se))),
        ]);
        let resp = self.txn("semaphore force_release", txn).await?;
        Ok(!kvs(&resp, 0).is_empty())
    }
}
