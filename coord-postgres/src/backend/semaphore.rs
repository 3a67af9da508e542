//! Semaphores: FIFO, lease-bounded, fenced permits
//! (`src/sql/semaphore.sql`).
//!
//! Each method is one statement (one function call, or the extend
//! `UPDATE`), so one round trip; no session state, so it works through
//! PgBouncer in transaction mode. Waiters are woken by a NOTIFY addressed
//! to their owner token (`semaphore:<owner hex>:<name>`), sent by the
//! release that makes them grantable.
//!
//! Late attempts (`coord_core::late`): every attempt and release carries
//! its [`Step`]'s stamp. An attempt the client gave up on (call timeout,
//! lost connection, cancelled mid-call) may still reach the server later;
//! the caller's book knows it, so the owner's release is told to
//! [`mark`](Step::mark), and marks the owner as left at its stamp for
//! [`SEMAPHORE_LEFT_TTL`]. An attempt of the owner stamped before the
//! release (that late copy) is refused on the server and changes nothing:
//! no place in line nobody waits for (it would hold up every later waiter
//! until it lapsed, [`SEMAPHORE_QUEUE_TTL`]), no permits nobody releases.
//! Releases after answered attempts write no mark.

use std::time::Duration;

use coord_core::inspect::{ClaimRecord, HolderRecord};
use coord_core::late::Step;
use coord_core::wake::Waiter;
use coord_core::{
    Attempt, Capabilities, Error, OwnerToken, PermitRequest, Result, Semaphore, async_trait,
};
use tokio_postgres::types::{ToSql, Type};

use super::claims::owner_token;
use super::errors::{map_pg, unexpected};
use super::{PostgresBackend, extend_answer, from_micros, micros_ceil, token};

/// How long a waiter's place in a semaphore's queue lasts without a new
/// attempt (as coord-memory's `QUEUE_ENTRY_TTL`). A waiting acquire
/// attempts again well within it (its `Held { expires_in }` hint is at
/// most [`SEMAPHORE_QUEUE_REFRESH`]), so only an abandoned place (its
/// process died) lapses; it holds up the waiters behind it for at most
/// this long, and the sweep deletes it after the idle grace.
///
/// ```
/// assert!(coord_postgres::SEMAPHORE_QUEUE_REFRESH < coord_postgres::SEMAPHORE_QUEUE_TTL);
/// ```
pub const SEMAPHORE_QUEUE_TTL: Duration = Duration::from_secs(30);

/// The longest `expires_in` a refused semaphore attempt reports, so a
/// waiter attempts (and renews its place) before [`SEMAPHORE_QUEUE_TTL`]
/// runs out. A place is rewritten at most every half of it, not on every
/// poll.
///
/// ```
/// assert_eq!(coord_postgres::SEMAPHORE_QUEUE_REFRESH, std::time::Duration::from_secs(10));
/// ```
pub const SEMAPHORE_QUEUE_REFRESH: Duration = Duration::from_secs(10);

/// The longest `expires_in` a refused polling waiter (its client gets no
/// notifications) among the first four in line is told to sleep, when it
/// fits once the current grants return: only the head of the queue may
/// take returned permits, so it must not leave them idle for a whole poll
/// interval.
const HEAD_POLL: Duration = Duration::from_millis(10);

/// How long the release of an owner, one of whose attempts went
/// unanswered, keeps attempts of that owner sent before the release from
/// queueing or being granted (a late copy delayed in the network past the
/// call timeout): far above any call timeout. A copy later than that is an
/// ordinary attempt again. The mark (a row of `semaphore_left`) is then
/// pruned by the next write on the name or swept after the idle grace.
///
/// ```
/// assert_eq!(coord_postgres::SEMAPHORE_LEFT_TTL, std::time::Duration::from_secs(30));
/// ```
pub const SEMAPHORE_LEFT_TTL: Duration = Duration::from_secs(30);

/// The wake-up key (and NOTIFY payload) of one owner's waiting acquire.
pub(crate) fn waiter_key(name: &str, owner: &OwnerToken) -> String {
    format!("semaphore:{}:{name}", owner.to_hex())
}

impl PostgresBackend {
    /// One semaphore attempt; `metadata` is stored with a new grant only.
    async fn semaphore_attempt(
        &self,
        name: &str,
        step: Step,
        req: &PermitRequest,
        metadata: Option<&[u8]>,
    ) -> Result<Attempt> {
        const OP: &str = "semaphore acquire";
        let n = name.to_string();
        let o: &[u8] = step.owner.as_bytes();
        // Validated by the core: 1 <= permits <= total <= MAX_PERMITS.
        let permits = i32::try_from(req.permits)
            .map_err(|_| Error::invalid("permits", "too many permits"))?;
        let total = i32::try_from(req.total)
            .map_err(|_| Error::invalid("permits_total", "too many permits"))?;
        let ttl = micros_ceil(req.ttl);
        let wake = self.caps.notifications;
        let queue_ttl = micros_ceil(SEMAPHORE_QUEUE_TTL);
        let refresh = micros_ceil(SEMAPHORE_QUEUE_REFRESH);
        let head_poll = micros_ceil(HEAD_POLL);
        let at = step.stamp;
        let durable: &[(&(dyn ToSql + Sync), Type)] = &[(&n, Type::TEXT), (&o, Type::BYTEA)];
        let rows = self
            .query_then(
                OP,
                &self.sql.semaphore_acquire,
                &[
                    (&n, Type::TEXT),
                    (&o, Type::BYTEA),
                    (&permits, Type::INT4),
                    (&total, Type::INT4),
                    (&ttl, Type::INT8),
                    (&req.queue, Type::BOOL),
                    (&wake, Type::BOOL),
                    (&self.channel, Type::TEXT),
                    (&queue_ttl, Type::INT8),
                    (&refresh, Type::INT8),
                    (&head_poll, Type::INT8),
                    (&at, Type::INT8),
                    (&metadata, Type::BYTEA),
                ],
                Some((&self.sql.semaphore_durable, durable)),
            )
            .await?;
        let (rows, after) = rows;
        let flushed = !after.is_empty();
        let row = rows.first().ok_or_else(|| unexpected(OP))?;
        let granted: Option<i64> = row.try_get(0).map_err(|e| map_pg(OP, e))?;
        if let Some(f) = granted {
            if !flushed {
                // The durable update ran before the grant was visible to
                // it (another server connection behind a pooler): flush
                // now, before anybody relies on the grant.
                let again = self.query(OP, &self.sql.semaphore_durable, durable).await?;
                if again.is_empty() {
                    // Gone already (expired or removed): not granted.
                    return Ok(Attempt::Held {
                        expires_in: Some(Duration::from_millis(1)),
                    });
                }
            }
            self.after_write();
            return Ok(Attempt::Granted(token(f)));
        }
        let in_use: Option<i32> = row.try_get(2).map_err(|e| map_pg(OP, e))?;
        if let Some(t) = in_use {
            return Err(Error::invalid(
                "permits_total",
                format!(
                    "is {}, but the semaphore is in use with permits_total {t}; \
                     the total binds while the name has holders or waiters",
                    req.total
                ),
            ));
        }
        let held: Option<i64> = row.try_get(1).map_err(|e| map_pg(OP, e))?;
        Ok(Attempt::Held {
            expires_in: Some(
                held.map(from_micros)
                    .unwrap_or(SEMAPHORE_QUEUE_REFRESH)
                    .max(Duration::from_millis(1)),
            ),
        })
    }
}

/// Semaphores on PostgreSQL: FIFO. A request is granted only if it and
/// every live request queued ahead of it fit into the free permits
/// together; a single attempt counts the whole queue as ahead of it and
/// leaves nothing behind. Releases wake exactly the queued waiters they
/// make grantable (by NOTIFY, when their client listens).
/// `permits_total` binds while the name has live grants or places.
#[async_trait]
impl Semaphore for PostgresBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn fifo(&self) -> bool {
        true
    }

    async fn try_acquire(&self, name: &str, step: Step, req: &PermitRequest) -> Result<Attempt> {
        self.semaphore_attempt(name, step, req, None).await
    }

    async fn try_acquire_with_metadata(
        &self,
        name: &str,
        step: Step,
        req: &PermitRequest,
        metadata: &[u8],
    ) -> Result<Attempt> {
        self.semaphore_attempt(name, step, req, Some(metadata))
            .await
    }

    async fn inspect(&self, name: &str) -> Result<ClaimRecord> {
        const OP: &str = "semaphore inspect";
        let n = name.to_string();
        let rows = self
            .query(OP, &self.sql.semaphore_inspect, &[(&n, Type::TEXT)])
            .await?;
        let mut holders = Vec::with_capacity(rows.len());
        let mut waiters = 0;
        for r in &rows {
            let queued: i64 = r.try_get(5).map_err(|e| map_pg(OP, e))?;
            waiters = u64::try_from(queued).unwrap_or(0);
            // No grant: the one row of the outer join, all NULL.
            let Some(owner) = r
                .try_get::<_, Option<Vec<u8>>>(0)
                .map_err(|e| map_pg(OP, e))?
            else {
                continue;
            };
            let fencing: i64 = r.try_get(1).map_err(|e| map_pg(OP, e))?;
            let us: i64 = r.try_get(2).map_err(|e| map_pg(OP, e))?;
            let metadata: Option<Vec<u8>> = r.try_get(3).map_err(|e| map_pg(OP, e))?;
            let permits: i32 = r.try_get(4).map_err(|e| map_pg(OP, e))?;
            holders.push(HolderRecord {
                owner: owner_token(OP, &owner)?,
                token: token(fencing),
                remaining: Some(from_micros(us)),
                metadata,
                permits: u32::try_from(permits).unwrap_or(0),
            });
        }
        Ok(ClaimRecord {
            holders,
            waiters: Some(waiters),
        })
    }

    async fn release(&self, name: &str, step: Step) -> Result<bool> {
        const OP: &str = "semaphore release";
        let n = name.to_string();
        let o: &[u8] = step.owner.as_bytes();
        let left_ttl = micros_ceil(SEMAPHORE_LEFT_TTL);
        // A mark only when the step says so (a step of this owner went
        // unanswered).
        let left = step.mark.then_some(step.stamp);
        let params: [(&(dyn ToSql + Sync), Type); 5] = [
            (&n, Type::TEXT),
            (&o, Type::BYTEA),
            (&self.channel, Type::TEXT),
            (&left, Type::INT8),
            (&left_ttl, Type::INT8),
        ];
        let rows = self.query(OP, &self.sql.semaphore_release, &params).await?;
        let row = rows.first().ok_or_else(|| unexpected(OP))?;
        row.try_get(0).map_err(|e| map_pg(OP, e))
    }

    async fn extend(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        const OP: &str = "semaphore extend";
        let n = name.to_string();
        let o: &[u8] = step.owner.as_bytes();
        let ttl = micros_ceil(ttl);
        // A step of its owner (`coord_core::late`; see `semaphore_extend`):
        // refused if stamped before its mark, marking when the step says so.
        let left_ttl = step.mark.then(|| micros_ceil(SEMAPHORE_LEFT_TTL));
        let rows = self
            .query(
                OP,
                &self.sql.semaphore_extend,
                &[
                    (&n, Type::TEXT),
                    (&o, Type::BYTEA),
                    (&ttl, Type::INT8),
                    (&step.stamp, Type::INT8),
                    (&left_ttl, Type::INT8),
                ],
            )
            .await?;
        extend_answer(OP, &rows)
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        const OP: &str = "semaphore force release";
        let n = name.to_string();
        let rows = self
            .query(
                OP,
                &self.sql.semaphore_force_release,
                &[(&n, Type::TEXT), (&self.channel, Type::TEXT)],
            )
            .await?;
        let row = rows.first().ok_or_else(|| unexpected(OP))?;
        row.try_get(0).map_err(|e| map_pg(OP, e))
    }

    async fn subscribe(&self, name: &str, owner: &OwnerToken) -> Result<Waiter> {
        if self.caps.notifications {
            Ok(self.wakeups.subscribe(&waiter_key(name, owner)))
        } else {
            Ok(Waiter::never())
        }
    }
}
