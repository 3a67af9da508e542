//! Barriers and rate limiters: one key each, updated by compare-and-swap
//! transactions on the key's mod revision.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use coord_core::barrier_state::BarrierState;
use coord_core::limit::LimitState;
use coord_core::util::bounded;
use coord_core::{Algorithm, Arrival, Decision, Error, OwnerToken, Result};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use tokio::sync::oneshot;

use crate::backend::{Shared, kvs, lock, secs};
use crate::keys::BACKEND;

/// The generation stored in a barrier key's value.
pub(crate) fn generation_of(b: &[u8]) -> Option<u64> {
    decode(b).map(|s| s.generation)
}

fn decode(b: &[u8]) -> Option<BarrierState> {
    BarrierState::decode(std::str::from_utf8(b).ok()?)
}

fn corrupt(operation: &'static str, what: &str) -> Error {
    Error::Store {
        backend: BACKEND,
        operation,
        message: format!(
            "the stored {what} state is not in coord's format; was the key written by something else?"
        ),
    }
}

impl Shared {
    /// Read-modify-write `key` until the compare-and-swap on its mod
    /// revision wins. `f` gets the current value and returns the new value
    /// to write (`None`: write nothing) and the result.
    pub(crate) async fn cas<R>(
        self: &Arc<Self>,
        op: &'static str,
        key: Vec<u8>,
        lease: Option<i64>,
        mut f: impl FnMut(Option<&[u8]>) -> Result<(Option<Vec<u8>>, R)> + Send,
    ) -> Result<R>
    where
        R: Send,
    {
        let limit = self.timeout;
        bounded(BACKEND, op, limit, async {
            let mut current = self.get(op, key.clone(), None).await?.into_iter().next();
            let mut attempt = 0u32;
            loop {
                let (new, r) = f(current.as_ref().map(|kv| kv.value()))?;
                let Some(new) = new else { return Ok(r) };
                let cmp = match &current {
                    Some(kv) => {
                        Compare::mod_revision(key.clone(), CompareOp::Equal, kv.mod_revision())
                    }
                    None => Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                };
                let put = lease.map(|l| PutOptions::new().with_lease(l));
                let txn = Txn::new()
                    .when([cmp])
                    .and_then([TxnOp::put(key.clone(), new, put)])
                    .or_else([TxnOp::get(key.clone(), None)]);
                let resp = self.txn(op, txn).await?;
                if resp.succeeded() {
                    return Ok(r);
                }
                current = kvs(&resp, 0).into_iter().next();
                attempt += 1;
                if attempt > 3 {
                    // Heavy contention: back off a little, with jitter.
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
        let key = self.keys.single(coord_core::util::Kind::Barrier, name);
        let op = "barrier arrive";
        self.cas(op, key, None, |cur| {
            let mut b = match cur {
                Some(v) => decode(v).ok_or_else(|| corrupt(op, "barrier"))?,
                None => BarrierState::default(),
            };
            let (arrival, changed) = b.arrive(name, parties, participant, arrival, |g| g + 1)?;
            Ok((changed.then(|| b.encode().into_bytes()), arrival))
        })
        .await
    }

    pub(crate) async fn barrier_is_complete(&self, name: &str, generation: u64) -> Result<bool> {
        let key = self.keys.single(coord_core::util::Kind::Barrier, name);
        let op = "barrier is_complete";
        let kv = self.get(op, key, None).await?.into_iter().next();
        match kv {
            None => Ok(false),
            Some(kv) => {
                let b = decode(kv.value()).ok_or_else(|| corrupt(op, "barrier"))?;
                Ok(b.is_complete(generation))
            }
        }
    }

    pub(crate) async fn barrier_withdraw(
        self: &Arc<Self>,
        name: &str,
        generation: u64,
        participant: &str,
    ) -> Result<bool> {
        let key = self.keys.single(coord_core::util::Kind::Barrier, name);
        let op = "barrier withdraw";
        self.cas(op, key, None, |cur| {
            let Some(v) = cur else {
                return Ok((None, true));
            };
            let mut b = decode(v).ok_or_else(|| corrupt(op, "barrier"))?;
            let (withdrawn, changed) = b.withdraw(generation, participant);
            Ok((changed.then(|| b.encode().into_bytes()), withdrawn))
        })
        .await
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
        let op = "limiter check";
        let (tag, span) = match quota.algorithm {
            Algorithm::SlidingLog => ("log", 1),
            Algorithm::SlidingWindow => ("sw", 2),
            Algorithm::FixedWindow => ("fw", 1),
            _ => ("gcra", 1),
        };
        let k = self.keys.limiter(tag, key);
        // The state must outlive its window even if this client dies: attach
        // it to a session lease whose TTL comfortably exceeds it.
        let needed = secs(quota.window * span);
        let ttl = needed + needed / 2 + 1;
        let session = self.session(ttl, op).await?;
        let (tx, rx) = oneshot::channel();
        let lead = {
            let mut q = lock(&self.limiter_queue);
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
            tokio::spawn(async move { shared.limiter_batches(k, session.id).await });
        }
        match tokio::time::timeout(self.timeout * 2, rx).await {
            Ok(Ok(r)) => r,
            _ => Err(Error::Unavailable {
                backend: BACKEND,
                operation: op,
                message: format!("no answer within {:?}", self.timeout * 2),
            }),
        }
    }

    async fn limiter_batches(self: Arc<Self>, k: Vec<u8>, lease: i64) {
        let op = "limiter check";
        loop {
            let batch = {
                let mut q = lock(&self.limiter_queue);
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
            let result = self
                .cas(op, k.clone(), Some(lease), |cur| {
                    let since = nanos_now();
                    let mut state: Option<Vec<u8>> = cur.map(<[u8]>::to_vec);
                    let mut changed = false;
                    let mut decisions = Vec::with_capacity(items.len());
                    for (quota, cost) in &items {
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

/// Nanoseconds since the Unix epoch on this client's clock.
pub(crate) fn nanos_now() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
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
    fn barrier_state_roundtrip() {
        let b = BarrierState {
            parties: 3,
            generation: 7,
            arrived: vec![
                ("a b".into(), OwnerToken::random().to_hex()),
                ("ünï".into(), OwnerToken::random().to_hex()),
            ],
            last: Some((6, vec![OwnerToken::random().to_hex()])),
        };
        assert_eq!(BarrierState::decode(&b.encode()), Some(b.clone()));
        let empty = BarrierState {
            arrived: vec![],
            ..b
        };
        assert_eq!(BarrierState::decode(&empty.encode()), Some(empty));
        assert_eq!(generation_of(b"2\n5\n-"), Some(5));
    }

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
