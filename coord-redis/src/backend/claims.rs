//! Locks, leases and fencing sources: claims with a fencing token, and
//! the holder metadata stored in a claim (see the crate docs).
//!
//! Late copies of attempts (`coord_core::late`, as for semaphores): every
//! attempt carries its step's stamp; a release (or extend) whose step says
//! to mark (one of the owner's steps went unanswered: a call timeout, a
//! broken connection, a cancelled acquire) leaves a mark
//! `<claim>:left:<owner>` holding its stamp for [`LEFT_MARKER_TTL`] (or
//! twice the call timeout), held or not. Every attempt looks its owner's
//! mark up first (one key lookup, in the claim's slot) and, stamped before
//! it, is refused and changes nothing: a copy delayed in the network cannot
//! take a claim its owner gave up and left. Releases after answered
//! attempts leave no mark.

use std::time::Duration;

use coord_core::inspect::{ClaimRecord, HolderRecord};
use coord_core::util::Kind;
use coord_core::wake::Waiter;
use coord_core::{Attempt, Capabilities, FencingToken, OwnerToken, Result, Step, async_trait};
use redis::Value;

use super::{
    RedisBackend, attempt_again, bytes, flag, int, malformed, ms, step_answer, unexpected,
};
use crate::keys::{ClaimKeys, Keys, Layout};

/// How long the release of an owner with an unanswered attempt keeps that
/// owner's attempts stamped before it from being granted or queued (at
/// least; twice the call timeout if that is longer): far above any call
/// timeout a late copy of an attempt could have outlived. A copy later
/// than that is an ordinary attempt again.
pub(crate) const LEFT_MARKER_TTL: Duration = coord_core::late::LATE_COPY_HORIZON;

impl RedisBackend {
    /// The lifetime of a left owner's mark in ms, as a script argument.
    pub(crate) fn left_marker_ms(&self) -> String {
        ms(LEFT_MARKER_TTL.max(self.timeout * 2)).to_string()
    }

    /// Run `script` on `keys` with `args`: the release (or resign) `step`
    /// on a claim or election. If the step says to mark (one of the owner's
    /// steps went unanswered), it also names the owner's mark (`mark_key()`,
    /// after `keys`) with its stamp and the mark's lifetime in ms (after
    /// `args`; see `scripts::mark`), so that step's late copy is refused.
    pub(crate) async fn marking_eval(
        &self,
        operation: &'static str,
        step: Step,
        script: &redis::Script,
        keys: &[&str],
        mark_key: impl FnOnce() -> String,
        args: &[&[u8]],
    ) -> Result<redis::Value> {
        if !step.mark {
            return self.eval(operation, script, keys, args).await;
        }
        let (mark, at, ttl) = (mark_key(), step.stamp.to_string(), self.left_marker_ms());
        let mut keys = keys.to_vec();
        keys.push(&mark);
        let mut args = args.to_vec();
        args.extend([at.as_bytes(), ttl.as_bytes()]);
        self.eval(operation, script, &keys, &args).await
    }

    /// Run `script` on `keys` with `args`: the extend or renewal `step` on
    /// a claim or election, which always names the owner's mark
    /// (`mark_key`, after `keys`) and sends its stamp (after `args`; see
    /// `scripts::step`). The store refuses it, changing nothing, if a
    /// later step of the owner marked first
    /// ([`coord_core::late::superseded`]); if the step says to mark, it
    /// marks itself (the mark's lifetime after the stamp).
    pub(crate) async fn stepping_eval(
        &self,
        operation: &'static str,
        step: Step,
        script: &redis::Script,
        keys: &[&str],
        mark_key: &str,
        args: &[&[u8]],
    ) -> Result<bool> {
        let (at, ttl) = (step.stamp.to_string(), self.left_marker_ms());
        let mut keys = keys.to_vec();
        keys.push(mark_key);
        let mut args = args.to_vec();
        args.push(at.as_bytes());
        if step.mark {
            args.push(ttl.as_bytes());
        }
        let v = self.eval(operation, script, &keys, &args).await?;
        step_answer(operation, &v)
    }

    /// The script of `scripts` for the layout of `keys` (default, PHP) and
    /// the keys it runs on: the claim, or the PHP layout's key and grant
    /// key.
    fn claim_script<'a>(
        keys: &'a ClaimKeys,
        (one, php): (&'a redis::Script, &'a redis::Script),
    ) -> (&'a redis::Script, Vec<&'a str>) {
        match keys {
            ClaimKeys::One(claim) => (one, vec![claim.as_str()]),
            ClaimKeys::Php(k) => (php, vec![k[0].as_str(), k[1].as_str()]),
        }
    }

    /// Run `one` on a default-layout claim, or `php` on a PHP-layout
    /// claim's key and grant key (release, extend, force release).
    pub(crate) async fn claim_eval(
        &self,
        operation: &'static str,
        keys: &ClaimKeys,
        (one, php): (&redis::Script, &redis::Script),
        args: &[&[u8]],
    ) -> Result<redis::Value> {
        let (script, keys) = Self::claim_script(keys, (one, php));
        self.eval(operation, script, &keys, args).await
    }

    /// One attempt on a claim; `meta`, if any, is stored with a new grant
    /// (after its token, in the claim's value; in the PHP layout, in the
    /// grant key). Without metadata the scripts are the plain ones.
    pub(crate) async fn claim_acquire(
        &self,
        operation: &'static str,
        keys: &ClaimKeys,
        wake: &str,
        step: Step,
        ttl: Duration,
        meta: Option<&[u8]>,
    ) -> Result<Attempt> {
        let (attempt, _) = self
            .claim_attempt(operation, keys, wake, step, ttl, meta)
            .await?;
        Ok(attempt)
    }

    /// [`Self::claim_acquire`], also telling whether the grant was one its
    /// owner held already (a retry).
    pub(crate) async fn claim_attempt(
        &self,
        operation: &'static str,
        keys: &ClaimKeys,
        wake: &str,
        step: Step,
        ttl: Duration,
        meta: Option<&[u8]>,
    ) -> Result<(Attempt, bool)> {
        let owner = step.owner.to_hex();
        let left = keys.left(&owner);
        let at = step.stamp.to_string();
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
                let args = [owner.as_bytes(), ttl.as_bytes(), flag, at.as_bytes()];
                let keys = [claim.as_str(), &left];
                match meta {
                    None => {
                        let script = &self.scripts.acquire;
                        self.eval(operation, script, &keys, &args).await?
                    }
                    Some(m) => {
                        let script = &self.scripts.acquire_meta;
                        let args = [args[0], args[1], args[2], args[3], m];
                        self.eval(operation, script, &keys, &args).await?
                    }
                }
            }
            ClaimKeys::Php(k) => {
                let keys = [k[0].as_str(), &k[1], &k[2], &left];
                let args = [owner.as_bytes(), ttl.as_bytes(), at.as_bytes()];
                match meta {
                    None => {
                        let script = &self.scripts.php_acquire;
                        self.eval(operation, script, &keys, &args).await?
                    }
                    Some(m) => {
                        let script = &self.scripts.php_acquire_meta;
                        let args = [args[0], args[1], args[2], m];
                        self.eval(operation, script, &keys, &args).await?
                    }
                }
            }
        };
        attempt_again(operation, &v)
    }

    /// The live holder of a claim (one read-only script).
    pub(crate) async fn claim_inspect(
        &self,
        operation: &'static str,
        keys: &ClaimKeys,
    ) -> Result<ClaimRecord> {
        let v = match keys {
            ClaimKeys::One(claim) => {
                let script = &self.scripts.inspect;
                self.eval(operation, script, &[claim], &[]).await?
            }
            ClaimKeys::Php(k) => {
                let script = &self.scripts.php_inspect;
                self.eval(operation, script, &[&k[0], &k[1]], &[]).await?
            }
        };
        Ok(ClaimRecord {
            holders: claim_holder(operation, &v)?.into_iter().collect(),
            waiters: None,
        })
    }

    /// Compare-and-release; an owner with an unanswered attempt leaves a
    /// mark, so that attempt's late copy is refused ([`Self::marking_eval`]).
    pub(crate) async fn claim_release(
        &self,
        operation: &'static str,
        keys: &ClaimKeys,
        step: Step,
        (channel, payload): (String, String),
    ) -> Result<bool> {
        let hex = step.owner.to_hex();
        let args = [hex.as_bytes(), channel.as_bytes(), payload.as_bytes()];
        let scripts = (&self.scripts.release, &self.scripts.php_release);
        let (script, ks) = Self::claim_script(keys, scripts);
        let mark = || keys.left(&hex);
        let v = self
            .marking_eval(operation, step, script, &ks, mark, &args)
            .await?;
        flag(operation, &v)
    }

    /// Compare-and-expire, as a step of its owner ([`Self::stepping_eval`]):
    /// a late copy of an earlier attempt or extend of the owner is then
    /// refused, and never sets the expiry back to its own TTL.
    pub(crate) async fn claim_extend(
        &self,
        operation: &'static str,
        keys: &ClaimKeys,
        step: Step,
        ttl: Duration,
    ) -> Result<bool> {
        let hex = step.owner.to_hex();
        let ttl = ms(ttl).to_string();
        let args = [hex.as_bytes(), ttl.as_bytes()];
        let scripts = (&self.scripts.extend, &self.scripts.php_extend);
        let (script, ks) = Self::claim_script(keys, scripts);
        let mark = keys.left(&hex);
        self.stepping_eval(operation, step, script, &ks, &mark, &args)
            .await
    }
}

#[async_trait]
impl coord_core::Lock for RedisBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn try_acquire(&self, name: &str, step: Step, ttl: Duration) -> Result<Attempt> {
        let wake = Keys::wake(Kind::Lock, name);
        let keys = self.keys.lock(name)?;
        self.claim_acquire("lock acquire", &keys, &wake, step, ttl, None)
            .await
    }

    async fn release(&self, name: &str, step: Step) -> Result<bool> {
        let wake = self.wake_args(Kind::Lock, name);
        self.claim_release("lock release", &self.keys.lock(name)?, step, wake)
            .await
    }

    async fn extend(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        self.claim_extend("lock extend", &self.keys.lock(name)?, step, ttl)
            .await
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        let (channel, payload) = self.wake_args(Kind::Lock, name);
        let args = [channel.as_bytes(), payload.as_bytes()];
        let op = "lock force release";
        let scripts = (&self.scripts.force_release, &self.scripts.php_force_release);
        let v = self
            .claim_eval(op, &self.keys.lock(name)?, scripts, &args)
            .await?;
        flag(op, &v)
    }

    async fn subscribe(&self, name: &str, _owner: &OwnerToken) -> Result<Waiter> {
        Ok(self.wakeups.subscribe(&Keys::wake(Kind::Lock, name)))
    }

    async fn try_acquire_with_metadata(
        &self,
        name: &str,
        step: Step,
        ttl: Duration,
        metadata: &[u8],
    ) -> Result<Attempt> {
        let wake = Keys::wake(Kind::Lock, name);
        let keys = self.keys.lock(name)?;
        let op = "lock acquire";
        self.claim_acquire(op, &keys, &wake, step, ttl, Some(metadata))
            .await
    }

    async fn inspect(&self, name: &str) -> Result<ClaimRecord> {
        self.claim_inspect("lock inspect", &self.keys.lock(name)?)
            .await
    }
}

#[async_trait]
impl coord_core::Lease for RedisBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn grant(&self, name: &str, step: Step, ttl: Duration) -> Result<Attempt> {
        let wake = Keys::wake(Kind::Lease, name);
        let keys = self.keys.lease(name);
        self.claim_acquire("lease grant", &keys, &wake, step, ttl, None)
            .await
    }

    async fn grant_with_metadata(
        &self,
        name: &str,
        step: Step,
        ttl: Duration,
        metadata: &[u8],
    ) -> Result<Attempt> {
        let wake = Keys::wake(Kind::Lease, name);
        let keys = self.keys.lease(name);
        let op = "lease grant";
        self.claim_acquire(op, &keys, &wake, step, ttl, Some(metadata))
            .await
    }

    async fn inspect(&self, name: &str) -> Result<ClaimRecord> {
        self.claim_inspect("lease inspect", &self.keys.lease(name))
            .await
    }

    async fn renew(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        self.claim_extend("lease renew", &self.keys.lease(name), step, ttl)
            .await
    }

    async fn revoke(&self, name: &str, step: Step) -> Result<bool> {
        let wake = self.wake_args(Kind::Lease, name);
        self.claim_release("lease revoke", &self.keys.lease(name), step, wake)
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
            Layout::Php => String::new(),
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

/// Parse an inspect script's reply: `{}` (free), or `{owner, token, pttl
/// [, metadata]}` (token `''`: a PHP-layout holder coord did not grant,
/// shown with token 0). Errors never show the reply (it holds the owner
/// token).
fn claim_holder(operation: &'static str, v: &Value) -> Result<Option<HolderRecord>> {
    let Value::Array(items) = v else {
        return Err(malformed(operation, "not a list"));
    };
    if items.is_empty() {
        return Ok(None);
    }
    if items.len() < 3 || items.len() > 4 {
        return Err(malformed(
            operation,
            "the claim's key holds a value coord does not write",
        ));
    }
    let owner = bytes(&items[0])
        .and_then(|b| std::str::from_utf8(b).ok())
        .and_then(OwnerToken::from_hex)
        .ok_or_else(|| {
            malformed(
                operation,
                "the claim is held by a token that is not 32 hex digits",
            )
        })?;
    let token = match bytes(&items[1]) {
        Some(b"") => FencingToken(0),
        Some(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|t| t.parse().ok())
            .map(FencingToken)
            .ok_or_else(|| malformed(operation, "a fencing token that is not a number"))?,
        None => return Err(malformed(operation, "no fencing token")),
    };
    let pttl = int(&items[2]).ok_or_else(|| malformed(operation, "no remaining time"))?;
    let metadata = match items.get(3) {
        None => None,
        Some(m) => Some(
            bytes(m)
                .ok_or_else(|| malformed(operation, "metadata that is not a string"))?
                .to_vec(),
        ),
    };
    Ok(Some(HolderRecord {
        owner,
        token,
        remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
        metadata,
        permits: 1,
    }))
}
