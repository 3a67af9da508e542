//! Barriers: one key per barrier, updated by compare-and-swap on the
//! key's mod revision, on a lease of its own that local waiters keep alive
//! (so the state of a barrier nobody waits on goes after a grace).

use std::sync::Arc;
use std::time::Duration;

use coord_core::barrier_state::BarrierState;
use coord_core::util::{Kind, bounded};
use coord_core::wake::Waiter;
use coord_core::{Arrival, Error, OwnerToken, Result};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use crate::client::keys::BACKEND;
use crate::client::watch::WatchKind;
use crate::client::{
    Etcd, corrupt, header_rev, is_lease_not_found, kvs, nanos_now, secs, wake_key,
};

/// How long a barrier's state outlives its last write or the last
/// keepalive of a waiter: the state of a completed generation (kept so a
/// retried completing arrival is recognised), of one whose participants
/// all timed out, or of one whose participants all died, goes this long
/// after nobody waits on it. Waiters keep it alive every third of it.
pub(crate) const BARRIER_GRACE: Duration = Duration::from_secs(30);

/// The generation stored in a barrier key's value.
fn generation_of(b: &[u8]) -> Option<u64> {
    decode(b).map(|s| s.generation)
}

fn decode(b: &[u8]) -> Option<BarrierState> {
    BarrierState::decode(std::str::from_utf8(b).ok()?)
}

/// The barriers of one backend.
pub(crate) struct Barriers {
    pub(crate) etcd: Arc<Etcd>,
}

impl Barriers {
    /// Read-modify-write a barrier key, as [`Etcd::cas`], keeping the
    /// key on a lease of its own of [`BARRIER_GRACE`]: the lease it is on
    /// (refreshed by a keepalive sent with the write), or a new one if it
    /// has none. `f` also gets the generation an absent barrier starts at:
    /// the store's revision, above every generation the name had before
    /// (each generation was set by a write of a higher revision).
    async fn barrier_cas<R>(
        self: &Arc<Self>,
        op: &'static str,
        key: Vec<u8>,
        mut f: impl FnMut(Option<&[u8]>, u64) -> Result<(Option<Vec<u8>>, R)> + Send,
    ) -> Result<R>
    where
        R: Send,
    {
        let grace = secs(BARRIER_GRACE);
        bounded(BACKEND, op, self.etcd.timeout, async {
            let read = || async {
                let k = key.clone();
                let mut r = self
                    .etcd
                    .call(op, |mut c| {
                        let k = k.clone();
                        async move { c.get(k, None).await }
                    })
                    .await?;
                let rev = r.header().map(|h| h.revision()).unwrap_or(0);
                Ok::<_, Error>((r.take_kvs().into_iter().next(), rev))
            };
            let (mut current, mut rev) = read().await?;
            // A lease granted for this key (an absent one), once: revoked
            // when the call ends only if the key is known to be on
            // another lease (`drop_fresh`). A write on it whose answer
            // never came may have landed, and the state it wrote, other
            // parties' arrivals added since, is the barrier's.
            let mut fresh: Option<i64> = None;
            let drop_fresh = |fresh: Option<i64>, on: Option<i64>| {
                if let Some(l) = fresh.filter(|l| Some(*l) != on) {
                    self.etcd.revoke_later(l);
                }
            };
            let mut attempt = 0u32;
            loop {
                let (new, r) = f(current.as_ref().map(|kv| kv.value()), rev.max(0) as u64)?;
                let existing = current.as_ref().map(|kv| kv.lease()).filter(|l| *l != 0);
                let Some(new) = new else {
                    // Nothing to write: the key as read is answered state.
                    drop_fresh(fresh, existing);
                    return Ok(r);
                };
                let lease = match (existing, fresh) {
                    (Some(l), _) => l,
                    (None, Some(l)) => l,
                    (None, None) => *fresh.insert(self.etcd.grant_lease(grace, op).await?),
                };
                let cmp = match &current {
                    Some(kv) => {
                        Compare::mod_revision(key.clone(), CompareOp::Equal, kv.mod_revision())
                    }
                    None => Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                };
                let txn = Txn::new()
                    .when([cmp])
                    .and_then([TxnOp::put(
                        key.clone(),
                        new,
                        Some(PutOptions::new().with_lease(lease)),
                    )])
                    .or_else([TxnOp::get(key.clone(), None)]);
                let (resp, alive) = if existing.is_some() {
                    tokio::join!(self.etcd.txn(op, txn), self.etcd.keepalive_once(lease, op))
                } else {
                    (self.etcd.txn(op, txn).await, Ok(true))
                };
                match resp {
                    Ok(resp) if resp.succeeded() => {
                        if alive? {
                            drop_fresh(fresh, Some(lease));
                            return Ok(r);
                        }
                        // The lease ran out just as the write landed: the
                        // state went with it. Start again from what is there.
                        (current, rev) = read().await?;
                    }
                    Ok(resp) => {
                        current = kvs(&resp, 0).into_iter().next();
                        rev = header_rev(&resp);
                    }
                    Err(e) if is_lease_not_found(&e) => {
                        if existing.is_none() {
                            fresh = None;
                        }
                        (current, rev) = read().await?;
                    }
                    Err(e) => {
                        // Unanswered: the write may have landed on
                        // `lease`, which then carries the key; a fresh
                        // lease it did not use carries nothing.
                        drop_fresh(fresh, Some(lease));
                        return Err(e);
                    }
                }
                attempt += 1;
                if attempt > 3 {
                    let jitter = u64::from(attempt.min(20)) * (1 + nanos_now() as u64 % 3);
                    tokio::time::sleep(Duration::from_millis(jitter)).await;
                }
            }
        })
        .await
    }

    pub(crate) async fn barrier_arrive(
        self: &Arc<Self>,
        name: &str,
        parties: u32,
        participant: &str,
        arrival: &OwnerToken,
    ) -> Result<Arrival> {
        let key = self.etcd.keys.single(coord_core::util::Kind::Barrier, name);
        let op = "barrier arrive";
        self.barrier_cas(op, key, |cur, base| {
            let mut b = match cur {
                Some(v) => decode(v).ok_or_else(|| corrupt(op, "barrier"))?,
                None => BarrierState::new(base),
            };
            let (arrival, changed) = b.arrive(name, parties, participant, arrival, |g| g + 1)?;
            Ok((changed.then(|| b.encode().into_bytes()), arrival))
        })
        .await
    }

    pub(crate) async fn barrier_is_complete(&self, name: &str, generation: u64) -> Result<bool> {
        let key = self.etcd.keys.single(coord_core::util::Kind::Barrier, name);
        let op = "barrier is_complete";
        let kv = self.etcd.get(op, key, None).await?.into_iter().next();
        match kv {
            // Gone: its lease ran out (nobody kept it alive for the grace:
            // this waiter was cut off), and the arrival went with it.
            None => Err(Error::arrival_state_lost(name, generation)),
            // Made again since (at a higher revision, its birth): a
            // generation below that was lost with its arrivals.
            Some(kv) => {
                let b = decode(kv.value()).ok_or_else(|| corrupt(op, "barrier"))?;
                b.is_complete(name, generation)
            }
        }
    }

    pub(crate) async fn barrier_withdraw(
        self: &Arc<Self>,
        name: &str,
        generation: u64,
        participant: &str,
        arrival: &OwnerToken,
    ) -> Result<bool> {
        let key = self.etcd.keys.single(coord_core::util::Kind::Barrier, name);
        let op = "barrier withdraw";
        self.barrier_cas(op, key, |cur, base| {
            // Gone: made again, holding the withdrawn arrival's tombstone so
            // a late copy of it is refused.
            let mut b = match cur {
                Some(v) => decode(v).ok_or_else(|| corrupt(op, "barrier"))?,
                None => BarrierState::new(base),
            };
            let (withdrawn, changed) = b.withdraw(generation, participant, arrival);
            Ok((changed.then(|| b.encode().into_bytes()), withdrawn))
        })
        .await
    }
}

impl Barriers {
    /// Register a local waiter of barrier `name`: a shared watch on its
    /// key wakes it when the generation changes, and keeps the barrier's
    /// state alive meanwhile.
    pub(crate) async fn subscribe(&self, name: &str) -> Result<Waiter> {
        let key = self.etcd.keys.single(Kind::Barrier, name);
        let kind = WatchKind::Generation {
            of: generation_of,
            keep_alive: BARRIER_GRACE / 3,
            op: "barrier keepalive",
        };
        self.etcd
            .subscribe_watch(wake_key(Kind::Barrier, name), key, None, kind)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn barrier_state_roundtrip() {
        let b = BarrierState {
            parties: 3,
            generation: 7,
            born: 5,
            withdrawn: vec![OwnerToken::random().to_hex()],
            arrived: vec![
                ("a b".into(), OwnerToken::random().to_hex()),
                ("ünï".into(), OwnerToken::random().to_hex()),
            ],
            last: Some((6, vec![OwnerToken::random().to_hex()])),
            latest: vec![("a b".into(), 17), ("ünï".into(), 3)],
        };
        assert_eq!(BarrierState::decode(&b.encode()), Some(b.clone()));
        let empty = BarrierState {
            arrived: vec![],
            withdrawn: vec![],
            ..b
        };
        assert_eq!(BarrierState::decode(&empty.encode()), Some(empty));
        assert_eq!(generation_of(b"2\n5\n-"), Some(5));
    }
}
