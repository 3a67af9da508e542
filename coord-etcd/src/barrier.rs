//! Barriers: one key per barrier, updated by compare-and-swap on the
//! key's mod revision; and that compare-and-swap, shared with limiters.

use std::sync::Arc;
use std::time::Duration;

use coord_core::barrier_state::BarrierState;
use coord_core::util::bounded;
use coord_core::{Arrival, Error, OwnerToken, Result};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use crate::backend::{Shared, kvs};
use crate::keys::BACKEND;
use crate::limiter::nanos_now;

/// The generation stored in a barrier key's value.
pub(crate) fn generation_of(b: &[u8]) -> Option<u64> {
    decode(b).map(|s| s.generation)
}

fn decode(b: &[u8]) -> Option<BarrierState> {
    BarrierState::decode(std::str::from_utf8(b).ok()?)
}

pub(crate) fn corrupt(operation: &'static str, what: &str) -> Error {
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
}
