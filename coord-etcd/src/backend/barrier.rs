//! Barriers and fencing tokens.

use coord_core::util::Kind;
use coord_core::wake::Waiter;
use coord_core::{Arrival, Capabilities, Error, FencingToken, OwnerToken, Result, async_trait};

use crate::EtcdBackend;
use crate::client::keys;

#[async_trait]
impl coord_core::Barrier for EtcdBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn arrive(
        &self,
        name: &str,
        parties: u32,
        participant: &str,
        arrival: &OwnerToken,
    ) -> Result<Arrival> {
        self.barriers
            .barrier_arrive(name, parties, participant, arrival)
            .await
    }

    async fn is_complete(&self, name: &str, generation: u64) -> Result<bool> {
        self.barriers.barrier_is_complete(name, generation).await
    }

    async fn withdraw(
        &self,
        name: &str,
        generation: u64,
        participant: &str,
        arrival: &OwnerToken,
    ) -> Result<bool> {
        self.barriers
            .barrier_withdraw(name, generation, participant, arrival)
            .await
    }

    async fn subscribe(&self, name: &str) -> Result<Waiter> {
        self.barriers.subscribe(name).await
    }
}

#[async_trait]
impl coord_core::FencingSource for EtcdBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn next(&self, resource: &str) -> Result<FencingToken> {
        // One key for every resource (the revision is one counter for the
        // whole cluster), so fencing leaves no state per resource.
        let _ = resource;
        let key = self.etcd.keys.single(Kind::Fence, "");
        let resp = self
            .etcd
            .call("fencing next", |mut c| {
                let k = key.clone();
                async move { c.put(k, Vec::new(), None).await }
            })
            .await?;
        let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
        if rev <= 0 {
            return Err(Error::Store {
                backend: keys::BACKEND,
                operation: "fencing next",
                message: "the put's reply carried no revision".into(),
                source: None,
            });
        }
        Ok(FencingToken(rev as u64))
    }
}
