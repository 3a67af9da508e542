//! Work queues through the simulated network (see [`crate::store`]).
//! A pop whose outcome its caller never saw is abandoned by coord-core
//! (`Queue::abandon`, sent through the network like any step): what it
//! delivered comes back uncounted, and a copy landing later delivers
//! nothing.

use std::time::Duration;

use coord_core::queue_backend::{
    Lane, Message, MessageId, NewMessage, PopAttempt, Pushed, Queue, QueueConfig, QueueStats,
};
use coord_core::wake::Waiter;
use coord_core::{Capabilities, OwnerToken, Result, async_trait};

use crate::store::SimStore;
use crate::world::short;

/// A pop's reply for the trace: no wall-clock enqueue time.
fn show_pop(p: &PopAttempt) -> String {
    match p {
        PopAttempt::Delivered { message, token } => format!(
            "Delivered(id={} attempts={} token={})",
            message.id, message.attempts, token.0
        ),
        PopAttempt::Empty { next_in } => format!("Empty({next_in:?})"),
    }
}

/// A peek's reply for the trace: the ids.
fn show_messages(ms: &[Message]) -> String {
    let ids: Vec<u64> = ms.iter().map(|m| m.id.0).collect();
    format!("{ids:?}")
}

#[async_trait]
impl Queue for SimStore {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn push(&self, queue: &str, message: &NewMessage<'_>) -> Result<Pushed> {
        let (q, payload) = (queue.to_string(), message.payload.to_vec());
        let (delay, window) = (message.delay, message.dedup_window);
        let group = message.group.map(str::to_string);
        let dedup = message.dedup_id.map(str::to_string);
        let what = format!("queue.push {queue} dedup={dedup:?}");
        self.call(what, move |s| {
            Box::pin(async move {
                let m = NewMessage {
                    payload: &payload,
                    delay,
                    group: group.as_deref(),
                    dedup_id: dedup.as_deref(),
                    dedup_window: window,
                };
                Queue::push(&*s, &q, &m).await
            })
        })
        .await
    }

    async fn try_pop(
        &self,
        queue: &str,
        lane: Lane,
        consumer: &OwnerToken,
        visibility: Duration,
        config: &QueueConfig,
    ) -> Result<PopAttempt> {
        let (q, o, cfg) = (queue.to_string(), *consumer, *config);
        let what = format!(
            "queue.pop {queue} {} vis={}ms",
            short(consumer),
            visibility.as_millis()
        );
        self.call_shown(what, show_pop, move |s| {
            Box::pin(async move { Queue::try_pop(&*s, &q, lane, &o, visibility, &cfg).await })
        })
        .await
    }

    async fn ack(
        &self,
        queue: &str,
        lane: Lane,
        id: MessageId,
        consumer: &OwnerToken,
    ) -> Result<bool> {
        let (q, o) = (queue.to_string(), *consumer);
        let what = format!("queue.ack {queue} id={id} {}", short(consumer));
        self.call(what, move |s| {
            Box::pin(async move { Queue::ack(&*s, &q, lane, id, &o).await })
        })
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
        let (q, o) = (queue.to_string(), *consumer);
        let what = format!("queue.nack {queue} id={id} {}", short(consumer));
        self.call(what, move |s| {
            Box::pin(async move { Queue::nack(&*s, &q, lane, id, &o, delay).await })
        })
        .await
    }

    async fn abandon(&self, queue: &str, lane: Lane, consumer: &OwnerToken) -> Result<()> {
        let (q, o) = (queue.to_string(), *consumer);
        let what = format!("queue.abandon {queue} {}", short(consumer));
        self.call(what, move |s| {
            Box::pin(async move { Queue::abandon(&*s, &q, lane, &o).await })
        })
        .await
    }

    async fn extend(
        &self,
        queue: &str,
        lane: Lane,
        id: MessageId,
        consumer: &OwnerToken,
        visibility: Duration,
    ) -> Result<bool> {
        let (q, o) = (queue.to_string(), *consumer);
        let what = format!(
            "queue.extend {queue} id={id} {} vis={}ms",
            short(consumer),
            visibility.as_millis()
        );
        // As the networked stores do, a late copy of an extend is refused
        // once a later extend of the same consumer on the message was
        // applied: every extend leaves its stamp as the delivery's mark.
        let name = format!("queue {queue} {} {id}", lane.as_str());
        let step = coord_core::Step {
            mark: true,
            ..o.step()
        };
        self.step(&name, step, what, move |s, _, o| async move {
            Queue::extend(&*s, &q, lane, id, &o, visibility).await
        })
        .await
    }

    async fn peek(&self, queue: &str, lane: Lane, limit: usize) -> Result<Vec<Message>> {
        let q = queue.to_string();
        self.call_shown(
            format!("queue.peek {queue}"),
            |ms: &Vec<Message>| show_messages(ms),
            move |s| Box::pin(async move { Queue::peek(&*s, &q, lane, limit).await }),
        )
        .await
    }

    async fn redrive(&self, queue: &str, limit: usize) -> Result<u64> {
        let q = queue.to_string();
        self.call(format!("queue.redrive {queue}"), move |s| {
            Box::pin(async move { Queue::redrive(&*s, &q, limit).await })
        })
        .await
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats> {
        let q = queue.to_string();
        self.call(format!("queue.stats {queue}"), move |s| {
            Box::pin(async move { Queue::stats(&*s, &q).await })
        })
        .await
    }

    async fn purge(&self, queue: &str) -> Result<u64> {
        let q = queue.to_string();
        self.call(format!("queue.purge {queue}"), move |s| {
            Box::pin(async move { Queue::purge(&*s, &q).await })
        })
        .await
    }

    async fn subscribe(&self, queue: &str, lane: Lane) -> Result<Waiter> {
        Queue::subscribe(&*self.store, queue, lane).await
    }
}
