//! Semaphores: FIFO, lease-bounded, fenced permits (see
//! `lua/semaphore_prelude.lua` for the keys).
//!
//! Each step is one script on the keys of one name, all in one hash slot:
//! an attempt prunes what expired, checks the total, and grants iff the
//! request and every request queued ahead of it fit into the free permits
//! together (a single attempt counts the whole queue as ahead of it);
//! otherwise a waiting attempt joins (or renews) its place in line. Every
//! step that frees permits publishes one wake-up per queued waiter that
//! became grantable, naming its owner, so exactly those waiters attempt
//! again. Tokens are max(last + 1, server µs), as for locks.
//!
//! Every step costs O(log n) in the queue length plus O(1) per waiter it
//! wakes (see the prelude): the scripts keep the sum of permits of the
//! already-woken prefix of the queue, so neither a grant nor a renewal
//! walks the places ahead.
//!
//! Late copies of attempts (`coord_core::late`): attempts and releases
//! carry their step's stamp, and the caller's book knows the owners with
//! an attempt that went unanswered (the call timed out or was cancelled,
//! so a copy may still be on its way, delayed in the network). Such an
//! owner's release is told to mark, and leaves a marker for `LEFT_MARKER_TTL` (30 s, in `claims.rs`; or twice the call
//! timeout); an attempt of that owner stamped before it is then refused and
//! changes nothing, so it cannot bring back the place its owner left (which
//! would block the name until the place lapsed, [`QUEUE_ENTRY_TTL`]) nor
//! take permits nobody releases. An owner reused after its release
//! (raw-trait callers) is not affected: its later attempts are stamped
//! after the release. Releases after answered attempts leave no marker, so
//! an idle name leaves no keys; a marker keeps the name's state until it
//! lapses. A copy more than the marker's TTL late is an ordinary attempt
//! again.

use std::time::Duration;

use coord_core::inspect::{ClaimRecord, HolderRecord};
use coord_core::wake::Waiter;
use coord_core::{
    Attempt, Capabilities, Error, FencingToken, OwnerToken, PermitRequest, Result, Step,
    async_trait,
};
use redis::Value;

use super::{RedisBackend, bytes, flag, int, malformed, ms, step_answer, unexpected};
use crate::{QUEUE_ENTRY_TTL, QUEUE_REFRESH};

impl RedisBackend {
    /// Run one semaphore script on `name`'s keys with the channel and the
    /// name as the first two arguments, then `args`.
    async fn semaphore_eval(
        &self,
        operation: &'static str,
        script: &redis::Script,
        name: &str,
        args: &[&[u8]],
    ) -> Result<Value> {
        let keys = self.keys.semaphore(name);
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let channel = self.channel.clone();
        let mut all: Vec<&[u8]> = vec![channel.as_bytes(), name.as_bytes()];
        all.extend_from_slice(args);
        self.eval(operation, script, &keys, &all).await
    }

    /// One attempt; `meta`, if any, is stored with a new grant.
    async fn semaphore_attempt(
        &self,
        name: &str,
        step: Step,
        request: &PermitRequest,
        meta: Option<&[u8]>,
    ) -> Result<Attempt> {
        let (owner, at) = (step.owner.to_hex(), step.stamp.to_string());
        let (permits, total) = (request.permits.to_string(), request.total.to_string());
        let ttl = ms(request.ttl).to_string();
        let queue: &[u8] = if request.queue { b"1" } else { b"0" };
        let (place, hint) = (
            ms(QUEUE_ENTRY_TTL).to_string(),
            ms(QUEUE_REFRESH).to_string(),
        );
        let all = [
            owner.as_bytes(),
            permits.as_bytes(),
            total.as_bytes(),
            ttl.as_bytes(),
            queue,
            place.as_bytes(),
            hint.as_bytes(),
            at.as_bytes(),
            meta.unwrap_or_default(),
        ];
        // The metadata, if any, is the last argument.
        let args = if meta.is_some() { &all[..] } else { &all[..8] };
        let script = &self.scripts.semaphore_acquire;
        let v = self
            .semaphore_eval("semaphore acquire", script, name, args)
            .await?;
        permit_attempt(&v, request)
    }
}

/// The local wake-up key (and published payload) of `owner`'s waiting
/// acquire on `name`: the owner first, since names may contain `:`.
fn waiter_key(name: &str, owner: &OwnerToken) -> String {
    format!("semaphore:{}:{name}", owner.to_hex())
}

/// Parse the acquire script's reply.
fn permit_attempt(v: &Value, request: &PermitRequest) -> Result<Attempt> {
    const OP: &str = "semaphore acquire";
    let Value::Array(items) = v else {
        return Err(unexpected(OP, v));
    };
    let (Some(code), Some(n)) = (items.first().and_then(int), items.get(1).and_then(int)) else {
        return Err(unexpected(OP, v));
    };
    match code {
        1 if n > 0 => Ok(Attempt::Granted(FencingToken(n as u64))),
        0 if n >= 0 => Ok(Attempt::Held {
            expires_in: Some(Duration::from_millis(n as u64)),
        }),
        -1 => Err(Error::invalid(
            "permits_total",
            format!(
                "is {}, but the semaphore is in use with permits_total {n}; \
                 the total binds while the name has holders or waiters",
                request.total
            ),
        )),
        _ => Err(unexpected(OP, v)),
    }
}

/// Semaphores on Redis: FIFO (a request is granted only if it and every
/// request queued ahead of it fit into the free permits together), woken
/// per waiter through the pub/sub channel, with queue places that lapse
/// [`QUEUE_ENTRY_TTL`](crate::QUEUE_ENTRY_TTL) after the waiter's last
/// attempt. Every layout keeps semaphores under the prefix.
#[async_trait]
impl coord_core::Semaphore for RedisBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn fifo(&self) -> bool {
        true
    }

    async fn try_acquire(
        &self,
        name: &str,
        step: Step,
        request: &PermitRequest,
    ) -> Result<Attempt> {
        self.semaphore_attempt(name, step, request, None).await
    }

    async fn release(&self, name: &str, step: Step) -> Result<bool> {
        let hex = step.owner.to_hex();
        let op = "semaphore release";
        let at = step.stamp.to_string();
        // Marked when a step of this owner went unanswered.
        let marker = if step.mark {
            self.left_marker_ms()
        } else {
            "0".to_string()
        };
        let script = &self.scripts.semaphore_release;
        let args = [hex.as_bytes(), at.as_bytes(), marker.as_bytes()];
        let v = self.semaphore_eval(op, script, name, &args).await?;
        flag(op, &v)
    }

    async fn extend(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        // A step of its owner (`coord_core::late`; see
        // `semaphore_extend.lua`): refused if stamped before the owner's
        // mark, marking as a release does when the step says so.
        let op = "semaphore extend";
        let (hex, ttl) = (step.owner.to_hex(), ms(ttl).to_string());
        let at = step.stamp.to_string();
        let marker = if step.mark {
            self.left_marker_ms()
        } else {
            "0".to_string()
        };
        let script = &self.scripts.semaphore_extend;
        let args = [
            hex.as_bytes(),
            ttl.as_bytes(),
            at.as_bytes(),
            marker.as_bytes(),
        ];
        let v = self.semaphore_eval(op, script, name, &args).await?;
        step_answer(op, &v)
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        let op = "semaphore force release";
        let script = &self.scripts.semaphore_force_release;
        let v = self.semaphore_eval(op, script, name, &[]).await?;
        flag(op, &v)
    }

    async fn subscribe(&self, name: &str, owner: &OwnerToken) -> Result<Waiter> {
        Ok(self.wakeups.subscribe(&waiter_key(name, owner)))
    }

    async fn try_acquire_with_metadata(
        &self,
        name: &str,
        step: Step,
        request: &PermitRequest,
        metadata: &[u8],
    ) -> Result<Attempt> {
        self.semaphore_attempt(name, step, request, Some(metadata))
            .await
    }

    async fn inspect(&self, name: &str) -> Result<ClaimRecord> {
        let op = "semaphore inspect";
        let script = &self.scripts.semaphore_inspect;
        let v = self.semaphore_eval(op, script, name, &[]).await?;
        permit_holders(op, &v)
    }
}

/// Parse the inspect script's reply: `{waiters, {owner, permits, token, ms
/// left[, metadata]}...}`, holders in token order. Errors never show the
/// reply (it holds owner tokens).
fn permit_holders(op: &'static str, v: &Value) -> Result<ClaimRecord> {
    let Value::Array(items) = v else {
        return Err(malformed(op, "not a list"));
    };
    let Some((waiters, grants)) = items.split_first() else {
        return Err(malformed(op, "an empty list"));
    };
    let waiters = int(waiters)
        .and_then(|n| u64::try_from(n).ok())
        .ok_or_else(|| malformed(op, "no count of waiters"))?;
    let mut holders = grants
        .iter()
        .map(|g| permit_holder(op, g))
        .collect::<Result<Vec<_>>>()?;
    holders.sort_by_key(|h| h.token);
    Ok(ClaimRecord {
        holders,
        waiters: Some(waiters),
    })
}

fn permit_holder(op: &'static str, v: &Value) -> Result<HolderRecord> {
    let bad = || malformed(op, "a grant that coord did not write");
    let Value::Array(f) = v else {
        return Err(bad());
    };
    if f.len() < 4 || f.len() > 5 {
        return Err(bad());
    }
    let owner = bytes(&f[0])
        .and_then(|b| std::str::from_utf8(b).ok())
        .and_then(OwnerToken::from_hex)
        .ok_or_else(bad)?;
    let permits = int(&f[1])
        .and_then(|p| u32::try_from(p).ok())
        .ok_or_else(bad)?;
    let token = int(&f[2])
        .and_then(|t| u64::try_from(t).ok())
        .filter(|t| *t > 0)
        .ok_or_else(bad)?;
    let left = int(&f[3])
        .and_then(|t| u64::try_from(t).ok())
        .ok_or_else(bad)?;
    let metadata = match f.get(4) {
        None => None,
        Some(m) => Some(bytes(m).ok_or_else(bad)?.to_vec()),
    };
    Ok(HolderRecord {
        owner,
        token: FencingToken(token),
        remaining: Some(Duration::from_millis(left)),
        metadata,
        permits,
    })
}
