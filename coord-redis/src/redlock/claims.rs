//! Quorum steps of a claim (lock, lease, a fencing source's issuing
//! claim), which the trait implementations (`traits`) are built on. See
//! the module docs of [`crate::redlock`] for the algorithm.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::RwLock;

use coord_core::inspect::{ClaimRecord, HolderRecord};
use coord_core::wake::Waiter;
use coord_core::{Attempt, Error, FencingToken, OwnerToken, Result, Step};
use rand::Rng;

use super::tally::{
    answered, attempt_decided, count, errors, extend_decided, extend_outcome, granted_tokens,
    quorum_token, settled,
};
use super::{Answers, RedlockBackend};
use crate::backend::{BACKEND, ClaimKind, Op};
use crate::keys::Keys;

/// The pause before a failed release is sent again.
const RELEASE_RETRY: Duration = Duration::from_millis(50);

/// How an attempt was decided, for the masters that answer after it.
#[derive(Clone)]
enum Decision {
    /// Granted with this token; the masters already set to it.
    Granted(FencingToken, Vec<bool>),
    /// Not granted; the masters already undone.
    Refused(Vec<bool>),
}

impl RedlockBackend {
    /// The gate of one owner's attempts on one claim (see
    /// `quorum_acquire`).
    pub(super) fn gate(&self, kind: ClaimKind, name: &str, owner: &OwnerToken) -> Arc<RwLock<()>> {
        let mut gates = self.gates.lock().unwrap_or_else(|e| e.into_inner());
        gates.retain(|_, g| g.strong_count() > 0);
        let key = (kind, name.to_string(), *owner);
        if let Some(g) = gates.get(&key).and_then(Weak::upgrade) {
            return g;
        }
        let g = Arc::new(RwLock::new(()));
        gates.insert(key, Arc::downgrade(&g));
        g
    }

    /// One Redlock attempt (see the module docs).
    pub(super) async fn quorum_acquire(
        &self,
        kind: ClaimKind,
        name: &str,
        step: Step,
        ttl: Duration,
        meta: Option<&[u8]>,
    ) -> Result<Attempt> {
        let owner = &step.owner;
        let start = Instant::now();
        let (n, q) = (self.masters.len(), self.quorum);
        let op = kind.op(Op::Acquire);
        let (nm, ow, me) = (name.to_string(), *owner, meta.map(<[u8]>::to_vec));
        // This owner's earlier attempt may still have a master out (a late
        // answer, then its undo): wait for it, so that undo cannot land
        // after this attempt's grant there. Each master's call of this
        // attempt holds a read guard until it is done with the claim.
        let gate = self.gate(kind, name, owner);
        drop(gate.clone().write_owned().await);
        // The owner wants the claim again (the raw trait allows an attempt
        // after a release that found nothing): forget its release.
        self.released
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(kind, name.to_string(), *owner));
        let mut guards = Vec::with_capacity(n);
        for _ in 0..n {
            guards.push(Some(gate.clone().read_owned().await));
        }
        let guards = Arc::new(Mutex::new(guards));
        // Which masters answered with a grant this owner held there already.
        let again = Arc::new(Mutex::new(vec![false; n]));
        let seen = again.clone();
        // The decision, for masters that answer after it.
        let released = self.released.clone();
        let (decided, decision) = tokio::sync::watch::channel(None::<Decision>);
        let answers = self
            .fan(
                op,
                None,
                true,
                move |i, b| {
                    let (nm, me, mut decision) = (nm.clone(), me.clone(), decision.clone());
                    let (released, again) = (released.clone(), again.clone());
                    let guard = guards.lock().unwrap_or_else(|e| e.into_inner())[i].take();
                    Box::pin(async move {
                        let r = b.master_acquire(kind, &nm, step, ttl, me.as_deref()).await;
                        // This owner held the claim here before this
                        // attempt: not this attempt's grant to undo.
                        let held = matches!(&r, Ok((_, true)));
                        let r = r.map(|(a, held)| {
                            again.lock().unwrap_or_else(|e| e.into_inner())[i] = held;
                            a
                        });
                        if matches!(&r, Err(e) if e.is_retryable()) {
                            // Timed out or cut off: the attempt may have
                            // been granted there, or may be still. Unless
                            // the claim is granted, release it there once
                            // decided: the owner's attempt went unanswered,
                            // so the release leaves a mark that refuses a
                            // copy landing later.
                            tokio::spawn(async move {
                                let _guard = guard;
                                let d = match decision.wait_for(Option::is_some).await {
                                    Ok(d) => d.clone(),
                                    Err(_) => None,
                                };
                                if !matches!(d, Some(Decision::Granted(..))) {
                                    let _ = b.master_release(kind, &nm, ow).await;
                                }
                            });
                            return r;
                        }
                        let Ok(Attempt::Granted(mine)) = r else {
                            return r;
                        };
                        // Released by its owner before this grant came
                        // back (the attempt was dropped or given up): that
                        // release reached this master first, so undo the
                        // grant here, after it, in order.
                        let gone = released
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .contains_key(&(kind, nm.clone(), ow));
                        if gone {
                            let _ = b.master_release(kind, &nm, ow).await;
                            return Ok(Attempt::Held { expires_in: None });
                        }
                        tokio::spawn(async move {
                            let _guard = guard;
                            // Ends when the attempt is decided; the sender
                            // dropped undecided means it was given up.
                            let d = match decision.wait_for(Option::is_some).await {
                                Ok(d) => d.clone(),
                                Err(_) => None,
                            };
                            match d {
                                Some(Decision::Granted(token, set)) => {
                                    if !set[i] && mine != token {
                                        let _ = b.master_raise(kind, &nm, &ow, token).await;
                                    }
                                }
                                Some(Decision::Refused(undone)) if undone[i] => {}
                                // Not granted, but held here before: the
                                // claim stays its owner's (a guard of it
                                // elsewhere still counts on it; after a
                                // lost reply the core releases it).
                                _ if held => {}
                                // Not granted (or given up): this late
                                // grant is undone here, in order after it.
                                _ => {
                                    let _ = b.master_release(kind, &nm, ow).await;
                                }
                            }
                        });
                        r
                    })
                },
                |a| {
                    let again = seen.lock().unwrap_or_else(|e| e.into_inner());
                    attempt_decided(a, &again, n, q)
                },
            )
            .await;
        let granted_on: Vec<bool> = answers
            .iter()
            .map(|a| matches!(a, Some(Ok(Attempt::Granted(_)))))
            .collect();
        let tokens = granted_tokens(&answers);
        if tokens.len() >= q {
            let token = quorum_token(&tokens, q);
            let asked = tokens.len();
            let (nm, ow) = (name.to_string(), *owner);
            let raised = self
                .fan(
                    kind.op(Op::Raise),
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
                let _ = decided.send(Some(Decision::Granted(token, granted_on)));
                return Ok(Attempt::Granted(token));
            }
        }
        // Not granted: undo it on every master that granted it anew (one
        // that answered that this owner held it already keeps it: see the
        // call's task), before returning. A master that answers later
        // undoes its own grant (in its call's task, after the grant), and
        // this owner's next attempt waits for that.
        let undo: Vec<bool> = {
            let again = seen.lock().unwrap_or_else(|e| e.into_inner());
            granted_on
                .iter()
                .zip(again.iter())
                .map(|(g, a)| *g && !*a)
                .collect()
        };
        if undo.iter().any(|u| *u) {
            self.release_on(kind, name, *owner, Some(&undo)).await;
        }
        let _ = decided.send(Some(Decision::Refused(undo)));
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
    pub(super) async fn release_on(
        &self,
        kind: ClaimKind,
        name: &str,
        owner: OwnerToken,
        only: Option<&[bool]>,
    ) -> Answers<bool> {
        let nm = name.to_string();
        let (undo, q) = (only.is_some(), self.quorum);
        // Every master is asked, one skipped as slow too (the claim may be
        // there, and where this owner has an attempt unanswered the release
        // leaves the mark a late copy of that attempt meets), and the
        // release lingers for the masters still out once a quorum
        // released: a release answered early left the owner's claim on a
        // slow master, where a stale release of the same owner through
        // another client then found it and reported true (CI, the
        // conformance case lock_same_owner_through_another_client_gets_no_other_token).
        self.fan_if(
            kind.op(Op::Release),
            only,
            true,
            true,
            move |_, b| {
                let nm = nm.clone();
                Box::pin(async move { b.master_release(kind, &nm, owner).await })
            },
            move |a| !undo && count(a, |x| *x) >= q,
        )
        .await
    }

    /// Release on every master, asking again (within the call timeout)
    /// the masters whose release failed: `Ok(true)` once released on a
    /// quorum (only for the first such release of an owner); `Ok(false)`
    /// when too many masters said they did not hold it for a quorum to
    /// have held it (a claim left on the others is released there too);
    /// [`Error::Unavailable`] when masters that did not answer may still
    /// hold it (it then ends with its TTL there).
    pub(super) async fn quorum_release(
        &self,
        kind: ClaimKind,
        name: &str,
        step: Step,
    ) -> Result<bool> {
        let owner = &step.owner;
        // Each master's part of this owner's calls runs to its end in a
        // task of its own, whatever becomes of the caller, so each master's
        // book (`master_book`) knows exactly which went unanswered there
        // and marks there: the caller's book (`step.mark`), which only saw
        // the quorum call, would mark every master after any dropped call.
        let q = self.quorum;
        let already;
        {
            // Remember the release before sending it (see `released`).
            let mut released = self.released.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            released.retain(|_, (until, _)| *until > now);
            let entry = released
                .entry((kind, name.to_string(), *owner))
                .or_insert((now, false));
            entry.0 = now + self.timeout * 2;
            already = entry.1;
        }
        let mut answers = self.release_on(kind, name, *owner, None).await;
        // A master whose release failed (a connection that broke, and is
        // being made again) may still hold the claim: ask it again, a few
        // times within the call timeout, before saying so; unless enough
        // masters said they do not hold it that this owner held no quorum
        // (a down master's straggler, if any, ends with its TTL).
        let deadline = Instant::now() + self.timeout;
        let n = self.masters.len();
        while count(&answers, |x| *x) < q
            && count(&answers, |x| !*x) <= n - q
            && errors(&answers) > 0
            && Instant::now() < deadline
        {
            let again: Vec<bool> = answers.iter().map(|a| matches!(a, Some(Err(_)))).collect();
            tokio::time::sleep(RELEASE_RETRY).await;
            let more = self.release_on(kind, name, *owner, Some(&again)).await;
            for (a, m) in answers.iter_mut().zip(more) {
                if m.is_some() {
                    *a = m;
                }
            }
        }
        let released = count(&answers, |x| *x);
        let not_held = count(&answers, |x| !*x);
        // Held, and released: on a quorum (once: what a repeated release
        // finds is the first one's stragglers). A claim of this owner on
        // fewer masters, with the others saying they do not hold it, was
        // no longer this owner's lock (another owner can be granted on the
        // rest: CI, the conformance case
        // lock_same_owner_through_another_client_gets_no_other_token): the
        // stragglers are gone, and the release reports false.
        if released >= q {
            if already {
                return Ok(false);
            }
            let mut done = self.released.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(entry) = done.get_mut(&(kind, name.to_string(), *owner)) {
                entry.1 = true;
            }
            return Ok(true);
        }
        if not_held > self.masters.len() - q {
            return Ok(false);
        }
        let op = kind.op(Op::Release);
        if released > 0 {
            return Err(Error::Unavailable {
                backend: BACKEND,
                operation: op,
                message: format!(
                    "released on {released} of {} Redlock masters; the others did not answer, \
                     and may keep the claim until its TTL runs out",
                    self.masters.len()
                ),
                source: None,
            });
        }
        Err(self.no_quorum(op, &answers))
    }

    /// Extend on every master: `true` once a quorum extended.
    pub(super) async fn quorum_extend(
        &self,
        kind: ClaimKind,
        name: &str,
        step: Step,
        ttl: Duration,
    ) -> Result<bool> {
        let (n, q) = (self.masters.len(), self.quorum);
        let nm = name.to_string();
        // Marked by each master's own book (see `quorum_release`).
        let owner = step.owner;
        let answers = self
            .fan(
                kind.op(Op::Extend),
                None,
                false,
                move |_, b| {
                    let nm = nm.clone();
                    Box::pin(async move { b.master_extend(kind, &nm, owner, ttl).await })
                },
                |a| extend_decided(a, n, q),
            )
            .await;
        if let Some(held) = extend_outcome(&answers, n, q) {
            return Ok(held);
        }
        if answered(&answers) < q {
            return Err(self.no_quorum(kind.op(Op::Extend), &answers));
        }
        // A quorum answered, but neither way: the masters that failed
        // decide whether a quorum extended it.
        Err(Error::Unavailable {
            backend: BACKEND,
            operation: kind.op(Op::Extend),
            message: format!(
                "extended on {} of {} Redlock masters, not held on {}, and {} did not answer: \
                 whether a quorum of {q} holds it is not known",
                count(&answers, |x| *x),
                n,
                count(&answers, |x| !*x),
                n - answered(&answers)
            ),
            source: None,
        })
    }

    /// The holder a quorum of masters agrees on (every master asked).
    pub(super) async fn quorum_inspect(&self, kind: ClaimKind, name: &str) -> Result<ClaimRecord> {
        let nm = name.to_string();
        let (n, q) = (self.masters.len(), self.quorum);
        let answers = self
            .fan(
                kind.op(Op::Inspect),
                None,
                false,
                move |_, b| {
                    let nm = nm.clone();
                    Box::pin(async move { b.master_inspect(kind, &nm).await })
                },
                move |a| settled(a, n, q),
            )
            .await;
        if answered(&answers) < self.quorum {
            return Err(self.no_quorum(kind.op(Op::Inspect), &answers));
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
    pub(super) async fn quorum_force_release(&self, kind: ClaimKind, name: &str) -> Result<bool> {
        let nm = name.to_string();
        let answers = self
            .fan(
                kind.op(Op::Force),
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
        Err(self.no_quorum(kind.op(Op::Force), &answers))
    }

    pub(super) fn subscribe_kind(&self, kind: ClaimKind, name: &str) -> Waiter {
        self.wakeups.subscribe(&Keys::wake(kind.kind(), name))
    }
}
