//! Semaphores: FIFO grants of permits, a request granted only if it and
//! every request queued ahead of it fit.

use super::*;
use coord_core::Step;

/// The wake-up key of one owner's waiting acquire on a semaphore. Names
/// hold no control characters, so the NUL cannot be part of one.
pub(crate) fn waiter_key(name: &str, owner: &OwnerToken) -> String {
    let mut k = String::with_capacity(name.len() + 33);
    k.push_str(name);
    k.push('\0');
    k.push_str(&owner.to_hex());
    k
}

/// Semaphores in memory: FIFO. A request is granted only if it and every
/// request queued ahead of it fit into the free permits together, so a
/// request for `n` permits at the head is never overtaken by smaller later
/// ones; a single attempt (`queue: false`) counts the whole queue as ahead
/// of it and leaves nothing behind. Released permits wake exactly the
/// queued waiters that can now be granted. `permits_total` binds while the
/// name has live holders or queued waiters.
#[async_trait]
impl coord_core::Semaphore for MemoryBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn fifo(&self) -> bool {
        true
    }

    async fn try_acquire(&self, name: &str, step: Step, req: &PermitRequest) -> Result<Attempt> {
        let owner = &step.owner;
        self.sem_attempt(name, owner, req, None)
    }

    async fn try_acquire_with_metadata(
        &self,
        name: &str,
        step: Step,
        req: &PermitRequest,
        metadata: &[u8],
    ) -> Result<Attempt> {
        let owner = &step.owner;
        self.sem_attempt(name, owner, req, Some(metadata))
    }

    async fn inspect(&self, name: &str) -> Result<ClaimRecord> {
        let now = Instant::now();
        let shard = self.semaphores.shard(name);
        let Some(s) = shard.map.get(name) else {
            return Ok(ClaimRecord {
                holders: Vec::new(),
                waiters: Some(0),
            });
        };
        let mut holders: Vec<HolderRecord> = s
            .holders
            .iter()
            .filter(|h| h.expires > now)
            .map(|h| HolderRecord {
                owner: h.owner,
                token: FencingToken(h.token),
                remaining: Some(h.expires - now),
                metadata: h.meta.as_ref().map(|m| m.to_vec()),
                permits: h.permits,
            })
            .collect();
        holders.sort_by_key(|h| h.token);
        let waiters = s.queue.iter().filter(|w| w.expires > now).count() as u64;
        Ok(ClaimRecord {
            holders,
            waiters: Some(waiters),
        })
    }

    async fn release(&self, name: &str, step: Step) -> Result<bool> {
        let owner = &step.owner;
        let now = Instant::now();
        let (released, wake) = {
            let mut shard = self.semaphores.shard(name);
            let Some(s) = shard.map.get_mut(name) else {
                return Ok(false);
            };
            let live = s
                .holders
                .iter()
                .position(|h| h.owner == *owner && h.expires > now);
            if let Some(i) = live {
                s.holders.swap_remove(i);
            }
            s.queue.retain(|w| w.owner != *owner);
            s.prune(now);
            (live.is_some(), s.grantable())
        };
        self.wake_grantable(name, wake);
        Ok(released)
    }

    async fn extend(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        let owner = &step.owner;
        let now = Instant::now();
        let mut shard = self.semaphores.shard(name);
        let Some(s) = shard.map.get_mut(name) else {
            return Ok(false);
        };
        match s
            .holders
            .iter_mut()
            .find(|h| h.owner == *owner && h.expires > now)
        {
            Some(h) => {
                h.expires = now + ttl;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        let now = Instant::now();
        let (removed, wake) = {
            let mut shard = self.semaphores.shard(name);
            let Some(s) = shard.map.get_mut(name) else {
                return Ok(false);
            };
            let removed = s.holders.iter().any(|h| h.expires > now);
            s.holders.clear();
            s.prune(now);
            (removed, s.grantable())
        };
        self.wake_grantable(name, wake);
        Ok(removed)
    }

    async fn subscribe(&self, name: &str, owner: &OwnerToken) -> Result<Waiter> {
        Ok(self.semaphore_wakeups.subscribe(&waiter_key(name, owner)))
    }
}

impl MemoryBackend {
    /// One semaphore attempt, storing `meta` with a new grant.
    fn sem_attempt(
        &self,
        name: &str,
        owner: &OwnerToken,
        req: &PermitRequest,
        meta: Option<&[u8]>,
    ) -> Result<Attempt> {
        let now = Instant::now();
        let (attempt, wake) = {
            let mut shard = self.semaphores.shard(name);
            let s = shard.entry(
                name,
                || Sem {
                    total: req.total,
                    holders: Vec::new(),
                    queue: VecDeque::new(),
                },
                |s| s.idle(now),
            );
            s.prune(now);
            if s.holders.is_empty() && s.queue.is_empty() {
                s.total = req.total;
            } else if s.total != req.total {
                return Err(Error::invalid(
                    "permits_total",
                    format!(
                        "is {}, but the semaphore is in use with permits_total {}; \
                         the total binds while the name has holders or waiters",
                        req.total, s.total
                    ),
                ));
            }
            if let Some(h) = s.holders.iter_mut().find(|h| h.owner == *owner) {
                // A retry of a grant whose reply was lost: the same grant.
                h.expires = now + req.ttl;
                return Ok(Attempt::Granted(FencingToken(h.token)));
            }
            let pos = s.queue.iter().position(|w| w.owner == *owner);
            let ahead = s
                .queue
                .iter()
                .take(pos.unwrap_or(s.queue.len()))
                .fold(0u32, |a, w| a.saturating_add(w.permits));
            let attempt = if coord_core::permits::admits(s.free(), ahead, req.permits) {
                if let Some(i) = pos {
                    s.queue.remove(i);
                }
                let token = self.next_token();
                s.holders.push(SemHolder {
                    owner: *owner,
                    permits: req.permits,
                    token,
                    expires: now + req.ttl,
                    meta: meta.map(Arc::from),
                });
                Attempt::Granted(FencingToken(token))
            } else {
                let mut until = now + QUEUE_REFRESH;
                for h in &s.holders {
                    until = until.min(h.expires);
                }
                if req.queue {
                    match pos {
                        Some(i) => s.queue[i].expires = now + QUEUE_ENTRY_TTL,
                        None => s.queue.push_back(SemWaiter {
                            owner: *owner,
                            permits: req.permits,
                            expires: now + QUEUE_ENTRY_TTL,
                        }),
                    }
                }
                for w in s.queue.iter().take(pos.unwrap_or(s.queue.len())) {
                    until = until.min(w.expires);
                }
                Attempt::Held {
                    expires_in: Some(until - now),
                }
            };
            // Pruning may have freed permits for waiters queued elsewhere.
            (attempt, s.grantable())
        };
        self.wake_grantable(name, wake);
        Ok(attempt)
    }
}
