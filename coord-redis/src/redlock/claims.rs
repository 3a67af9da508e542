//! Quorum steps of a claim (lock, lease, a fencing source's issuing claim)
//! and the trait implementations built on them. See the module docs of
//! [`crate::redlock`] for the algorithm.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use coord_core::inspect::{ClaimRecord, HolderRecord};
use coord_core::wake::Waiter;
use coord_core::{Attempt, Capabilities, Error, FencingToken, OwnerToken, Result, async_trait};
use rand::Rng;

use super::{Answers, RedlockBackend};
use crate::backend::{BACKEND, ClaimKind, Step};
use crate::keys::Keys;

/// How long a fencing source's issuing claim lives (it is released at
/// once; the TTL only matters when its issuer dies between the two).
const FENCE_TTL: Duration = Duration::from_secs(2);

fn count<T>(a: &Answers<T>, f: impl Fn(&T) -> bool) -> usize {
    a.iter()
        .filter(|x| matches!(x, Some(Ok(v)) if f(v)))
        .count()
}

fn errors<T>(a: &Answers<T>) -> usize {
    a.iter().filter(|x| matches!(x, Some(Err(_)))).count()
}

fn answered<T>(a: &Answers<T>) -> usize {
    a.iter().filter(|x| matches!(x, Some(Ok(_)))).count()
}

impl RedlockBackend {
    /// One Redlock attempt (see the module docs).
    async fn quorum_acquire(
        &self,
        kind: ClaimKind,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
        meta: Option<&[u8]>,
    ) -> Result<Attempt> {
        let start = Instant::now();
        let (n, q) = (self.masters.len(), self.quorum);
        let op = kind.op(Step::Acquire);
        let (nm, ow, me) = (name.to_string(), *owner, meta.map(<[u8]>::to_vec));
        // The decision, for masters that answer after it: the quorum's
        // token and the masters already set to it.
        let (decided, decision) = tokio::sync::watch::channel(None::<(FencingToken, Vec<bool>)>);
        let answers = self
            .fan(
                op,
                None,
                true,
                move |i, b| {
                    let (nm, me, mut decision) = (nm.clone(), me.clone(), decision.clone());
                    Box::pin(async move {
                        let r = b.master_acquire(kind, &nm, &ow, ttl, me.as_deref()).await;
                        if let Ok(Attempt::Granted(mine)) = r {
                            tokio::spawn(async move {
                                // Ends when the attempt is decided, or
                                // given up (the sender is dropped).
                                let d = match decision.wait_for(Option::is_some).await {
                                    Ok(d) => d.clone(),
                                    Err(_) => return,
                                };
                                let Some((token, set)) = d else {
                                    return;
                                };
                                if !set[i] && mine != token {
                                    let _ = b.master_raise(kind, &nm, &ow, token).await;
                                }
                            });
                        }
                        r
                    })
                },
                |a| {
                    let granted = count(a, |x| matches!(x, Attempt::Granted(_)));
                    let refused = count(a, |x| matches!(x, Attempt::Held { .. }));
                    granted >= q || refused + errors(a) > n - q
                },
            )
            .await;
        let granted_on: Vec<bool> = answers
            .iter()
            .map(|a| matches!(a, Some(Ok(Attempt::Granted(_)))))
            .collect();
        let tokens: Vec<FencingToken> = answers
            .iter()
            .filter_map(|a| match a {
                Some(Ok(Attempt::Granted(t))) => Some(*t),
                _ => None,
            })
            .collect();
        if tokens.len() >= q {
            let token = tokens.iter().copied().max().unwrap_or(FencingToken(0));
            let asked = tokens.len();
            let (nm, ow) = (name.to_string(), *owner);
            let raised = self
                .fan(
                    kind.op(Step::Raise),
                    Some(&granted_on),
                    false,
                    move |_, b| {
                        let nm = nm.clone();
                        Box::pin(async move { b.master_raise(kind, &nm, &ow, token).await })
                    },
                    |a| {
                        let yes = count(a, |x| *x);
                        yes >= q || count(a, |x| !*x) + errors(a) > asked - q
                    },
                )
                .await;
            let valid_for = ttl.saturating_sub(coord_core::drift(ttl));
            if count(&raised, |x| *x) >= q && start.elapsed() < valid_for {
                let _ = decided.send(Some((token, granted_on)));
                return Ok(Attempt::Granted(token));
            }
        }
        // Not granted: undo it on every master that granted it, before
        // returning (so the next attempt cannot race the undo). Masters
        // that had not answered keep a late grant, if any, for this owner:
        // it counts for this owner's next attempt, and ends with its
        // release or TTL.
        if tokens.iter().len() > 0 {
            self.release_on(kind, name, owner, Some(&granted_on)).await;
        }
        let holders: Vec<Option<Duration>> = answers
            .iter()
            .filter_map(|a| match a {
                Some(Ok(Attempt::Held { expires_in })) => Some(*expires_in),
                _ => None,
            })
            .collect();
        if tokens.len() + holders.len() < self.quorum {
            // Fewer than a quorum answered at all: not a refusal.
            return Err(self.no_quorum(op, &answers));
        }
        if !tokens.is_empty() {
            // A split vote, or a grant that came too late: try again after
            // a random delay, so that racing clients drift apart.
            let floor = Duration::from_millis(2);
            let spread = (start.elapsed() * 2).max(floor).min((ttl / 4).max(floor));
            let jitter = rand::rng().random_range(Duration::from_millis(1)..=spread);
            return Ok(Attempt::Held {
                expires_in: Some(jitter),
            });
        }
        let expires_in = holders
            .iter()
            .copied()
            .collect::<Option<Vec<Duration>>>()
            .and_then(|v| v.into_iter().min());
        Ok(Attempt::Held { expires_in })
    }

    /// Release on the masters marked in `only` (or all): waiting for every
    /// one asked when undoing an attempt (so the next attempt cannot race
    /// the undo), else until a quorum released (a master that does not
    /// answer then costs the caller nothing; its release goes on in the
    /// background). Returns the answers.
    async fn release_on(
        &self,
        kind: ClaimKind,
        name: &str,
        owner: &OwnerToken,
        only: Option<&[bool]>,
    ) -> Answers<bool> {
        let (nm, ow) = (name.to_string(), *owner);
        let (undo, q) = (only.is_some(), self.quorum);
        self.fan(
            kind.op(Step::Release),
            only,
            false,
            move |_, b| {
                let nm = nm.clone();
                Box::pin(async move { b.master_release(kind, &nm, &ow).await })
            },
            move |a| !undo && count(a, |x| *x) >= q,
        )
        .await
    }

    /// Release on every master: `true` if any master released it (the
    /// claim was this owner's there), `false` if a quorum answered and
    /// none did.
    async fn quorum_release(
        &self,
        kind: ClaimKind,
        name: &str,
        owner: &OwnerToken,
    ) -> Result<bool> {
        let answers = self.release_on(kind, name, owner, None).await;
        if count(&answers, |x| *x) > 0 {
            return Ok(true);
        }
        if answered(&answers) >= self.quorum {
            return Ok(false);
        }
        Err(self.no_quorum(kind.op(Step::Release), &answers))
    }

    /// Extend on every master: `true` once a quorum extended.
    async fn quorum_extend(
        &self,
        kind: ClaimKind,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<bool> {
        let (n, q) = (self.masters.len(), self.quorum);
        let (nm, ow) = (name.to_string(), *owner);
        let answers = self
            .fan(
                kind.op(Step::Extend),
                None,
                false,
                move |_, b| {
                    let nm = nm.clone();
                    Box::pin(async move { b.master_extend(kind, &nm, &ow, ttl).await })
                },
                |a| count(a, |x| *x) >= q || count(a, |x| !*x) + errors(a) > n - q,
            )
            .await;
        if count(&answers, |x| *x) >= q {
            return Ok(true);
        }
        if answered(&answers) >= q {
            return Ok(false);
        }
        Err(self.no_quorum(kind.op(Step::Extend), &answers))
    }

    /// The holder a quorum of masters agrees on (every master asked).
    async fn quorum_inspect(&self, kind: ClaimKind, name: &str) -> Result<ClaimRecord> {
        let nm = name.to_string();
        let answers = self
            .fan(
                kind.op(Step::Inspect),
                None,
                false,
                move |_, b| {
                    let nm = nm.clone();
                    Box::pin(async move { b.master_inspect(kind, &nm).await })
                },
                |_| false,
            )
            .await;
        if answered(&answers) < self.quorum {
            return Err(self.no_quorum(kind.op(Step::Inspect), &answers));
        }
        let mut by_owner: HashMap<OwnerToken, Vec<HolderRecord>> = HashMap::new();
        for record in answers.into_iter().flatten().flatten() {
            for h in record.holders {
                by_owner.entry(h.owner).or_default().push(h);
            }
        }
        let holders = by_owner
            .into_values()
            .filter(|v| v.len() >= self.quorum)
            .map(|mut v| {
                // Held while a quorum holds it: until the q-th longest
                // remaining time runs out.
                v.sort_by_key(|h| std::cmp::Reverse(h.remaining));
                let remaining = v[self.quorum - 1].remaining;
                // The grant's token is the one its masters were set to:
                // the token most of them hold (a master set late may
                // still show its own for a moment).
                let token = v
                    .iter()
                    .map(|h| (v.iter().filter(|o| o.token == h.token).count(), h.token))
                    .max()
                    .map_or(FencingToken(0), |(_, t)| t);
                let mut h = v.swap_remove(0);
                h.remaining = remaining;
                h.token = token;
                h
            })
            .collect();
        Ok(ClaimRecord {
            holders,
            waiters: None,
        })
    }

    /// Remove the claim on every master, whoever holds it.
    async fn quorum_force_release(&self, kind: ClaimKind, name: &str) -> Result<bool> {
        let nm = name.to_string();
        let answers = self
            .fan(
                kind.op(Step::Force),
                None,
                false,
                move |_, b| {
                    let nm = nm.clone();
                    Box::pin(async move { b.master_force_release(kind, &nm).await })
                },
                |_| false,
            )
            .await;
        if count(&answers, |x| *x) > 0 {
            return Ok(true);
        }
        if answered(&answers) >= self.quorum {
            return Ok(false);
        }
        Err(self.no_quorum(kind.op(Step::Force), &answers))
    }

    fn subscribe_kind(&self, kind: ClaimKind, name: &str) -> Waiter {
        self.wakeups.subscribe(&Keys::wake(kind.kind(), name))
    }
}

#[async_trait]
impl coord_core::Lock for RedlockBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn try_acquire(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<Attempt> {
        self.quorum_acquire(ClaimKind::Lock, name, owner, ttl, None)
            .await
    }

    async fn release(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        self.quorum_release(ClaimKind::Lock, name, owner).await
    }

    async fn extend(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        self.quorum_extend(ClaimKind::Lock, name, owner, ttl).await
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        self.quorum_force_release(ClaimKind::Lock, name).await
    }

    async fn subscribe(&self, name: &str) -> Result<Waiter> {
        Ok(self.subscribe_kind(ClaimKind::Lock, name))
    }

    async fn try_acquire_with_metadata(
        &self,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
        metadata: &[u8],
    ) -> Result<Attempt> {
        self.quorum_acquire(ClaimKind::Lock, name, owner, ttl, Some(metadata))
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

    async fn grant(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<Attempt> {
        self.quorum_acquire(ClaimKind::Lease, name, owner, ttl, None)
            .await
    }

    async fn renew(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        self.quorum_extend(ClaimKind::Lease, name, owner, ttl).await
    }

    async fn revoke(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        self.quorum_release(ClaimKind::Lease, name, owner).await
    }

    async fn remaining(&self, name: &str) -> Result<Option<Duration>> {
        let record = self.quorum_inspect(ClaimKind::Lease, name).await?;
        Ok(record.holders.first().and_then(|h| h.remaining))
    }

    async fn grant_with_metadata(
        &self,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
        metadata: &[u8],
    ) -> Result<Attempt> {
        self.quorum_acquire(ClaimKind::Lease, name, owner, ttl, Some(metadata))
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
        let op = ClaimKind::Fence.op(Step::Acquire);
        let deadline = Instant::now() + self.timeout * 2;
        let owner = OwnerToken::random();
        let waiter = self.subscribe_kind(ClaimKind::Fence, resource);
        let mut last = None;
        loop {
            let notified = waiter.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let sleep = match self
                .quorum_acquire(ClaimKind::Fence, resource, &owner, FENCE_TTL, None)
                .await
            {
                Ok(Attempt::Granted(token)) => {
                    if let Err(e) = self
                        .quorum_release(ClaimKind::Fence, resource, &owner)
                        .await
                    {
                        tracing::debug!(error = %e, "fencing next: the issuing claim ends with its TTL");
                    }
                    return Ok(token);
                }
                Ok(Attempt::Held { expires_in }) => expires_in
                    .unwrap_or(Duration::from_millis(50))
                    .min(Duration::from_millis(50)),
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
            tokio::select! {
                _ = &mut notified => {}
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
        }))
    }
}
