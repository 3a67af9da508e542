//! Work queues (`src/sql/queue.sql`): the delivery rule of
//! [`coord_core::queue_backend`] with turns kept per message, in one
//! function call per step; no step locks the whole queue (a pop skips the
//! messages other pops hold locked).
//!
//! Each step is one round trip: push, pop, ack, nack, redrive and purge
//! call their function (committed asynchronously, so no row lock is
//! held across a WAL flush), pipelined with a second transaction
//! that commits durably and so flushes the step before it is reported
//! (for a pop, only when it delivered); extend is one function call
//! under the message's row lock, committed durably; peek and stats one
//! `SELECT`. No session state, so it works
//! through PgBouncer in transaction mode, where waiters poll (an empty pop
//! tells them when the lane's next delay or deadline runs out).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use coord_core::wake::Waiter;
use coord_core::{
    Capabilities, Error, Lane, Message, MessageId, NewMessage, OwnerToken, PopAttempt, Pushed,
    Queue, QueueConfig, QueueStats, Result, async_trait,
};
use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use super::errors::{map_pg, unexpected};
use super::{BACKEND, PostgresBackend, from_micros, micros_ceil, token};

/// The most messages one step makes ready (delayed messages and lapsed
/// deliveries whose time came): when more came due, a pop makes this many
/// ready and tells the consumer to come back at once, so no step runs
/// into the call timeout (which would roll it back, for ever).
const ADVANCE_BATCH: i32 = 5000;

/// The most messages one pop moves to the dead lane, the same way.
const DEAD_BATCH: i32 = 200;

/// The most rows one purge step deletes (it repeats until done).
const PURGE_BATCH: i32 = 5000;

/// The lane as stored: 0 main, 1 dead.
fn lane_code(lane: Lane) -> i16 {
    match lane {
        Lane::Main => 0,
        Lane::Dead => 1,
    }
}

/// A stored count or id as `u64` (never negative in the store).
fn unsigned(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn epoch_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH
        .checked_add(Duration::from_millis(unsigned(ms)))
        .unwrap_or(UNIX_EPOCH)
}

fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    op: &'static str,
    row: &'a Row,
    i: usize,
) -> Result<T> {
    row.try_get(i).map_err(|e| map_pg(op, e))
}

/// A message from columns id, payload, grp, attempts, enqueued ms.
fn message(op: &'static str, row: &Row) -> Result<Message> {
    let id: i64 = get(op, row, 0)?;
    let payload: Vec<u8> = get(op, row, 1)?;
    let group: String = get(op, row, 2)?;
    let attempts: i32 = get(op, row, 3)?;
    let enqueued: i64 = get(op, row, 4)?;
    Ok(Message {
        id: MessageId(unsigned(id)),
        payload,
        group: (!group.is_empty()).then_some(group),
        attempts: u32::try_from(attempts).unwrap_or(0),
        enqueued_at: epoch_ms(enqueued),
    })
}

fn limit_of(op: &'static str, limit: usize) -> Result<i32> {
    i32::try_from(limit).map_err(|_| Error::Store {
        backend: BACKEND,
        operation: op,
        message: format!("limit {limit} out of range"),
        source: None,
    })
}

impl PostgresBackend {
    /// Run a step's function, then make it durable in the same round trip.
    async fn queue_step(
        &self,
        op: &'static str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Row> {
        let (rows, _) = self
            .query_then(op, sql, params, Some((&self.sql.queue_durable, &[])))
            .await?;
        rows.into_iter().next().ok_or_else(|| unexpected(op))
    }

    /// A one-boolean step (ack, nack).
    async fn queue_flag(
        &self,
        op: &'static str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<bool> {
        let row = self.queue_step(op, sql, params).await?;
        let done: Option<bool> = get(op, &row, 0)?;
        Ok(done.unwrap_or(false))
    }
}

/// Work queues on PostgreSQL: turns kept per message (exact order across
/// groups for one consumer at a time, bounded under concurrency; distinct
/// messages for concurrent consumers, which do not wait for each other),
/// fencing tokens from the schema's sequence,
/// messages and tokens durable before they are reported, NOTIFY on push,
/// nack, redrive and ack.
#[async_trait]
impl Queue for PostgresBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn durable(&self) -> bool {
        true
    }

    async fn push(&self, queue: &str, message: &NewMessage<'_>) -> Result<Pushed> {
        const OP: &str = "queue push";
        let q = queue.to_string();
        let payload: &[u8] = message.payload;
        let delay = micros_ceil(message.delay);
        let group = message.group.unwrap_or("").to_string();
        let dedup: Option<String> = message.dedup_id.map(str::to_string);
        let window = micros_ceil(message.dedup_window);
        let row = self
            .queue_step(
                OP,
                &self.sql.queue_push,
                &[
                    (&q, Type::TEXT),
                    (&payload, Type::BYTEA),
                    (&delay, Type::INT8),
                    (&group, Type::TEXT),
                    (&dedup, Type::TEXT),
                    (&window, Type::INT8),
                    (&self.channel, Type::TEXT),
                ],
            )
            .await?;
        let id: Option<i64> = get(OP, &row, 0)?;
        let duplicate: Option<bool> = get(OP, &row, 1)?;
        let id = id.ok_or_else(|| unexpected(OP))?;
        self.after_write();
        Ok(Pushed {
            id: MessageId(unsigned(id)),
            duplicate: duplicate.unwrap_or(false),
        })
    }

    async fn try_pop(
        &self,
        queue: &str,
        lane: Lane,
        consumer: &OwnerToken,
        visibility: Duration,
        config: &QueueConfig,
    ) -> Result<PopAttempt> {
        const OP: &str = "queue pop";
        let q = queue.to_string();
        let l = lane_code(lane);
        let o: &[u8] = consumer.as_bytes();
        let vis = micros_ceil(visibility);
        let max: Option<i64> = config.max_deliveries.map(i64::from);
        let durable: &[(&(dyn ToSql + Sync), Type)] = &[(&o, Type::BYTEA)];
        let (rows, flushed) = self
            .query_then(
                OP,
                &self.sql.queue_pop,
                &[
                    (&q, Type::TEXT),
                    (&l, Type::INT2),
                    (&o, Type::BYTEA),
                    (&vis, Type::INT8),
                    (&max, Type::INT8),
                    (&config.ordered_groups, Type::BOOL),
                    (&ADVANCE_BATCH, Type::INT4),
                    (&DEAD_BATCH, Type::INT4),
                ],
                Some((&self.sql.queue_pop_durable, durable)),
            )
            .await?;
        let row = rows.first().ok_or_else(|| unexpected(OP))?;
        let id: Option<i64> = get(OP, row, 0)?;
        if id.is_none() {
            let next: Option<i64> = get(OP, row, 6)?;
            return Ok(PopAttempt::Empty {
                next_in: next.map(from_micros),
            });
        }
        if flushed.is_empty() {
            // The durable statement ran before the delivery was visible
            // to it (another server connection behind a pooler): flush
            // now, before anybody relies on the token.
            self.query(OP, &self.sql.queue_durable, &[]).await?;
        }
        let message = message(OP, row)?;
        let tok: Option<i64> = get(OP, row, 5)?;
        let tok = tok.ok_or_else(|| unexpected(OP))?;
        self.after_write();
        Ok(PopAttempt::Delivered {
            message,
            token: token(tok),
        })
    }

    async fn ack(
        &self,
        queue: &str,
        lane: Lane,
        id: MessageId,
        consumer: &OwnerToken,
    ) -> Result<bool> {
        const OP: &str = "queue ack";
        let q = queue.to_string();
        let l = lane_code(lane);
        let Ok(i) = i64::try_from(id.0) else {
            return Ok(false);
        };
        let o: &[u8] = consumer.as_bytes();
        self.queue_flag(
            OP,
            &self.sql.queue_ack,
            &[
                (&q, Type::TEXT),
                (&l, Type::INT2),
                (&i, Type::INT8),
                (&o, Type::BYTEA),
                (&self.channel, Type::TEXT),
            ],
        )
        .await
    }

    async fn nack(
        &self,
        queue: &str,
        lane: Lane,
        id: MessageId,
        consumer: &OwnerToken,
        delay: Duration,
    ) -> Result<bool> {
        const OP: &str = "queue nack";
        let q = queue.to_string();
        let l = lane_code(lane);
        let Ok(i) = i64::try_from(id.0) else {
            return Ok(false);
        };
        let o: &[u8] = consumer.as_bytes();
        let d = micros_ceil(delay);
        self.queue_flag(
            OP,
            &self.sql.queue_nack,
            &[
                (&q, Type::TEXT),
                (&l, Type::INT2),
                (&i, Type::INT8),
                (&o, Type::BYTEA),
                (&d, Type::INT8),
                (&self.channel, Type::TEXT),
            ],
        )
        .await
    }

    async fn abandon(&self, queue: &str, lane: Lane, consumer: &OwnerToken) -> Result<()> {
        const OP: &str = "queue abandon";
        let q = queue.to_string();
        let l = lane_code(lane);
        let o: &[u8] = consumer.as_bytes();
        let keep = micros_ceil(coord_core::ABANDONED_POP_MEMORY.max(self.call_timeout * 2));
        self.queue_step(
            OP,
            &self.sql.queue_abandon,
            &[
                (&q, Type::TEXT),
                (&l, Type::INT2),
                (&o, Type::BYTEA),
                (&keep, Type::INT8),
                (&self.channel, Type::TEXT),
            ],
        )
        .await?;
        Ok(())
    }

    async fn extend(
        &self,
        queue: &str,
        lane: Lane,
        id: MessageId,
        consumer: &OwnerToken,
        visibility: Duration,
    ) -> Result<bool> {
        const OP: &str = "queue extend";
        let q = queue.to_string();
        let l = lane_code(lane);
        let Ok(i) = i64::try_from(id.0) else {
            return Ok(false);
        };
        let o: &[u8] = consumer.as_bytes();
        let vis = micros_ceil(visibility);
        let stamp = coord_core::late::stamp();
        let rows = self
            .query(
                OP,
                &self.sql.queue_extend,
                &[
                    (&q, Type::TEXT),
                    (&l, Type::INT2),
                    (&i, Type::INT8),
                    (&o, Type::BYTEA),
                    (&vis, Type::INT8),
                    (&stamp, Type::INT8),
                ],
            )
            .await?;
        let row = rows.first().ok_or_else(|| unexpected(OP))?;
        match get::<Option<i16>>(OP, row, 0)? {
            Some(2) => Err(coord_core::late::superseded(BACKEND, OP)),
            done => Ok(done == Some(1)),
        }
    }

    async fn peek(&self, queue: &str, lane: Lane, limit: usize) -> Result<Vec<Message>> {
        const OP: &str = "queue peek";
        let q = queue.to_string();
        let l = lane_code(lane);
        let n = i64::from(limit_of(OP, limit)?);
        let rows = self
            .query(
                OP,
                &self.sql.queue_peek,
                &[(&q, Type::TEXT), (&l, Type::INT2), (&n, Type::INT8)],
            )
            .await?;
        rows.iter().map(|r| message(OP, r)).collect()
    }

    async fn redrive(&self, queue: &str, limit: usize) -> Result<u64> {
        const OP: &str = "queue redrive";
        let q = queue.to_string();
        let n = limit_of(OP, limit)?;
        let row = self
            .queue_step(
                OP,
                &self.sql.queue_redrive,
                &[
                    (&q, Type::TEXT),
                    (&n, Type::INT4),
                    (&self.channel, Type::TEXT),
                ],
            )
            .await?;
        let moved: Option<i64> = get(OP, &row, 0)?;
        Ok(unsigned(moved.unwrap_or(0)))
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats> {
        const OP: &str = "queue stats";
        let q = queue.to_string();
        let rows = self
            .query(OP, &self.sql.queue_stats, &[(&q, Type::TEXT)])
            .await?;
        let row = rows.first().ok_or_else(|| unexpected(OP))?;
        let count = |i: usize| -> Result<u64> { Ok(unsigned(get::<i64>(OP, row, i)?)) };
        Ok(QueueStats {
            ready: count(0)?,
            delayed: count(1)?,
            in_flight: count(2)?,
            dead: count(3)?,
        })
    }

    /// In steps of up to 5,000 messages (then dedup ids), each its own
    /// transaction, until the queue has none: a
    /// queue with fewer is purged atomically; a message pushed while a
    /// larger one is purged may or may not be deleted.
    async fn purge(&self, queue: &str) -> Result<u64> {
        const OP: &str = "queue purge";
        let q = queue.to_string();
        let mut total = 0;
        loop {
            let row = self
                .queue_step(
                    OP,
                    &self.sql.queue_purge,
                    &[(&q, Type::TEXT), (&PURGE_BATCH, Type::INT4)],
                )
                .await?;
            let n: Option<i64> = get(OP, &row, 0)?;
            let done: Option<bool> = get(OP, &row, 1)?;
            total += unsigned(n.unwrap_or(0));
            if done.unwrap_or(true) {
                return Ok(total);
            }
        }
    }

    async fn subscribe(&self, queue: &str, lane: Lane) -> Result<Waiter> {
        // The key is the NOTIFY payload `queue:<lane>:<queue>`.
        Ok(self.waiter("queue", &format!("{}:{queue}", lane.as_str())))
    }
}
