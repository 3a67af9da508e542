//! Read-modify-write of one key by compare-and-swap on its mod revision,
//! and keeping the lease a key is on alive.

use std::time::Duration;

use coord_core::Result;
use coord_core::util::bounded;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use crate::client::keys::BACKEND;
use crate::client::{Etcd, kvs, nanos_now};

impl Etcd {
    /// Read-modify-write `key` until the compare-and-swap on its mod
    /// revision wins. `f` gets the current value and returns the new value
    /// to write (`None`: write nothing) and the result.
    pub(crate) async fn cas<R>(
        &self,
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

    /// Keep the lease `key` is on alive (a local waiter waits on it).
    pub(crate) async fn keep_lease_of(&self, key: &[u8], op: &'static str) {
        let kv = match self.get(op, key.to_vec(), None).await {
            Ok(kvs) => kvs.into_iter().next(),
            Err(e) => {
                tracing::debug!(error = %e, "reading a key to keep its lease alive failed");
                return;
            }
        };
        if let Some(l) = kv.map(|kv| kv.lease()).filter(|l| *l != 0) {
            if let Err(e) = self.keepalive_once(l, op).await {
                tracing::debug!(error = %e, "keeping a key's lease alive failed");
            }
        }
    }
}
