//! The trait implementations of a Redlock quorum: locks, leases and
//! fencing sources, each step one of the quorum steps of `claims`.

use std::time::{Duration, Instant};

use coord_core::inspect::ClaimRecord;
use coord_core::wake::Waiter;
use coord_core::{
    Attempt, Capabilities, Error, FencingToken, OwnerToken, Result, Step, async_trait,
};

use futures::FutureExt;
use rand::Rng;

use super::RedlockBackend;
use crate::backend::{BACKEND, ClaimKind, Op};

/// How long a fencing source's issuing claim lives (it is released at
/// once; the TTL only matters when its issuer dies between the two).
const FENCE_TTL: Duration = Duration::from_secs(2);

#[async_trait]
impl coord_core::Lock for RedlockBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn try_acquire(&self, name: &str, step: Step, ttl: Duration) -> Result<Attempt> {
        self.quorum_acquire(ClaimKind::Lock, name, step, ttl, None)
            .await
    }

    async fn release(&self, name: &str, step: Step) -> Result<bool> {
        self.quorum_release(ClaimKind::Lock, name, step).await
    }

    async fn extend(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        self.quorum_extend(ClaimKind::Lock, name, step, ttl).await
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        self.quorum_force_release(ClaimKind::Lock, name).await
    }

    async fn subscribe(&self, name: &str, _owner: &OwnerToken) -> Result<Waiter> {
        Ok(self.subscribe_kind(ClaimKind::Lock, name))
    }

    async fn try_acquire_with_metadata(
        &self,
        name: &str,
        step: Step,
        ttl: Duration,
        metadata: &[u8],
    ) -> Result<Attempt> {
        self.quorum_acquire(ClaimKind::Lock, name, step, ttl, Some(metadata))
            .await
    }

    async fn inspect(&self, name: &str) -> Result<ClaimRecord> {
        self.quorum_inspect(ClaimKind::Lock, name).await
    }
}

#[async_trait]
impl coord_core::Lease for RedlockBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn grant(&self, name: &str, step: Step, ttl: Duration) -> Result<Attempt> {
        self.quorum_acquire(ClaimKind::Lease, name, step, ttl, None)
            .await
    }

    async fn renew(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        self.quorum_extend(ClaimKind::Lease, name, step, ttl).await
    }

    async fn revoke(&self, name: &str, step: Step) -> Result<bool> {
        self.quorum_release(ClaimKind::Lease, name, step).await
    }

    async fn remaining(&self, name: &str) -> Result<Option<Duration>> {
        let record = self.quorum_inspect(ClaimKind::Lease, name).await?;
        Ok(record.holders.first().and_then(|h| h.remaining))
    }

    async fn grant_with_metadata(
        &self,
        name: &str,
        step: Step,
        ttl: Duration,
        metadata: &[u8],
    ) -> Result<Attempt> {
        self.quorum_acquire(ClaimKind::Lease, name, step, ttl, Some(metadata))
            .await
    }

    async fn inspect(&self, name: &str) -> Result<ClaimRecord> {
        self.quorum_inspect(ClaimKind::Lease, name).await
    }
}

#[async_trait]
impl coord_core::FencingSource for RedlockBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// The token of a short claim on the resource's fencing key, released
    /// at once: claims of one resource exclude each other, so its tokens
    /// are issued one at a time (see the module docs for what that rests
    /// on). Waits for the claim within twice the call timeout.
    async fn next(&self, resource: &str) -> Result<FencingToken> {
        let op = ClaimKind::Fence.op(Op::Acquire);
        let started = Instant::now();
        let deadline = started + self.timeout * 2;
        // This client just released the issuing claim while others asked
        // for it: they learn of the release only now, one message later,
        // and would lose to this one every time it asked again at once (one
        // client could then wait for every other one's run of tokens). Let
        // them go first.
        if let Some(pause) = self.after_issuing(resource) {
            tokio::time::sleep(pause).await;
        }
        let owner = OwnerToken::random();
        let waiter = self.subscribe_kind(ClaimKind::Fence, resource);
        let mut last = None;
        let mut lost = false;
        loop {
            let notified = waiter.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let asked = Instant::now();
            let sleep = match self
                .quorum_acquire(ClaimKind::Fence, resource, owner.step(), FENCE_TTL, None)
                .await
            {
                Ok(Attempt::Granted(token)) => {
                    if let Err(e) = self
                        .quorum_release(ClaimKind::Fence, resource, owner.step())
                        .await
                    {
                        tracing::debug!(error = %e, "fencing next: the issuing claim ends with its TTL");
                    }
                    // Other clients asked meanwhile: it lost an attempt,
                    // was woken, or heard a release or undo of theirs.
                    let contended = lost || (&mut notified).now_or_never().is_some();
                    self.issued(resource, contended.then(|| started.elapsed()));
                    return Ok(token);
                }
                Ok(Attempt::Held { expires_in }) => {
                    lost = true;
                    expires_in
                        .unwrap_or(Duration::from_millis(50))
                        .min(Duration::from_millis(50))
                }
                Err(e) if e.is_retryable() => {
                    last = Some(e);
                    Duration::from_millis(20)
                }
                Err(e) => return Err(e),
            };
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let until = tokio::time::Instant::from_std((now + sleep).min(deadline));
            let took = asked.elapsed();
            tokio::select! {
                _ = &mut notified => {
                    // Every waiting client heard the same release: spread
                    // their next attempts over about one attempt's time,
                    // or they split the quorum's votes between them.
                    let spread = rand::rng().random_range(Duration::ZERO..=took);
                    tokio::time::sleep(spread.min(deadline.saturating_duration_since(Instant::now()))).await;
                }
                _ = tokio::time::sleep_until(until) => {}
            }
        }
        Err(last.unwrap_or_else(|| Error::Unavailable {
            backend: BACKEND,
            operation: op,
            message: format!(
                "the issuing claim of `{resource}` stayed taken for {:?}",
                self.timeout * 2
            ),
            source: None,
        }))
    }
}

impl RedlockBackend {
    /// How long to wait before asking for `resource`'s issuing claim: a
    /// random share of what issuing took last, if this client released
    /// that claim within twice that time while other clients asked for it;
    /// else nothing.
    fn after_issuing(&self, resource: &str) -> Option<Duration> {
        let issued = self.issued.lock().unwrap_or_else(|e| e.into_inner());
        let (at, took) = *issued.get(resource)?;
        if at.elapsed() >= took * 2 || took.is_zero() {
            return None;
        }
        Some(rand::rng().random_range(Duration::ZERO..=took))
    }

    /// Note that this client released `resource`'s issuing claim now, after
    /// issuing for `took` while other clients asked for it (`None`: nobody
    /// else asked, and the next call goes at once); entries of a second ago
    /// and more go.
    fn issued(&self, resource: &str, took: Option<Duration>) {
        let mut issued = self.issued.lock().unwrap_or_else(|e| e.into_inner());
        let Some(took) = took else {
            issued.remove(resource);
            return;
        };
        let now = Instant::now();
        if issued.len() >= 64 {
            issued.retain(|_, (at, _)| now.duration_since(*at) < Duration::from_secs(1));
        }
        issued.insert(resource.to_string(), (now, took));
    }
}
