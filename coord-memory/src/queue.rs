//! Work queues in memory: [`coord_core::Queue`] over
//! [`coord_core::queue_state::QueueState`], the reference model of
//! [`coord_core::queue_backend`]'s delivery rule. This file only locks the
//! queue's shard, reads the clock, hands out ids and tokens and wakes
//! waiters; the rules are the state machine's.
//!
//! Message ids come from the store's one counter (the fencing tokens'), so
//! they keep rising after a purge or after an idle queue's entry is swept.

use std::time::{Duration, SystemTime};

use coord_core::queue_state::{Ack, QueueState};
use coord_core::wake::Waiter;
use coord_core::{
    Capabilities, Lane, Message, MessageId, NewMessage, OwnerToken, PopAttempt, Pushed,
    QueueConfig, QueueStats, Result, async_trait,
};
use tokio::time::Instant;

use crate::MemoryBackend;

fn wake_key(queue: &str, lane: Lane) -> String {
    format!("{}\u{0}{queue}", lane.as_str())
}

#[async_trait]
impl coord_core::Queue for MemoryBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn push(&self, queue: &str, message: &NewMessage<'_>) -> Result<Pushed> {
        let now = Instant::now();
        let pushed = {
            let mut shard = self.queues.shard(queue);
            let q = shard.entry(queue, QueueState::default, |q| q.is_idle(now));
            q.push(now, message, SystemTime::now(), || self.next_token())
        };
        if pushed.duplicate {
            return Ok(pushed);
        }
        // A delayed push wakes a waiter too: its next attempt learns when
        // the message comes due (`next_in`) instead of at its next poll.
        self.queue_wakeups.notify_one(&wake_key(queue, Lane::Main));
        Ok(pushed)
    }

    async fn try_pop(
        &self,
        queue: &str,
        lane: Lane,
        consumer: &OwnerToken,
        visibility: Duration,
        config: &QueueConfig,
    ) -> Result<PopAttempt> {
        let now = Instant::now();
        let (attempt, dead_lettered) = {
            let mut shard = self.queues.shard(queue);
            let Some(q) = shard.map.get_mut(queue) else {
                return Ok(PopAttempt::Empty { next_in: None });
            };
            let dead = q.dead_len();
            let attempt = q.pop(now, lane, consumer, visibility, config, || {
                self.next_token()
            });
            (attempt, q.dead_len() > dead)
        };
        if dead_lettered {
            // The dead lane's waiters may take what this pop moved there.
            self.queue_wakeups.notify_one(&wake_key(queue, Lane::Dead));
        }
        Ok(attempt)
    }

    async fn ack(
        &self,
        queue: &str,
        lane: Lane,
        id: MessageId,
        consumer: &OwnerToken,
    ) -> Result<bool> {
        let now = Instant::now();
        let acked = {
            let mut shard = self.queues.shard(queue);
            let Some(q) = shard.map.get_mut(queue) else {
                return Ok(false);
            };
            q.ack(now, lane, id, consumer)
        };
        match acked {
            Ack::Refused => Ok(false),
            Ack::Deleted { group_has_more } => {
                if group_has_more {
                    // An ordered group may deliver its next message now.
                    self.queue_wakeups.notify_one(&wake_key(queue, lane));
                }
                Ok(true)
            }
        }
    }

    async fn nack(
        &self,
        queue: &str,
        lane: Lane,
        id: MessageId,
        consumer: &OwnerToken,
        delay: Duration,
    ) -> Result<bool> {
        let now = Instant::now();
        {
            let mut shard = self.queues.shard(queue);
            let Some(q) = shard.map.get_mut(queue) else {
                return Ok(false);
            };
            if !q.nack(now, lane, id, consumer, delay) {
                return Ok(false);
            }
        }
        // With a delay too, so a waiter learns when it comes due.
        self.queue_wakeups.notify_one(&wake_key(queue, lane));
        Ok(true)
    }

    async fn abandon(&self, queue: &str, lane: Lane, consumer: &OwnerToken) -> Result<()> {
        let now = Instant::now();
        let gave_back = {
            let mut shard = self.queues.shard(queue);
            let q = shard.entry(queue, QueueState::default, |q| q.is_idle(now));
            q.abandon(now, lane, consumer)
        };
        if gave_back {
            self.queue_wakeups.notify_one(&wake_key(queue, lane));
        }
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
        let now = Instant::now();
        let mut shard = self.queues.shard(queue);
        let Some(q) = shard.map.get_mut(queue) else {
            return Ok(false);
        };
        Ok(q.extend(now, lane, id, consumer, visibility))
    }

    async fn peek(&self, queue: &str, lane: Lane, limit: usize) -> Result<Vec<Message>> {
        let shard = self.queues.shard(queue);
        Ok(shard
            .map
            .get(queue)
            .map_or_else(Vec::new, |q| q.peek(lane, limit)))
    }

    async fn redrive(&self, queue: &str, limit: usize) -> Result<u64> {
        let now = Instant::now();
        let moved = {
            let mut shard = self.queues.shard(queue);
            let Some(q) = shard.map.get_mut(queue) else {
                return Ok(0);
            };
            q.redrive(now, limit)
        };
        if moved > 0 {
            self.queue_wakeups.notify_all(&wake_key(queue, Lane::Main));
        }
        Ok(moved)
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats> {
        let now = Instant::now();
        let shard = self.queues.shard(queue);
        Ok(shard
            .map
            .get(queue)
            .map_or_else(QueueStats::default, |q| q.stats(now)))
    }

    async fn purge(&self, queue: &str) -> Result<u64> {
        let mut shard = self.queues.shard(queue);
        Ok(shard.map.remove(queue).map_or(0, |q| q.messages()))
    }

    async fn subscribe(&self, queue: &str, lane: Lane) -> Result<Waiter> {
        Ok(self.queue_wakeups.subscribe(&wake_key(queue, lane)))
    }
}
