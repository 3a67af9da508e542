//! Locks, leases and fencing sources: claims with a fencing token.

use std::time::Duration;

use coord_core::util::Kind;
use coord_core::wake::Waiter;
use coord_core::{Attempt, Capabilities, FencingToken, OwnerToken, Result, async_trait};

use super::{RedisBackend, attempt, flag, int, ms, unexpected};
use crate::keys::{ClaimKeys, Keys, Layout};

impl RedisBackend {
    /// Run `one` on a default-layout claim, or `seed` on a seed-layout
    /// claim's key and grant key (release, extend, force release).
    async fn claim_eval(
        &self,
        operation: &'static str,
        keys: &ClaimKeys,
        (one, seed): (&redis::Script, &redis::Script),
        args: &[&[u8]],
    ) -> Result<redis::Value> {
        match keys {
            ClaimKeys::One(claim) => self.eval(operation, one, &[claim], args).await,
            ClaimKeys::Seed(k) => self.eval(operation, seed, &[&k[0], &k[1]], args).await,
        }
    }

    async fn claim_acquire(
        &self,
        operation: &'static str,
        keys: &ClaimKeys,
        wake: &str,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Attempt> {
        let owner = owner.to_hex();
        let ttl = ms(ttl).to_string();
        let v = match keys {
            ClaimKeys::One(claim) => {
                // Mark the claim when somebody here waits for it, so its
                // release publishes a wake-up (and only then). '2': two or
                // more wait here, so even a grant (to one of them, maybe)
                // leaves somebody waiting: the new claim is marked too.
                let waiting = self.wakeups.waiter_count(wake);
                let flag: &[u8] = match waiting {
                    0 => b"0",
                    1 => b"1",
                    _ => b"2",
                };
                self.eval(
                    operation,
                    &self.scripts.acquire,
                    &[claim],
                    &[owner.as_bytes(), ttl.as_bytes(), flag],
                )
                .await?
            }
            ClaimKeys::Seed(k) => {
                self.eval(
                    operation,
                    &self.scripts.seed_acquire,
                    &[&k[0], &k[1], &k[2]],
                    &[owner.as_bytes(), ttl.as_bytes()],
                )
                .await?
            }
        };
        attempt(operation, &v)
    }

    async fn claim_release(
        &self,
        operation: &'static str,
        keys: &ClaimKeys,
        owner: &OwnerToken,
        (channel, payload): (String, String),
    ) -> Result<bool> {
        let owner = owner.to_hex();
        let args = [owner.as_bytes(), channel.as_bytes(), payload.as_bytes()];
        let scripts = (&self.scripts.release, &self.scripts.seed_release);
        let v = self.claim_eval(operation, keys, scripts, &args).await?;
        flag(operation, &v)
    }

    async fn claim_extend(
        &self,
        operation: &'static str,
        keys: &ClaimKeys,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<bool> {
        let owner = owner.to_hex();
        let ttl = ms(ttl).to_string();
        let args = [owner.as_bytes(), ttl.as_bytes()];
        let scripts = (&self.scripts.extend, &self.scripts.seed_extend);
        let v = self.claim_eval(operation, keys, scripts, &args).await?;
        flag(operation, &v)
    }
}

#[async_trait]
impl coord_core::Lock for RedisBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn try_acquire(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<Attempt> {
        let wake = Keys::wake(Kind::Lock, name);
        let keys = self.keys.lock(name)?;
        self.claim_acquire("lock acquire", &keys, &wake, owner, ttl)
            .await
    }

    async fn release(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        let wake = self.wake_args(Kind::Lock, name);
        self.claim_release("lock release", &self.keys.lock(name)?, owner, wake)
            .await
    }

    async fn extend(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        self.claim_extend("lock extend", &self.keys.lock(name)?, owner, ttl)
            .await
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        let (channel, payload) = self.wake_args(Kind::Lock, name);
        let args = [channel.as_bytes(), payload.as_bytes()];
        let op = "lock force release";
        let scripts = (
            &self.scripts.force_release,
            &self.scripts.seed_force_release,
        );
        let v = self
            .claim_eval(op, &self.keys.lock(name)?, scripts, &args)
            .await?;
        flag(op, &v)
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
        let wake = Keys::wake(Kind::Lease, name);
        self.claim_acquire("lease grant", &self.keys.lease(name), &wake, owner, ttl)
            .await
    }

    async fn renew(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        self.claim_extend("lease renew", &self.keys.lease(name), owner, ttl)
            .await
    }

    async fn revoke(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        let wake = self.wake_args(Kind::Lease, name);
        self.claim_release("lease revoke", &self.keys.lease(name), owner, wake)
            .await
    }

    async fn remaining(&self, name: &str) -> Result<Option<Duration>> {
        let keys = self.keys.lease(name);
        let v = self
            .eval(
                "lease remaining",
                &self.scripts.remaining,
                &[keys.claim()],
                &[],
            )
            .await?;
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
        let grace = match self.keys.layout {
            Layout::Coord => self.idle_grace_ms.clone(),
            Layout::Seed => String::new(),
        };
        let v = self
            .eval(
                "fencing next",
                &self.scripts.fence_next,
                &[&counter],
                &[grace.as_bytes()],
            )
            .await?;
        match int(&v) {
            Some(t) if t > 0 => Ok(FencingToken(t as u64)),
            _ => Err(unexpected("fencing next", &v)),
        }
    }
}
