//! FIFO semaphores.

use std::time::Duration;

use coord_core::inspect::ClaimRecord;
use coord_core::wake::Waiter;
use coord_core::{Attempt, OwnerToken, PermitRequest, Result, Step, async_trait};

use crate::EtcdBackend;
use crate::semaphore::sem_key;

/// FIFO semaphores on etcd (see docs/etcd.md): grants in arrival order
/// of the queued waiters, woken by a watch on the name.
#[async_trait]
impl coord_core::Semaphore for EtcdBackend {
    fn capabilities(&self) -> &coord_core::Capabilities {
        &self.caps
    }

    fn fifo(&self) -> bool {
        true
    }

    /// A grant writes one slot key per permit in one transaction, and etcd
    /// takes at most 128 operations per transaction by default
    /// (`--max-txn-ops`): at most 64 permits per request.
    fn max_permits_per_request(&self) -> u32 {
        64
    }

    async fn try_acquire(
        &self,
        name: &str,
        step: Step,
        request: &PermitRequest,
    ) -> Result<Attempt> {
        let owner = &step.owner;
        let _turn = self.semaphores.one_call(&sem_key(name, owner)).await;
        self.semaphores
            .sem_try_acquire(name, owner, request, None)
            .await
    }

    async fn try_acquire_with_metadata(
        &self,
        name: &str,
        step: Step,
        request: &PermitRequest,
        metadata: &[u8],
    ) -> Result<Attempt> {
        let owner = &step.owner;
        let _turn = self.semaphores.one_call(&sem_key(name, owner)).await;
        self.semaphores
            .sem_try_acquire(name, owner, request, Some(metadata))
            .await
    }

    async fn inspect(&self, name: &str) -> Result<ClaimRecord> {
        crate::inspect::semaphore(&self.etcd, name).await
    }

    async fn release(&self, name: &str, step: Step) -> Result<bool> {
        let owner = &step.owner;
        let _turn = self.semaphores.one_call(&sem_key(name, owner)).await;
        self.semaphores.sem_release(name, owner).await
    }

    async fn extend(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        let owner = &step.owner;
        let _turn = self.semaphores.one_call(&sem_key(name, owner)).await;
        Ok(self
            .semaphores
            .sem_extend(name, owner, ttl)
            .await?
            .is_some())
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        self.semaphores.sem_force_release(name).await
    }

    async fn subscribe(&self, name: &str, owner: &OwnerToken) -> Result<Waiter> {
        self.semaphores.subscribe_sem(name, owner).await
    }
}
