//! The parts of every queue step: how a step runs and is made durable
//! with its wake-up, one pop attempt, and the rows' columns as coord
//! types.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use coord_core::{Error, Lane, Message, MessageId, OwnerToken, PopAttempt, QueueConfig, Result};
use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use super::super::call::Params;
use super::super::errors::{map_pg, unexpected};
use super::super::{BACKEND, PostgresBackend, from_micros, micros_ceil, token};

/// The most messages one step makes ready (delayed messages and lapsed
/// deliveries whose time came): when more came due, a pop makes this many
/// ready and tells the consumer to come back at once, so no step runs
/// into the call timeout (which would roll it back, for ever).
pub(super) const ADVANCE_BATCH: i32 = 5000;

/// The most messages one pop moves to the dead lane, the same way.
pub(super) const DEAD_BATCH: i32 = 200;

/// How long a pop from a client with a waiter on a lane keeps wake-ups
/// sent for that lane (renewed by its empty pops once half of it is
/// left). A waiter polling less often than this may miss wake-ups and
/// then find messages by its polling.
const WAIT_MARK: Duration = Duration::from_secs(60);

/// The wake-up a step sends if somebody waits on its lane (see
/// `queue_durable_wake` in `src/sql.rs`).
pub(super) struct Wake<'a> {
    pub(super) queue: &'a str,
    pub(super) lane: Lane,
    /// `queue` (one waiter per client) or `queue-all` (every waiter).
    pub(super) kind: &'static str,
    /// Only if the lane has a ready message.
    pub(super) ready_only: bool,
}

impl Wake<'_> {
    /// Run `queue_durable_wake` for this wake-up: after `first` (a step,
    /// in the same round trip) when given, else alone. Returns the rows
    /// of `first`, or of the wake-up.
    async fn run(
        &self,
        b: &PostgresBackend,
        op: &'static str,
        first: Option<(&str, Params<'_>)>,
    ) -> Result<Vec<Row>> {
        let q = self.queue.to_string();
        let lane = lane_code(self.lane);
        let payload = format!("{}:{}:{}", self.kind, self.lane.as_str(), self.queue);
        let wake: &[(&(dyn ToSql + Sync), Type)] = &[
            (&q, Type::TEXT),
            (&lane, Type::INT2),
            (&b.channel, Type::TEXT),
            (&payload, Type::TEXT),
            (&self.ready_only, Type::BOOL),
        ];
        match first {
            Some((sql, params)) => Ok(b
                .query_then(op, sql, params, Some((&b.sql.queue_durable_wake, wake)))
                .await?
                .0),
            None => b.query(op, &b.sql.queue_durable_wake, wake).await,
        }
    }
}

/// The lane as stored: 0 main, 1 dead.
pub(super) fn lane_code(lane: Lane) -> i16 {
    match lane {
        Lane::Main => 0,
        Lane::Dead => 1,
    }
}

/// A stored count or id as `u64` (never negative in the store).
pub(super) fn unsigned(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn epoch_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH
        .checked_add(Duration::from_millis(unsigned(ms)))
        .unwrap_or(UNIX_EPOCH)
}

pub(super) fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    op: &'static str,
    row: &'a Row,
    i: usize,
) -> Result<T> {
    row.try_get(i).map_err(|e| map_pg(op, e))
}

/// A message from columns id, payload, grp, attempts, enqueued ms.
pub(super) fn message(op: &'static str, row: &Row) -> Result<Message> {
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

pub(super) fn limit_of(op: &'static str, limit: usize) -> Result<i32> {
    i32::try_from(limit).map_err(|_| Error::Store {
        backend: BACKEND,
        operation: op,
        message: format!("limit {limit} out of range"),
        source: None,
    })
}

impl PostgresBackend {
    /// Run a step's function, then make it durable in the same round trip
    /// and send its wake-up, if any.
    pub(super) async fn queue_step(
        &self,
        op: &'static str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
        wake: Option<Wake<'_>>,
    ) -> Result<Row> {
        let rows = match wake {
            None => {
                self.query_then(op, sql, params, Some((&self.sql.queue_durable, &[])))
                    .await?
                    .0
            }
            Some(w) => w.run(self, op, Some((sql, params))).await?,
        };
        rows.into_iter().next().ok_or_else(|| unexpected(op))
    }

    /// A one-boolean step (ack, nack).
    pub(super) async fn queue_flag(
        &self,
        op: &'static str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
        wake: Wake<'_>,
    ) -> Result<bool> {
        let row = self.queue_step(op, sql, params, Some(wake)).await?;
        let done: Option<bool> = get(op, &row, 0)?;
        Ok(done.unwrap_or(false))
    }

    /// After a pop moved messages to the dead lane (committed): wake that
    /// lane's waiters as a step does (durably, and only while somebody
    /// waits there). A failure leaves them to their polling, and is not
    /// the pop's.
    async fn wake_dead_lane(&self, queue: &str) {
        let wake = Wake {
            queue,
            lane: Lane::Dead,
            kind: "queue",
            ready_only: true,
        };
        if let Err(e) = wake.run(self, "queue pop", None).await {
            tracing::debug!(error = %e, "could not wake the dead lane's waiters");
        }
    }

    /// One pop attempt (see [`Queue::try_pop`]); `Ok(None)`: empty, after
    /// writing the lane's waiting mark (new or renewed), so the caller
    /// looks again.
    pub(super) async fn pop_once(
        &self,
        queue: &str,
        lane: Lane,
        consumer: &OwnerToken,
        visibility: Duration,
        config: &QueueConfig,
    ) -> Result<Option<PopAttempt>> {
        const OP: &str = "queue pop";
        let q = queue.to_string();
        let l = lane_code(lane);
        let o: &[u8] = consumer.as_bytes();
        let vis = micros_ceil(visibility);
        let max: Option<i64> = config.max_deliveries.map(i64::from);
        let waited_on = || {
            let key = Self::key("queue", &format!("{}:{queue}", lane.as_str()));
            self.wakeups.has_waiters(&key)
        };
        let wait: i64 = if self.caps.notifications && waited_on() {
            micros_ceil(WAIT_MARK)
        } else {
            0
        };
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
                    (&wait, Type::INT8),
                ],
                Some((&self.sql.queue_pop_durable, durable)),
            )
            .await?;
        let row = rows.first().ok_or_else(|| unexpected(OP))?;
        let dead: Option<i32> = get(OP, row, 8)?;
        if dead.unwrap_or(0) > 0 {
            self.wake_dead_lane(queue).await;
        }
        let id: Option<i64> = get(OP, row, 0)?;
        if id.is_none() {
            let marked: Option<bool> = get(OP, row, 7)?;
            if marked == Some(true) {
                return Ok(None);
            }
            let next: Option<i64> = get(OP, row, 6)?;
            return Ok(Some(PopAttempt::Empty {
                next_in: next.map(from_micros),
            }));
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
        Ok(Some(PopAttempt::Delivered {
            message,
            token: token(tok),
        }))
    }
}
