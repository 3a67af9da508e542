//! Locks, elections and named leases.

use std::time::Duration;

use coord_core::inspect::{ClaimRecord, LeaderRecord};
use coord_core::util::Kind;
use coord_core::wake::Waiter;
use coord_core::{
    Attempt, Capabilities, FencingToken, LeaderInfo, OwnerToken, Result, Step, async_trait,
};

use crate::EtcdBackend;
use crate::claim::attempt::ClaimSpec;
use crate::client::keys::{self, prefix_end};
use crate::client::wake_key;
use crate::client::watch::WatchKind;

#[async_trait]
impl coord_core::Lock for EtcdBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn try_acquire(&self, name: &str, step: Step, ttl: Duration) -> Result<Attempt> {
        let owner = &step.owner;
        let spec = ClaimSpec {
            kind: Kind::Lock,
            value: b"",
            fair: true,
            op: "lock try_acquire",
        };
        self.claims.try_claim(spec, name, owner, ttl).await
    }

    /// As `try_acquire`; the claim's key is written with `metadata` in its
    /// value (after the owner's hex and a space), so it ends with the key.
    /// An owner whose key exists already keeps it as it is.
    async fn try_acquire_with_metadata(
        &self,
        name: &str,
        step: Step,
        ttl: Duration,
        metadata: &[u8],
    ) -> Result<Attempt> {
        let owner = &step.owner;
        let spec = ClaimSpec {
            kind: Kind::Lock,
            value: metadata,
            fair: true,
            op: "lock try_acquire",
        };
        self.claims.try_claim(spec, name, owner, ttl).await
    }

    async fn inspect(&self, name: &str) -> Result<ClaimRecord> {
        crate::inspect::lock(&self.etcd, name).await
    }

    async fn release(&self, name: &str, step: Step) -> Result<bool> {
        let owner = &step.owner;
        self.claims
            .release_claim(Kind::Lock, name, owner, "lock release")
            .await
    }

    async fn extend(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        let owner = &step.owner;
        self.claims
            .extend_claim(Kind::Lock, name, owner, ttl, "lock extend")
            .await
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        self.claims
            .force_release_claim(Kind::Lock, name, "lock force_release")
            .await
    }

    async fn subscribe(&self, name: &str, owner: &OwnerToken) -> Result<Waiter> {
        // Wake-ups come from the watch on each waiter's predecessor, set up
        // by the attempt that queues it.
        Ok(self.claims.subscribe_lock(Kind::Lock, name, owner))
    }
}

#[async_trait]
impl coord_core::Election for EtcdBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn try_campaign(
        &self,
        name: &str,
        candidate: &str,
        step: Step,
        ttl: Duration,
    ) -> Result<Attempt> {
        let owner = &step.owner;
        let spec = ClaimSpec {
            kind: Kind::Election,
            value: candidate.as_bytes(),
            fair: false,
            op: "election campaign",
        };
        self.claims.try_claim(spec, name, owner, ttl).await
    }

    async fn renew(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        let owner = &step.owner;
        self.claims
            .extend_claim(Kind::Election, name, owner, ttl, "election renew")
            .await
    }

    async fn resign(&self, name: &str, step: Step) -> Result<bool> {
        let owner = &step.owner;
        self.claims
            .release_claim(Kind::Election, name, owner, "election resign")
            .await
    }

    async fn leader(&self, name: &str) -> Result<Option<LeaderInfo>> {
        Ok(self
            .etcd
            .head(Kind::Election, name, "election leader")
            .await?
            .map(|kv| LeaderInfo {
                candidate: String::from_utf8_lossy(
                    keys::split_lease_value(kv.value()).1.unwrap_or_default(),
                )
                .into_owned(),
                term: FencingToken(kv.create_revision() as u64),
            }))
    }

    async fn inspect(&self, name: &str) -> Result<Option<LeaderRecord>> {
        crate::inspect::election(&self.etcd, name).await
    }

    async fn subscribe(&self, name: &str) -> Result<Waiter> {
        let queue = self.etcd.keys.queue(Kind::Election, name);
        let end = prefix_end(&queue);
        self.etcd
            .subscribe_watch(
                wake_key(Kind::Election, name),
                queue,
                Some(end),
                WatchKind::AnyChange,
            )
            .await
    }
}

#[async_trait]
impl coord_core::Lease for EtcdBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn grant(&self, name: &str, step: Step, ttl: Duration) -> Result<Attempt> {
        let owner = &step.owner;
        self.claims.grant_lease_named(name, owner, ttl, None).await
    }

    async fn grant_with_metadata(
        &self,
        name: &str,
        step: Step,
        ttl: Duration,
        metadata: &[u8],
    ) -> Result<Attempt> {
        let owner = &step.owner;
        self.claims
            .grant_lease_named(name, owner, ttl, Some(metadata))
            .await
    }

    async fn inspect(&self, name: &str) -> Result<ClaimRecord> {
        crate::inspect::lease(&self.etcd, name).await
    }

    async fn renew(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        let owner = &step.owner;
        self.claims
            .extend_claim(Kind::Lease, name, owner, ttl, "lease renew")
            .await
    }

    async fn revoke(&self, name: &str, step: Step) -> Result<bool> {
        let owner = &step.owner;
        self.claims
            .release_claim(Kind::Lease, name, owner, "lease revoke")
            .await
    }

    async fn remaining(&self, name: &str) -> Result<Option<Duration>> {
        self.claims.lease_remaining(name).await
    }
}
