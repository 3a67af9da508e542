//! Semaphore grants once made: owner-checked release and extend, and the
//! operator's force_release (see `semaphore.rs` for the layout).

use std::sync::Arc;
use std::time::Duration;

use coord_core::{OwnerToken, Result};
use etcd_client::{Compare, CompareOp, DeleteOptions, PutOptions, Txn, TxnOp};
use tokio::time::Instant;

use crate::backend::{Shared, kvs, lock, secs};
use crate::keys::prefix_end;
use crate::semaphore::{Grant, QUEUE_ENTRY_TTL, SemKey, slots_of};

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
        let known = lock(&self.sems)
            .get(&sk)
            .filter(|s| s.grant.is_some())
            .map(|s| (s.slots.clone(), s.grant.map(|g| g.lease)));
        let (slots, rev) = match known {
            Some((slots, _)) => (slots, None),
            None => match self.get(op, n.hold.clone(), None).await?.into_iter().next() {
                Some(kv) => (slots_of(kv.value()), Some(kv.create_revision())),
                None => (Vec::new(), None),
            },
        };
        let del = || Some(DeleteOptions::new().with_prev_key());
        let held = match rev {
            Some(r) => Compare::create_revision(n.hold.clone(), CompareOp::Equal, r),
            None => Compare::create_revision(n.hold.clone(), CompareOp::Greater, 0),
        };
        let mut then = vec![
            TxnOp::delete(n.wait.clone(), del()),
            TxnOp::delete(n.hold.clone(), del()),
        ];
        then.extend(slots.iter().map(|i| TxnOp::delete(n.slot(*i), None)));
        let txn = Txn::new()
            .when([held])
            .and_then(then)
            .or_else([TxnOp::delete(n.wait.clone(), del())]);
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
        let known = self.sem_local(&sk, |s| s.grant).filter(|g| g.ttl == ttl_s);
        if let Some(g) = known {
            // Refresh first, then check the key is still ours on it: a
            // key gone (released, removed, expired) is never brought back.
            let since = Instant::now();
            if !self.keepalive_once(g.lease, op).await? {
                self.sem_forget(&sk);
                return Ok(false);
            }
            let kv = self.get(op, n.hold.clone(), None).await?;
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
        let Some(kv) = self.get(op, n.hold.clone(), None).await?.into_iter().next() else {
            self.sem_forget(&sk);
            return Ok(false);
        };
        let slots = slots_of(kv.value());
        let (lease, keeper, since) = self.sem_lease(ttl_s, op).await?;
        let put =
            |k: Vec<u8>, v: Vec<u8>| TxnOp::put(k, v, Some(PutOptions::new().with_lease(lease)));
        let mut then = vec![put(n.hold.clone(), kv.value().to_vec())];
        then.extend(
            slots
                .iter()
                .map(|i| put(n.slot(*i), owner.to_hex().into_bytes())),
        );
        let txn = Txn::new()
            .when([Compare::create_revision(
                n.hold.clone(),
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
        });
        Ok(true)
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
