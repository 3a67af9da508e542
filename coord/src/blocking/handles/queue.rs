//! [`Queues`]: blocking work queues.

use std::time::Duration;

use crate::blocking::Rt;
use crate::blocking::claims::Delivery;
use crate::{
    Capabilities, Lane, Message, MessageId, PopOptions, PushOptions, Pushed, QueueConfig,
    QueueStats, Result,
};

/// Work queues on one store: the blocking form of [`crate::Queues`], whose
/// docs say how delivery works. Cheap to clone. Get one with
/// [`Coord::queues`](crate::blocking::Coord::queues).
#[derive(Clone)]
pub struct Queues {
    pub(super) inner: coord_core::Queues,
    pub(super) rt: Rt,
}

impl std::fmt::Debug for Queues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Queues {
    fn delivery(&self, d: coord_core::Delivery) -> Delivery {
        Delivery::new(d, self.rt.clone())
    }

    /// The same queues with another delivery configuration (dead letters,
    /// ordered groups).
    pub fn with_config(mut self, config: QueueConfig) -> Queues {
        self.inner = self.inner.with_config(config);
        self
    }

    /// The delivery configuration.
    pub fn config(&self) -> QueueConfig {
        self.inner.config()
    }

    /// What the backend promises.
    pub fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    /// The largest payload this store takes, in bytes.
    pub fn max_payload(&self) -> usize {
        self.inner.max_payload()
    }

    /// Whether this store promises that an acknowledged push survives a
    /// restart of the store.
    pub fn durable(&self) -> bool {
        self.inner.durable()
    }

    /// Push `payload` to `queue`: deliverable at once, in the group `""`.
    pub fn push(&self, queue: &str, payload: impl AsRef<[u8]>) -> Result<MessageId> {
        self.rt.block_on(self.inner.push(queue, payload))
    }

    /// Push with a delay, group or dedup id.
    pub fn push_with(
        &self,
        queue: &str,
        payload: impl AsRef<[u8]>,
        opts: &PushOptions,
    ) -> Result<Pushed> {
        self.rt.block_on(self.inner.push_with(queue, payload, opts))
    }

    /// Push `value` as JSON (`serde_json`), with `opts`.
    pub fn push_json<T: serde::Serialize + ?Sized>(
        &self,
        queue: &str,
        value: &T,
        opts: &PushOptions,
    ) -> Result<Pushed> {
        self.rt.block_on(self.inner.push_json(queue, value, opts))
    }

    /// Take the next message of `queue` for `visibility`, waiting up to
    /// `wait` for one. `Ok(None)`: none came within `wait`.
    pub fn pop(
        &self,
        queue: &str,
        visibility: Duration,
        wait: Duration,
    ) -> Result<Option<Delivery>> {
        let d = self.rt.block_on(self.inner.pop(queue, visibility, wait))?;
        Ok(d.map(|d| self.delivery(d)))
    }

    /// Pop as `opts` say (lane, visibility, wait, watchdog).
    pub fn pop_with(&self, queue: &str, opts: PopOptions) -> Result<Option<Delivery>> {
        let d = self.rt.block_on(self.inner.pop_with(queue, opts))?;
        Ok(d.map(|d| self.delivery(d)))
    }

    /// Up to `limit` messages of `lane`, without delivering them.
    pub fn peek(&self, queue: &str, lane: Lane, limit: usize) -> Result<Vec<Message>> {
        self.rt.block_on(self.inner.peek(queue, lane, limit))
    }

    /// Move up to `limit` dead letters of `queue` back to its main lane.
    /// Returns how many moved.
    pub fn redrive(&self, queue: &str, limit: usize) -> Result<u64> {
        self.rt.block_on(self.inner.redrive(queue, limit))
    }

    /// How many messages `queue` holds, by state.
    pub fn stats(&self, queue: &str) -> Result<QueueStats> {
        self.rt.block_on(self.inner.stats(queue))
    }

    /// Delete every message of `queue` (both lanes) and its dedup ids: an
    /// operator's tool. Returns how many were deleted.
    pub fn purge(&self, queue: &str) -> Result<u64> {
        self.rt.block_on(self.inner.purge(queue))
    }
}
