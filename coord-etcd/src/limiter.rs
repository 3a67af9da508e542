//! Rate limiters: one key per key and algorithm, updated by
//! compare-and-swap on its mod revision (coord-core's shared algorithms on
//! this client's clock), and attached to a lease that outlives the state's
//! retention, so idle state costs nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_core::limit::LimitState;
use coord_core::{Algorithm, Decision, Error, Result};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::client::keys::BACKEND;
use crate::client::{Etcd, corrupt, is_lease_not_found, lock, nanos_now, secs};

/// One pending check: quota, cost, and where its answer goes.
pub(crate) type LimiterRequest = (
    coord_core::Quota,
    u64,
    oneshot::Sender<Result<coord_core::Decision>>,
);

/// How long limiter state must survive its last write, in seconds.
fn retention(quota: &coord_core::Quota) -> u64 {
    let span = if quota.algorithm == Algorithm::SlidingWindow {
        2
    } else {
        1
    };
    secs(quota.window * span)
}

/// The rate limiters of one backend.
pub(crate) struct Limiters {
    pub(crate) etcd: Arc<Etcd>,
    /// Pending limiter checks per key, combined into one compare-and-swap.
    queue: Mutex<HashMap<Vec<u8>, Vec<LimiterRequest>>>,
    /// The lease limiter state is attached to, per retention (seconds):
    /// (lease id, the earliest instant the server may expire it).
    leases: Mutex<HashMap<u64, (i64, Instant)>>,
}

impl Limiters {
    pub(crate) fn new(etcd: Arc<Etcd>) -> Self {
        Limiters {
            etcd,
            queue: Mutex::new(HashMap::new()),
            leases: Mutex::new(HashMap::new()),
        }
    }

    /// A lease that the server keeps at least `needed` seconds after a
    /// write sent now (plus one call timeout). Leases are granted, never
    /// renewed: each is used while it has that much left, then the next
    /// write moves the key to a new one; a lease the server lost (a
    /// partition longer than its TTL) is replaced on the spot.
    async fn limiter_lease(&self, needed: u64, op: &'static str) -> Result<i64> {
        let now = Instant::now();
        let min_left = Duration::from_secs(needed) + self.etcd.timeout;
        {
            let mut leases = lock(&self.leases);
            if let Some((id, expires)) = leases.get(&needed) {
                if *expires >= now + min_left {
                    return Ok(*id);
                }
            }
            leases.retain(|_, (_, expires)| *expires > now);
        }
        let ttl = 2 * needed + secs(self.etcd.timeout) + 2;
        let id = self.etcd.grant_lease(ttl, op).await?;
        lock(&self.leases).insert(needed, (id, now + Duration::from_secs(ttl)));
        Ok(id)
    }

    fn forget_limiter_lease(&self, id: i64) {
        lock(&self.leases).retain(|_, (l, _)| *l != id);
    }

    /// Check a limiter. Concurrent checks of one key in this client are
    /// combined: one task applies all pending requests, in order, to the
    /// state read from etcd and writes the result with one compare-and-swap
    /// (recomputing every decision if another client won the race). Across
    /// clients the compare-and-swap keeps admissions within the quota.
    pub(crate) async fn limiter_check(
        self: &Arc<Self>,
        key: &str,
        quota: &coord_core::Quota,
        cost: u64,
    ) -> Result<Decision> {
        let tag = match quota.algorithm {
            Algorithm::SlidingLog => "log",
            Algorithm::SlidingWindow => "sw",
            Algorithm::FixedWindow => "fw",
            _ => "gcra",
        };
        let op = "limiter check";
        let k = self.etcd.keys.limiter(tag, key);
        let (tx, rx) = oneshot::channel();
        let lead = {
            let mut q = lock(&self.queue);
            match q.get_mut(&k) {
                Some(v) => {
                    v.push((*quota, cost, tx));
                    false
                }
                None => {
                    q.insert(k.clone(), vec![(*quota, cost, tx)]);
                    true
                }
            }
        };
        if lead {
            let shared = self.clone();
            tokio::spawn(async move { shared.limiter_batches(k).await });
        }
        match tokio::time::timeout(self.etcd.timeout * 2, rx).await {
            Ok(Ok(r)) => r,
            _ => Err(Error::Unavailable {
                backend: BACKEND,
                operation: op,
                message: format!("no answer within {:?}", self.etcd.timeout * 2),
                source: None,
            }),
        }
    }

    /// One compare-and-swap applying `items` in order to the state of `k`.
    async fn limiter_cas(
        self: &Arc<Self>,
        op: &'static str,
        k: &[u8],
        needed: u64,
        items: &[(coord_core::Quota, u64)],
    ) -> Result<Vec<Decision>> {
        let lease = self.limiter_lease(needed, op).await?;
        let r = self
            .etcd
            .cas(op, k.to_vec(), Some(lease), |cur| {
                let since = nanos_now();
                let mut state: Option<Vec<u8>> = cur.map(<[u8]>::to_vec);
                let mut changed = false;
                let mut decisions = Vec::with_capacity(items.len());
                for (quota, cost) in items {
                    let text = match &state {
                        Some(v) => {
                            Some(std::str::from_utf8(v).map_err(|_| corrupt(op, "limiter"))?)
                        }
                        None => None,
                    };
                    let (new, d) = limiter_step(quota, text, since, *cost)
                        .ok_or_else(|| corrupt(op, "limiter"))?;
                    if let Some(n) = new {
                        state = Some(n);
                        changed = true;
                    }
                    decisions.push(d);
                }
                Ok((if changed { state } else { None }, decisions))
            })
            .await;
        if let Err(e) = &r {
            if is_lease_not_found(e) {
                self.forget_limiter_lease(lease);
            }
        }
        r
    }

    async fn limiter_batches(self: Arc<Self>, k: Vec<u8>) {
        let op = "limiter check";
        loop {
            let batch = {
                let mut q = lock(&self.queue);
                match q.get_mut(&k) {
                    Some(v) if !v.is_empty() => std::mem::take(v),
                    _ => {
                        q.remove(&k);
                        return;
                    }
                }
            };
            let items: Vec<(coord_core::Quota, u64)> =
                batch.iter().map(|(q, c, _)| (*q, *c)).collect();
            // The state must outlive its retention even if this client dies.
            let needed = items.iter().map(|(q, _)| retention(q)).max().unwrap_or(1);
            let mut result = self.limiter_cas(op, &k, needed, &items).await;
            if let Err(e) = &result {
                if is_lease_not_found(e) {
                    // The lease was lost (say, a partition longer than its
                    // TTL): the next attempt takes a new one.
                    result = self.limiter_cas(op, &k, needed, &items).await;
                }
            }
            match result {
                Ok(decisions) => {
                    for ((_, _, tx), d) in batch.into_iter().zip(decisions) {
                        let _ = tx.send(Ok(d));
                    }
                }
                Err(e) => {
                    for (_, _, tx) in batch {
                        let _ = tx.send(Err(e.clone()));
                    }
                }
            }
        }
    }
}

/// One limiter decision on the stored state `cur` at client time `since`
/// (ns since the epoch), by coord-core's shared algorithms. Returns the new
/// state to store when the request is admitted, or `None` for corrupt
/// state.
pub(crate) fn limiter_step(
    quota: &coord_core::Quota,
    cur: Option<&str>,
    since: u128,
    cost: u64,
) -> Option<(Option<Vec<u8>>, Decision)> {
    let mut state = match cur {
        Some(text) => LimitState::decode(quota.algorithm, text)?,
        None => LimitState::new(quota),
    };
    let d = state.check(since, quota, cost);
    Some((d.allowed.then(|| state.encode().into_bytes()), d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limiter_steps_never_exceed_the_limit() {
        for alg in Algorithm::ALL {
            let quota = coord_core::Quota::new(5, Duration::from_secs(1), alg);
            let mut state: Option<Vec<u8>> = None;
            let t0 = 1_700_000_000_000_000_000u128;
            let mut admitted = 0;
            for i in 0..20u128 {
                let cur = state.as_deref().map(|b| std::str::from_utf8(b).unwrap());
                let (new, d) = limiter_step(&quota, cur, t0 + i * 1_000, 1).unwrap();
                if d.allowed {
                    admitted += 1;
                    state = new;
                } else {
                    assert!(d.retry_after > Duration::ZERO);
                    assert!(new.is_none());
                }
            }
            assert_eq!(admitted, 5, "{alg:?}");
        }
    }
}
