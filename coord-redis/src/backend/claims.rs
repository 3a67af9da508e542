//! Locks, leases and fencing sources: claims with a fencing token.

use std::time::Duration;

use coord_core::util::Kind;
use coord_core::wake::Waiter;
use coord_core::{Attempt, Capabilities, FencingToken, OwnerToken, Result, async_trait};

use super::{RedisBackend, attempt, flag, int, ms, unexpected};
use crate::keys::Keys;

impl RedisBackend {
    async fn claim_acquire(
        &self,
        operation: &'static str,
        keys: &[String; 3],
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Attempt> {
        let owner = owner.to_hex();
        let ttl = ms(ttl).to_string();
        let v = self
            .eval(
                operation,
                &self.scripts.acquire,
                &[&keys[0], &keys[1], &keys[2]],
                &[owner.as_bytes(), ttl.as_bytes()],
            )
            .await?;
        attempt(operation, &v)
    }

    async fn claim_release(
        &self,
        operation: &'static str,
        keys: &[String; 3],
        owner: &OwnerToken,
        wake: Option<(String, String)>,
    ) -> Result<bool> {
        let owner = owner.to_hex();
        let (channel, payload) = wake.unwrap_or_default();
        let v = self
            .eval(
                operation,
                &self.scripts.release,
                &[&keys[0], &keys[1]],
                &[owner.as_bytes(), channel.as_bytes(), payload.as_bytes()],
            )
            .await?;
        flag(operation, &v)
    }

    async fn claim_extend(
        &self,
        operation: &'static str,
        keys: &[String; 3],
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<bool> {
        let owner = owner.to_hex();
        let ttl = ms(ttl).to_string();
        let v = self
            .eval(
                operation,
                &self.scripts.extend,
                &[&keys[0], &keys[1]],
                &[owner.as_bytes(), ttl.as_bytes()],
            )
            .await?;
        flag(operation, &v)
    }
}

#[async_trait]
impl coord_core::Lock for RedisBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn try_acquire(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<Attempt> {
        self.claim_acquire("lock acquire", &self.keys.lock(name)?, owner, ttl)
            .await
    }

    async fn release(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        let wake = self.wake_args(Kind::Lock, name);
        self.claim_release("lock release", &self.keys.lock(name)?, owner, Some(wake))
            .await
    }

    async fn extend(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        self.claim_extend("lock extend", &self.keys.lock(name)?, owner, ttl)
            .await
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        let keys = self.keys.lock(name)?;
        let (channel, payload) = self.wake_args(Kind::Lock, name);
        let v = self
            .eval(
                "lock force release",
                &self.scripts.force_release,
                &[&keys[0], &keys[1]],
                &[channel.as_bytes(), payload.as_bytes()],
            )
            .await?;
        flag("lock force release", &v)
    }

    async fn subscribe(&self, name: &str) -> Result<Waiter> {
        Ok(self.wakeups.subscribe(&Keys::wake(Kind::Lock, name)))
    }
}

#[async_trait]
impl coord_core::Lease for RedisBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn grant(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<Attempt> {
        self.claim_acquire("lease grant", &self.keys.lease(name), owner, ttl)
            .await
    }

    async fn renew(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        self.claim_extend("lease renew", &self.keys.lease(name), owner, ttl)
            .await
    }

    async fn revoke(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        let wake = self.wake_args(Kind::Lease, name);
        self.claim_release("lease revoke", &self.keys.lease(name), owner, Some(wake))
            .await
    }

    async fn remaining(&self, name: &str) -> Result<Option<Duration>> {
        let [claim, _, _] = self.keys.lease(name);
        let mut cmd = redis::cmd("PTTL");
        cmd.arg(&claim);
        let v = self.cmd("lease remaining", cmd).await?;
        let pttl = int(&v).ok_or_else(|| unexpected("lease remaining", &v))?;
        Ok((pttl >= 0).then(|| Duration::from_millis(pttl as u64)))
    }
}

#[async_trait]
impl coord_core::FencingSource for RedisBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn next(&self, resource: &str) -> Result<FencingToken> {
        let counter = self.keys.fence(resource);
        let v = self
            .eval("fencing next", &self.scripts.fence_next, &[&counter], &[])
            .await?;
        match int(&v) {
            Some(t) if t > 0 => Ok(FencingToken(t as u64)),
            _ => Err(unexpected("fencing next", &v)),
        }
    }
}
