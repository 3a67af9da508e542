//! Work queues.

use std::time::Duration;

use coord_core::wake::Waiter;
use coord_core::{
    Capabilities, Lane, Message, MessageId, NewMessage, OwnerToken, PopAttempt, Pushed,
    QueueConfig, QueueStats, Result, async_trait,
};

use crate::EtcdBackend;

#[async_trait]
impl coord_core::Queue for EtcdBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn durable(&self) -> bool {
        true
    }

    async fn push(&self, queue: &str, message: &NewMessage<'_>) -> Result<Pushed> {
        self.queues.queue_push(queue, message).await
    }

    async fn try_pop(
        &self,
        queue: &str,
        lane: Lane,
        consumer: &OwnerToken,
        visibility: Duration,
        config: &QueueConfig,
    ) -> Result<PopAttempt> {
        self.queues
            .queue_pop(queue, lane, consumer, visibility, config)
            .await
    }

    async fn ack(
        &self,
        queue: &str,
        lane: Lane,
        id: MessageId,
        consumer: &OwnerToken,
    ) -> Result<bool> {
        self.queues.queue_ack(queue, lane, id.0, consumer).await
    }

    async fn nack(
        &self,
        queue: &str,
        lane: Lane,
        id: MessageId,
        consumer: &OwnerToken,
        delay: Duration,
    ) -> Result<bool> {
        self.queues
            .queue_give_back(queue, lane, id.0, consumer, delay)
            .await
    }

    async fn abandon(&self, queue: &str, lane: Lane, consumer: &OwnerToken) -> Result<()> {
        self.queues.queue_abandon(queue, lane, consumer).await
    }

    async fn extend(
        &self,
        queue: &str,
        lane: Lane,
        id: MessageId,
        consumer: &OwnerToken,
        visibility: Duration,
    ) -> Result<bool> {
        self.queues
            .queue_extend(queue, lane, id.0, consumer, visibility)
            .await
    }

    async fn peek(&self, queue: &str, lane: Lane, limit: usize) -> Result<Vec<Message>> {
        self.queues.queue_peek(queue, lane, limit).await
    }

    async fn redrive(&self, queue: &str, limit: usize) -> Result<u64> {
        self.queues.queue_redrive(queue, limit).await
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats> {
        self.queues.queue_stats(queue).await
    }

    async fn purge(&self, queue: &str) -> Result<u64> {
        self.queues.queue_purge(queue).await
    }

    async fn subscribe(&self, queue: &str, lane: Lane) -> Result<Waiter> {
        self.queues.subscribe(queue, lane).await
    }
}
