//! Work queues (`src/sql/queue.sql`): the delivery rule of
//! [`coord_core::queue_backend`] with turns kept per message, in one
//! function call per step; no step locks the whole queue (a pop skips the
//! messages other pops hold locked).
//!
//! Each step is one round trip: push, pop, ack, nack, redrive and purge
//! call their function (committed asynchronously, so no row lock is
//! held across a WAL flush), pipelined with a second transaction
//! that commits durably and so flushes the step before it is reported
//! (for a pop, only when it delivered), and that sends the step's
//! wake-up if somebody waits on the lane; extend is one function call
//! under the message's row lock, committed durably; peek and stats one
//! `SELECT`. No session state, so it works
//! through PgBouncer in transaction mode, where waiters poll (an empty pop
//! tells them when the lane's next delay or deadline runs out).
//!
//! Wake-ups are sent only while somebody waits on the lane: a pop from a
//! client with a waiter there that finds nothing marks the lane for
//! [`WAIT_MARK`], and a pop that wrote the mark (new or renewed) looks
//! again at once, so no message committed meanwhile goes unnoticed (the
//! argument is in `src/sql/queue.sql`). A `NOTIFY` locks the whole
//! database at commit: a busy queue that nobody waits on sends none.

mod steps;

use std::time::Duration;

use coord_core::wake::Waiter;
use coord_core::{
    Capabilities, Lane, Message, MessageId, NewMessage, OwnerToken, PopAttempt, Pushed, Queue,
    QueueConfig, QueueStats, Result, async_trait,
};
use tokio_postgres::types::Type;

use super::errors::unexpected;
use super::{BACKEND, PostgresBackend, micros_ceil};
use steps::{Wake, get, lane_code, limit_of, message, unsigned};

/// The most rows one purge step deletes (it repeats until done).
const PURGE_BATCH: i32 = 5000;

/// Work queues on PostgreSQL: turns kept per message (exact order across
/// groups for one consumer at a time, bounded under concurrency; distinct
/// messages for concurrent consumers, which do not wait for each other),
/// fencing tokens from the schema's sequence,
/// messages and tokens durable before they are reported, NOTIFY on push,
/// nack, redrive, ack and give-back while somebody waits on the lane.
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
        // A delayed message too: a waiter learns when it comes due.
        let wake = Some(Wake {
            queue,
            lane: Lane::Main,
            kind: "queue",
            ready_only: delay <= 0,
        });
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
                ],
                wake,
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
        // A pop that marked the lane looks again, once: with the mark
        // committed, a message committed after its first look is either
        // seen now or woken for.
        if let Some(done) = self
            .pop_once(queue, lane, consumer, visibility, config)
            .await?
        {
            return Ok(done);
        }
        Ok(self
            .pop_once(queue, lane, consumer, visibility, config)
            .await?
            .unwrap_or(PopAttempt::Empty { next_in: None }))
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
        // An ordered group's next message may be deliverable now.
        let wake = Wake {
            queue,
            lane,
            kind: "queue",
            ready_only: true,
        };
        self.queue_flag(
            OP,
            &self.sql.queue_ack,
            &[
                (&q, Type::TEXT),
                (&l, Type::INT2),
                (&i, Type::INT8),
                (&o, Type::BYTEA),
            ],
            wake,
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
        // With a delay too: a waiter learns when the message comes due.
        let wake = Wake {
            queue,
            lane,
            kind: "queue",
            ready_only: false,
        };
        self.queue_flag(
            OP,
            &self.sql.queue_nack,
            &[
                (&q, Type::TEXT),
                (&l, Type::INT2),
                (&i, Type::INT8),
                (&o, Type::BYTEA),
                (&d, Type::INT8),
            ],
            wake,
        )
        .await
    }

    async fn abandon(&self, queue: &str, lane: Lane, consumer: &OwnerToken) -> Result<()> {
        const OP: &str = "queue abandon";
        let q = queue.to_string();
        let l = lane_code(lane);
        let o: &[u8] = consumer.as_bytes();
        let keep = micros_ceil(coord_core::ABANDONED_POP_MEMORY.max(self.call_timeout * 2));
        // A delivery given back is ready again.
        let wake = Wake {
            queue,
            lane,
            kind: "queue",
            ready_only: true,
        };
        self.queue_step(
            OP,
            &self.sql.queue_abandon,
            &[
                (&q, Type::TEXT),
                (&l, Type::INT2),
                (&o, Type::BYTEA),
                (&keep, Type::INT8),
            ],
            Some(wake),
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
                &[(&q, Type::TEXT), (&n, Type::INT4)],
                Some(Wake {
                    queue,
                    lane: Lane::Main,
                    kind: "queue-all",
                    ready_only: true,
                }),
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
                    None,
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
