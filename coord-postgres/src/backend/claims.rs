//! Locks, leases and fencing tokens: the claim statements and their traits.

use std::time::Duration;

use coord_core::inspect::{ClaimRecord, HolderRecord};
use coord_core::late::Step;
use coord_core::wake::Waiter;
use coord_core::{
    Attempt, Capabilities, Error, FencingSource, FencingToken, Lease, Lock, OwnerToken, Result,
    async_trait,
};
use tokio_postgres::types::{ToSql, Type};

use super::errors::{map_pg, unexpected};
use super::{BACKEND, PostgresBackend, extend_answer, from_micros, micros_ceil, token};

pub(super) const KIND_LOCK: &str = "lock";
pub(super) const KIND_LEASE: &str = "lease";
pub(super) const KIND_ELECTION: &str = "election";

/// How long the release (or revoke, or resignation) of an owner, one of
/// whose lock, lease or campaign attempts went unanswered, keeps attempts
/// of that owner sent before the release from being granted (a late copy
/// delayed in the network past the call timeout, `coord_core::late`): far
/// above any call timeout. A copy later than that is an ordinary attempt
/// again. The mark is kept on the name's row (src/sql/claims.sql) and
/// pruned by the next such release once lapsed; the sweep keeps the row
/// while it holds.
///
/// ```
/// assert_eq!(coord_postgres::CLAIM_LEFT_TTL, std::time::Duration::from_secs(30));
/// ```
pub const CLAIM_LEFT_TTL: Duration = Duration::from_secs(30);

impl PostgresBackend {
    /// One attempt on a claim. `notify`: send a NOTIFY when this starts a
    /// new grant (elections: observers learn of the new term). `metadata`
    /// is stored with a new grant only (a retry by the live owner keeps
    /// the grant as it is).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn claim_acquire(
        &self,
        operation: &'static str,
        (kind, notify): (&'static str, bool),
        name: &str,
        step: Step,
        candidate: Option<&str>,
        ttl: Duration,
        metadata: Option<&[u8]>,
    ) -> Result<Attempt> {
        let key = Self::key(kind, name);
        // Stamped: a copy landing after its owner's marking release or
        // extend takes nothing.
        let at = step.stamp;
        let owner: &[u8] = step.owner.as_bytes();
        let ttl = micros_ceil(ttl);
        // Lock waiters of this client (subscribed after a refused attempt)
        // mark the holder's row, so its release notifies.
        let waiting =
            kind == KIND_LOCK && self.caps.notifications && self.wakeups.has_waiters(&key);
        let kind = kind.to_string();
        let name = name.to_string();
        let candidate = candidate.map(str::to_string);
        // A name nobody holds: one call takes its free or expired row in
        // place (or inserts the name's first row). Skipped where
        // the row is likely held (this client waits on it) and for
        // elections (a new term notifies).
        if !waiting && !notify {
            let rows = self
                .query(
                    operation,
                    &self.sql.claim_take,
                    &[
                        (&kind, Type::TEXT),
                        (&name, Type::TEXT),
                        (&owner, Type::BYTEA),
                        (&candidate, Type::TEXT),
                        (&ttl, Type::INT8),
                        (&at, Type::INT8),
                        (&metadata, Type::BYTEA),
                    ],
                )
                .await?;
            let row = rows.first().ok_or_else(|| unexpected(operation))?;
            let f: Option<i64> = row.try_get(0).map_err(|e| map_pg(operation, e))?;
            if let Some(f) = f {
                self.after_write();
                return Ok(Attempt::Granted(token(f)));
            }
        }
        let rows = self
            .query(
                operation,
                &self.sql.claim_acquire,
                &[
                    (&kind, Type::TEXT),
                    (&name, Type::TEXT),
                    (&owner, Type::BYTEA),
                    (&candidate, Type::TEXT),
                    (&ttl, Type::INT8),
                    (&self.channel, Type::TEXT),
                    (&notify, Type::BOOL),
                    (&waiting, Type::BOOL),
                    (&metadata, Type::BYTEA),
                    (&at, Type::INT8),
                ],
            )
            .await?;
        let row = rows.first().ok_or_else(|| unexpected(operation))?;
        let granted: Option<i64> = row.try_get(0).map_err(|e| map_pg(operation, e))?;
        if let Some(f) = granted {
            self.after_write();
            return Ok(Attempt::Granted(token(f)));
        }
        let held: Option<i64> = row.try_get(1).map_err(|e| map_pg(operation, e))?;
        let registered: bool = row.try_get(2).map_err(|e| map_pg(operation, e))?;
        // `held` is the holder's remaining time as of this statement's
        // snapshot. When the row looked free (or expired) there, another
        // client took it concurrently; when a waiter's mark found the
        // holder's row changed or gone, its release may have sent no
        // NOTIFY: either way retry at once, and the next attempt sees the
        // holder and its exact remaining time (and marks its row).
        let held = if waiting && !registered { None } else { held };
        Ok(Attempt::Held {
            expires_in: Some(
                held.map(from_micros)
                    .unwrap_or(Duration::ZERO)
                    .max(Duration::from_millis(1)),
            ),
        })
    }

    /// Compare-and-release (the row is freed in place; the sweep deletes
    /// it once idle past the grace). `notify`: send a NOTIFY
    /// even when no waiter marked the row (elections). A release whose
    /// step says to mark (a step of the owner went unanswered) also marks
    /// the owner as left for [`CLAIM_LEFT_TTL`], so that step takes nothing
    /// if it lands later (`claim_leave`; one statement either way).
    pub(super) async fn claim_release(
        &self,
        operation: &'static str,
        kind: &'static str,
        name: &str,
        step: Step,
        notify: bool,
    ) -> Result<bool> {
        let key = Self::key(kind, name);
        let owner: &[u8] = step.owner.as_bytes();
        let kind = kind.to_string();
        let name = name.to_string();
        let left_ttl = micros_ceil(CLAIM_LEFT_TTL);
        let params: [(&(dyn ToSql + Sync), Type); 7] = [
            (&kind, Type::TEXT),
            (&name, Type::TEXT),
            (&owner, Type::BYTEA),
            (&self.channel, Type::TEXT),
            (&notify, Type::BOOL),
            (&step.stamp, Type::INT8),
            (&left_ttl, Type::INT8),
        ];
        // `claim_leave` also marks the owner as left: the first five
        // parameters are `claim_release`'s.
        let (sql, n) = if step.mark {
            (&self.sql.claim_leave, 7)
        } else {
            (&self.sql.claim_release, 5)
        };
        let rows = self.query(operation, sql, &params[..n]).await?;
        let held = match rows.first() {
            Some(r) => r.try_get(0).map_err(|e| map_pg(operation, e))?,
            None => false,
        };
        // The row was freed: a waiter of this client tries at once rather
        // than when this release's NOTIFY comes back through the LISTEN
        // connection (a server process and a task later). That NOTIFY
        // still wakes one more (refused, if this one got in).
        if !rows.is_empty() {
            self.wakeups.notify_one(&key);
        }
        Ok(held)
    }

    /// The live holder of a claim, if any: one read statement.
    pub(super) async fn claim_inspect(
        &self,
        operation: &'static str,
        kind: &'static str,
        name: &str,
    ) -> Result<ClaimRecord> {
        let kind = kind.to_string();
        let name = name.to_string();
        let rows = self
            .query(
                operation,
                &self.sql.claim_inspect,
                &[(&kind, Type::TEXT), (&name, Type::TEXT)],
            )
            .await?;
        let mut holders = Vec::with_capacity(rows.len());
        for r in &rows {
            let owner: Vec<u8> = r.try_get(0).map_err(|e| map_pg(operation, e))?;
            let fencing: i64 = r.try_get(1).map_err(|e| map_pg(operation, e))?;
            let us: i64 = r.try_get(2).map_err(|e| map_pg(operation, e))?;
            let metadata: Option<Vec<u8>> = r.try_get(3).map_err(|e| map_pg(operation, e))?;
            holders.push(HolderRecord {
                owner: owner_token(operation, &owner)?,
                token: token(fencing),
                remaining: Some(from_micros(us)),
                metadata,
                permits: 1,
            });
        }
        Ok(ClaimRecord {
            holders,
            waiters: None,
        })
    }

    pub(super) async fn claim_extend(
        &self,
        operation: &'static str,
        kind: &'static str,
        name: &str,
        step: Step,
        ttl: Duration,
    ) -> Result<bool> {
        // A step of its owner (`coord_core::late`): refused if stamped
        // before the owner's mark; when the step says so, it marks the
        // owner as left at its stamp, so an earlier step's late copy never
        // sets the expiry back.
        let o: &[u8] = step.owner.as_bytes();
        let ttl = micros_ceil(ttl);
        let (kind, name) = (kind.to_string(), name.to_string());
        let left_ttl = step.mark.then(|| micros_ceil(CLAIM_LEFT_TTL));
        let rows = self
            .query(
                operation,
                &self.sql.claim_extend,
                &[
                    (&kind, Type::TEXT),
                    (&name, Type::TEXT),
                    (&o, Type::BYTEA),
                    (&ttl, Type::INT8),
                    (&step.stamp, Type::INT8),
                    (&left_ttl, Type::INT8),
                ],
            )
            .await?;
        extend_answer(operation, &rows)
    }
}

#[async_trait]
impl Lock for PostgresBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn try_acquire(&self, name: &str, step: Step, ttl: Duration) -> Result<Attempt> {
        self.claim_acquire(
            "lock acquire",
            (KIND_LOCK, false),
            name,
            step,
            None,
            ttl,
            None,
        )
        .await
    }

    async fn try_acquire_with_metadata(
        &self,
        name: &str,
        step: Step,
        ttl: Duration,
        metadata: &[u8],
    ) -> Result<Attempt> {
        self.claim_acquire(
            "lock acquire",
            (KIND_LOCK, false),
            name,
            step,
            None,
            ttl,
            Some(metadata),
        )
        .await
    }

    async fn inspect(&self, name: &str) -> Result<ClaimRecord> {
        self.claim_inspect("lock inspect", KIND_LOCK, name).await
    }

    async fn release(&self, name: &str, step: Step) -> Result<bool> {
        // NOTIFY only when a waiter marked the row.
        self.claim_release("lock release", KIND_LOCK, name, step, false)
            .await
    }

    async fn extend(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        self.claim_extend("lock extend", KIND_LOCK, name, step, ttl)
            .await
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        let kind = KIND_LOCK.to_string();
        let name = name.to_string();
        // NOTIFY only when a waiter marked the row.
        let notify = false;
        let rows = self
            .query(
                "lock force release",
                &self.sql.claim_force_release,
                &[
                    (&kind, Type::TEXT),
                    (&name, Type::TEXT),
                    (&self.channel, Type::TEXT),
                    (&notify, Type::BOOL),
                ],
            )
            .await?;
        if rows.is_empty() {
            return Ok(false);
        }
        // As for release: a waiter of this client tries at once.
        self.wakeups.notify_one(&Self::key(KIND_LOCK, &name));
        Ok(true)
    }

    async fn subscribe(&self, name: &str, _owner: &OwnerToken) -> Result<Waiter> {
        Ok(self.waiter(KIND_LOCK, name))
    }
}

#[async_trait]
impl Lease for PostgresBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn grant(&self, name: &str, step: Step, ttl: Duration) -> Result<Attempt> {
        self.claim_acquire(
            "lease grant",
            (KIND_LEASE, false),
            name,
            step,
            None,
            ttl,
            None,
        )
        .await
    }

    async fn grant_with_metadata(
        &self,
        name: &str,
        step: Step,
        ttl: Duration,
        metadata: &[u8],
    ) -> Result<Attempt> {
        self.claim_acquire(
            "lease grant",
            (KIND_LEASE, false),
            name,
            step,
            None,
            ttl,
            Some(metadata),
        )
        .await
    }

    async fn inspect(&self, name: &str) -> Result<ClaimRecord> {
        self.claim_inspect("lease inspect", KIND_LEASE, name).await
    }

    async fn renew(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        self.claim_extend("lease renew", KIND_LEASE, name, step, ttl)
            .await
    }

    async fn revoke(&self, name: &str, step: Step) -> Result<bool> {
        self.claim_release("lease revoke", KIND_LEASE, name, step, false)
            .await
    }

    async fn remaining(&self, name: &str) -> Result<Option<Duration>> {
        let kind = KIND_LEASE.to_string();
        let name = name.to_string();
        let rows = self
            .query(
                "lease remaining",
                &self.sql.claim_remaining,
                &[(&kind, Type::TEXT), (&name, Type::TEXT)],
            )
            .await?;
        match rows.first() {
            None => Ok(None),
            Some(r) => {
                let us: i64 = r.try_get(0).map_err(|e| map_pg("lease remaining", e))?;
                Ok(Some(from_micros(us)))
            }
        }
    }
}

#[async_trait]
impl FencingSource for PostgresBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn next(&self, _resource: &str) -> Result<FencingToken> {
        // One durable counter per schema serves every resource: strictly
        // increasing per resource because it is strictly increasing overall.
        let rows = self
            .query("fencing next", &self.sql.fencing_next, &[])
            .await?;
        let row = rows.first().ok_or_else(|| unexpected("fencing next"))?;
        let v: i64 = row.try_get(0).map_err(|e| map_pg("fencing next", e))?;
        Ok(token(v))
    }
}

/// An owner token read back from the store: 16 bytes, or a store error
/// (that names neither the value nor its length's source).
pub(super) fn owner_token(operation: &'static str, bytes: &[u8]) -> Result<OwnerToken> {
    let raw: [u8; 16] = bytes.try_into().map_err(|_| Error::Store {
        backend: BACKEND,
        operation,
        message: format!(
            "a holder's owner token is {} bytes, not 16: the row was not written by coord",
            bytes.len()
        ),
        source: None,
    })?;
    Ok(OwnerToken::from_bytes(raw))
}
