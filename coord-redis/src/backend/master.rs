//! One Redlock master's steps: the claim scripts of locks, leases and
//! fencing sources on one independent server, chosen by [`ClaimKind`], plus
//! the second step of a Redlock grant (setting the claim's token to the
//! quorum's). The quorum itself is in [`crate::redlock`].

use std::time::Duration;

use coord_core::inspect::ClaimRecord;
use coord_core::util::Kind;
use coord_core::{Attempt, FencingToken, OwnerToken, Result, Step};

use super::{RedisBackend, flag};
use crate::keys::{ClaimKeys, Keys};

/// Which claim of a name a Redlock step works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ClaimKind {
    /// A lock (`Lock`).
    Lock,
    /// A lease (`Lease`).
    Lease,
    /// The claim that serialises a fencing source's issuing: a fencing
    /// token on Redlock is the token of a short claim on the resource's
    /// fencing key (its own kind, so it never meets a lock of that name).
    Fence,
}

impl ClaimKind {
    /// The key kind (and wake-up kind).
    pub(crate) fn kind(self) -> Kind {
        match self {
            ClaimKind::Lock => Kind::Lock,
            ClaimKind::Lease => Kind::Lease,
            ClaimKind::Fence => Kind::Fence,
        }
    }

    /// Operation names for errors and spans.
    pub(crate) fn op(self, op: Op) -> &'static str {
        use ClaimKind::*;
        use Op::*;
        match (self, op) {
            (Lock, Acquire) => "lock acquire",
            (Lock, Release) => "lock release",
            (Lock, Extend) => "lock extend",
            (Lock, Raise) => "lock acquire (raise token)",
            (Lock, Inspect) => "lock inspect",
            (Lock, Force) => "lock force release",
            (Lease, Acquire) => "lease grant",
            (Lease, Release) => "lease revoke",
            (Lease, Extend) => "lease renew",
            (Lease, Raise) => "lease grant (raise token)",
            (Lease, Inspect) => "lease inspect",
            (Lease, Force) => "lease force release",
            (Fence, Acquire) => "fencing next",
            (Fence, Release) => "fencing next (release)",
            (Fence, Extend) => "fencing next (extend)",
            (Fence, Raise) => "fencing next (raise token)",
            (Fence, Inspect) => "fencing inspect",
            (Fence, Force) => "fencing force release",
        }
    }
}

/// An operation on a claim, for [`ClaimKind::op`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    Acquire,
    Release,
    Extend,
    Raise,
    Inspect,
    Force,
}

impl RedisBackend {
    fn master_keys(&self, kind: ClaimKind, name: &str) -> Result<ClaimKeys> {
        Ok(match kind {
            ClaimKind::Lock => self.keys.lock(name)?,
            ClaimKind::Lease => self.keys.lease(name),
            ClaimKind::Fence => ClaimKeys::One(self.keys.fence(name)),
        })
    }

    /// One attempt, `step`, on `kind`'s claim of `name` on this master,
    /// and whether the grant was one its owner held here already;
    /// unanswered here, it is in this master's book (see
    /// `RedisBackend::master_book`).
    pub(crate) async fn master_acquire(
        &self,
        kind: ClaimKind,
        name: &str,
        step: Step,
        ttl: Duration,
        meta: Option<&[u8]>,
    ) -> Result<(Attempt, bool)> {
        let wake = Keys::wake(kind.kind(), name);
        let keys = self.master_keys(kind, name)?;
        let op = kind.op(Op::Acquire);
        let send = |s| self.claim_attempt(op, &keys, &wake, s, ttl, meta);
        self.master_book
            .attempt_with(keys.claim(), step, send)
            .await
    }

    /// Compare-and-release, publishing a wake-up if somebody waits;
    /// marking if the step says so or a step of its owner went unanswered
    /// on this master.
    pub(crate) async fn master_release(
        &self,
        kind: ClaimKind,
        name: &str,
        owner: OwnerToken,
    ) -> Result<bool> {
        let wake = self.wake_args(kind.kind(), name);
        let keys = self.master_keys(kind, name)?;
        let op = kind.op(Op::Release);
        let send = |s| self.claim_release(op, &keys, s, wake);
        self.master_book.ending(keys.claim(), owner, send).await
    }

    /// Compare-and-expire, marking as [`Self::master_release`] does.
    pub(crate) async fn master_extend(
        &self,
        kind: ClaimKind,
        name: &str,
        owner: OwnerToken,
        ttl: Duration,
    ) -> Result<bool> {
        let keys = self.master_keys(kind, name)?;
        let op = kind.op(Op::Extend);
        let send = |s| self.claim_extend(op, &keys, s, ttl);
        self.master_book.step(keys.claim(), owner, send).await
    }

    /// Set the token of `owner`'s claim to the quorum's `token`, keeping
    /// its TTL. `Ok(false)`: `owner` does not hold it here.
    pub(crate) async fn master_raise(
        &self,
        kind: ClaimKind,
        name: &str,
        owner: &OwnerToken,
        token: FencingToken,
    ) -> Result<bool> {
        let op = kind.op(Op::Raise);
        let keys = self.master_keys(kind, name)?;
        let owner = owner.to_hex();
        let token = token.0.to_string();
        let v = self
            .eval(
                op,
                &self.scripts.raise,
                &[keys.claim()],
                &[owner.as_bytes(), token.as_bytes()],
            )
            .await?;
        flag(op, &v)
    }

    /// The live holder of `kind`'s claim of `name` on this master.
    pub(crate) async fn master_inspect(&self, kind: ClaimKind, name: &str) -> Result<ClaimRecord> {
        let keys = self.master_keys(kind, name)?;
        self.claim_inspect(kind.op(Op::Inspect), &keys).await
    }

    /// This server's `run_id` (from `INFO server`) and its role (the first
    /// item of `ROLE`: `master`, `slave`, `sentinel`).
    pub(crate) async fn server_identity(&self) -> Result<(String, String)> {
        let op = "connect (server identity)";
        let info = self
            .cmd(op, redis::cmd("INFO").arg("server").clone())
            .await?;
        let text = match &info {
            redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            redis::Value::VerbatimString { text, .. } => text.clone(),
            redis::Value::SimpleString(s) => s.clone(),
            other => return Err(super::unexpected(op, other)),
        };
        let run_id = text
            .lines()
            .find_map(|l| l.strip_prefix("run_id:"))
            .map(|s| s.trim().to_string())
            .ok_or_else(|| super::malformed(op, "INFO server has no run_id"))?;
        let role = self.cmd(op, redis::cmd("ROLE")).await?;
        let role = match &role {
            redis::Value::Array(items) => items.first().and_then(super::bytes),
            _ => None,
        }
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .ok_or_else(|| super::malformed(op, "ROLE gave no role"))?;
        Ok((run_id, role))
    }

    /// Free `kind`'s claim of `name` whoever holds it.
    pub(crate) async fn master_force_release(&self, kind: ClaimKind, name: &str) -> Result<bool> {
        let (channel, payload) = self.wake_args(kind.kind(), name);
        let args = [channel.as_bytes(), payload.as_bytes()];
        let op = kind.op(Op::Force);
        let scripts = (&self.scripts.force_release, &self.scripts.php_force_release);
        let keys = self.master_keys(kind, name)?;
        let v = self.claim_eval(op, &keys, scripts, &args).await?;
        flag(op, &v)
    }
}
