//! Locks, leases and fencing sources: claims in the sharded map, with a
//! fencing token from the store's one counter.

use super::*;
use coord_core::Step;

#[async_trait]
impl coord_core::Lock for MemoryBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn try_acquire(&self, name: &str, step: Step, ttl: Duration) -> Result<Attempt> {
        let owner = &step.owner;
        Ok(self.claim_attempt(&self.locks, name, owner, ttl, None))
    }

    async fn release(&self, name: &str, step: Step) -> Result<bool> {
        let owner = &step.owner;
        let released = Self::claim_release(&self.locks, name, Some(owner));
        if released {
            self.lock_wakeups.notify_one(name);
        }
        Ok(released)
    }

    async fn extend(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        let owner = &step.owner;
        Ok(Self::claim_extend(&self.locks, name, owner, ttl))
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        let released = Self::claim_release(&self.locks, name, None);
        if released {
            self.lock_wakeups.notify_one(name);
        }
        Ok(released)
    }

    async fn subscribe(&self, name: &str, _owner: &OwnerToken) -> Result<Waiter> {
        Ok(self.lock_wakeups.subscribe(name))
    }

    async fn try_acquire_with_metadata(
        &self,
        name: &str,
        step: Step,
        ttl: Duration,
        metadata: &[u8],
    ) -> Result<Attempt> {
        let owner = &step.owner;
        Ok(self.claim_attempt(&self.locks, name, owner, ttl, Some(metadata)))
    }

    async fn inspect(&self, name: &str) -> Result<ClaimRecord> {
        Ok(Self::claim_inspect(&self.locks, name))
    }
}

#[async_trait]
impl coord_core::Lease for MemoryBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn grant(&self, name: &str, step: Step, ttl: Duration) -> Result<Attempt> {
        let owner = &step.owner;
        Ok(self.claim_attempt(&self.leases, name, owner, ttl, None))
    }

    async fn renew(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        let owner = &step.owner;
        Ok(Self::claim_extend(&self.leases, name, owner, ttl))
    }

    async fn revoke(&self, name: &str, step: Step) -> Result<bool> {
        let owner = &step.owner;
        Ok(Self::claim_release(&self.leases, name, Some(owner)))
    }

    async fn remaining(&self, name: &str) -> Result<Option<Duration>> {
        let now = Instant::now();
        let shard = self.leases.shard(name);
        Ok(shard
            .map
            .get(name)
            .filter(|c| c.live(now))
            .map(|c| c.expires - now))
    }

    async fn grant_with_metadata(
        &self,
        name: &str,
        step: Step,
        ttl: Duration,
        metadata: &[u8],
    ) -> Result<Attempt> {
        let owner = &step.owner;
        Ok(self.claim_attempt(&self.leases, name, owner, ttl, Some(metadata)))
    }

    async fn inspect(&self, name: &str) -> Result<ClaimRecord> {
        Ok(Self::claim_inspect(&self.leases, name))
    }
}

#[async_trait]
impl coord_core::FencingSource for MemoryBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn next(&self, resource: &str) -> Result<FencingToken> {
        // One strictly increasing counter serves every resource (as etcd's
        // revision does), so each resource's tokens strictly increase too.
        let _ = resource;
        Ok(FencingToken(self.next_token()))
    }
}
