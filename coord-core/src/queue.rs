//! Work queues: at-least-once delivery with visibility timeouts, fenced
//! deliveries, dead letters and fair sharing across groups (tenants).
//!
//! A delivery is a claim like a lock: it is held by a fresh owner token
//! until its visibility deadline, carries a fencing token, and its guard is
//! the same [`Guard`](crate::Guard) locks use (extend, watchdog, lost
//! signal, give-back on drop). Only the store-specific half ([`Queue`])
//! differs per backend; the rules it follows are in
//! [`queue_backend`](crate::queue_backend).

mod delivery;
mod options;
mod pop;

use std::sync::Arc;
use std::time::Duration;

use crate::coord::{Coord, Settings};
use crate::error::{Error, Result};
use crate::metrics;
use crate::queue_backend::{
    Lane, Message, MessageId, NewMessage, Pushed, Queue, QueueConfig, QueueStats,
};
use crate::types::Capabilities;
use crate::validate;

pub use delivery::Delivery;
pub use options::{PopOptions, PushOptions};

/// The most messages one `peek` or `redrive` call handles.
pub const MAX_BATCH: usize = 1000;

/// Work queues on one store.
///
/// - **At least once**: a message is delivered to one consumer at a time
///   for a visibility period; if it is not acked in time (the consumer
///   crashed, paused, or lost its connection) it is delivered again, its
///   attempt count raised.
/// - **Fenced**: every delivery carries a fencing token, higher than every
///   earlier delivery's of the queue. Pass it to what the work writes
///   (like a lock's token): a stale consumer whose visibility lapsed and
///   whose message went to another is refused there, and its
///   `ack`/`extend` report [`Error::NotHeld`] and change nothing.
/// - **Fair**: FIFO within a group; groups with ready messages are served
///   round-robin, one message each, so a tenant with a 100,000-message
///   backlog does not delay one with 10. The exact rule is in
///   [`queue_backend`](crate::queue_backend).
/// - **Dead letters**: with [`QueueConfig::max_deliveries`], a message
///   delivered that many times without an ack moves to the queue's dead
///   lane, where it can be peeked, popped ([`Lane::Dead`]) and redriven.
/// - Waiting pops are woken by the store when a message is pushed or given
///   back, and retry when a delayed message or a lapsed delivery comes due.
///
/// ```
/// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
/// use std::time::Duration;
/// let q = coord.queues()?;
/// q.push("emails", b"welcome:42").await?;
/// if let Some(delivery) = q.pop("emails", Duration::from_secs(30), Duration::from_secs(5)).await? {
///     println!("sending {:?}, token {}", delivery.payload(), delivery.fencing_token());
///     delivery.ack().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Queues {
    backend: Arc<dyn Queue>,
    settings: Settings,
    config: QueueConfig,
}

impl std::fmt::Debug for Queues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queues")
            .field("backend", &self.backend.capabilities().backend)
            .field("config", &self.config)
            .finish()
    }
}

impl Coord {
    /// Work queues on this store, with the default [`QueueConfig`].
    ///
    /// Errors: [`Error::Unsupported`] if the backend has no queues.
    ///
    /// ```
    /// # fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
    /// let queues = coord.queues()?;
    /// println!("payloads up to {} bytes", queues.max_payload());
    /// # Ok(()) }
    /// ```
    pub fn queues(&self) -> Result<Queues> {
        let backend = self
            .queue
            .clone()
            .ok_or_else(|| self.unsupported("queues"))?;
        Ok(Queues {
            backend,
            settings: self.settings,
            config: QueueConfig::default(),
        })
    }

    /// The raw queue backend (no waiting, guards or validation): for
    /// backend authors and tests. Users want [`Coord::queues`].
    ///
    /// ```
    /// # fn demo(coord: coord_core::Coord) {
    /// if let Ok(raw) = coord.raw_queue() {
    ///     println!("durable: {}", raw.durable());
    /// }
    /// # }
    /// ```
    pub fn raw_queue(&self) -> Result<Arc<dyn Queue>> {
        self.queue.clone().ok_or_else(|| self.unsupported("queues"))
    }

    /// The same handle with work queues provided by `backend`.
    ///
    /// ```
    /// # fn demo(coord: coord_core::Coord, q: std::sync::Arc<dyn coord_core::Queue>) {
    /// assert!(coord.with_queues(q).queues().is_ok());
    /// # }
    /// ```
    pub fn with_queues(mut self, backend: Arc<dyn Queue>) -> Coord {
        self.queue = Some(backend);
        self
    }
}

fn check_limit(limit: usize) -> Result<()> {
    if limit == 0 || limit > MAX_BATCH {
        return Err(Error::invalid(
            "limit",
            format!("is {limit}; must be 1..={MAX_BATCH}"),
        ));
    }
    Ok(())
}

fn check_delay(field: &'static str, d: Duration) -> Result<()> {
    if d > validate::MAX_TTL {
        return Err(Error::invalid(
            field,
            format!("is {d:?}; must be at most a year"),
        ));
    }
    Ok(())
}

impl Queues {
    /// The same queues with another delivery configuration (dead letters,
    /// ordered groups). Every consumer of a queue should use the same one.
    ///
    /// ```
    /// # fn demo(q: coord_core::Queues) {
    /// let q = q.with_config(coord_core::QueueConfig::default().max_deliveries(3));
    /// assert_eq!(q.config().max_deliveries, Some(3));
    /// # }
    /// ```
    pub fn with_config(mut self, config: QueueConfig) -> Queues {
        self.config = config;
        self
    }

    /// The delivery configuration.
    ///
    /// ```
    /// # fn demo(q: coord_core::Queues) { let _ = q.config().ordered_groups; }
    /// ```
    pub fn config(&self) -> QueueConfig {
        self.config
    }

    /// What the backend promises.
    ///
    /// ```
    /// # fn demo(q: coord_core::Queues) { println!("{}", q.capabilities().backend); }
    /// ```
    pub fn capabilities(&self) -> &Capabilities {
        self.backend.capabilities()
    }

    /// The largest payload this store takes, in bytes: the backend's
    /// [`Queue::max_payload`], by default
    /// [`DEFAULT_MAX_PAYLOAD`](crate::queue_backend::DEFAULT_MAX_PAYLOAD)
    /// (256 KiB). A larger push is [`Error::InvalidArgument`] before any
    /// I/O.
    ///
    /// ```
    /// # async fn demo(q: coord_core::Queues, report: Vec<u8>) -> coord_core::Result<()> {
    /// if report.len() <= q.max_payload() {
    ///     q.push("reports", &report).await?;
    /// } else {
    ///     // store the report elsewhere and push a reference to it
    ///     q.push("reports", b"s3://bucket/report-42").await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn max_payload(&self) -> usize {
        self.backend.max_payload()
    }

    /// Whether this store promises that an acknowledged push survives a
    /// restart of the store (the backend's [`Queue::durable`]): true on
    /// PostgreSQL and etcd; false in memory and on Redis, whose durability
    /// depends on the server's persistence settings, which the client
    /// cannot see or promise.
    ///
    /// ```
    /// # fn demo(q: coord_core::Queues) {
    /// if !q.durable() {
    ///     eprintln!("queue messages may be lost if the store restarts: keep the source of truth elsewhere");
    /// }
    /// # }
    /// ```
    pub fn durable(&self) -> bool {
        self.backend.durable()
    }

    /// Push `payload` to `queue`: deliverable at once, in the group `""`.
    ///
    /// Errors: [`Error::InvalidArgument`] (nothing sent) for a bad name or
    /// a payload over [`max_payload`](Queues::max_payload); store errors
    /// (a push whose reply was lost may or may not have landed: use a
    /// dedup id to retry it safely). Cost: one round trip.
    ///
    /// ```
    /// # async fn demo(q: coord_core::Queues) -> coord_core::Result<()> {
    /// let id = q.push("jobs", b"resize:1.png").await?;
    /// println!("pushed message {id}");
    /// # Ok(()) }
    /// ```
    pub async fn push(&self, queue: &str, payload: impl AsRef<[u8]>) -> Result<MessageId> {
        Ok(self
            .push_with(queue, payload, &PushOptions::default())
            .await?
            .id)
    }

    /// Push with a delay, group or dedup id. A push repeating a dedup id
    /// within its window changes nothing and returns the first message's
    /// id with `duplicate: true`.
    ///
    /// ```
    /// # async fn demo(q: coord_core::Queues) -> coord_core::Result<()> {
    /// use coord_core::PushOptions;
    /// let opts = PushOptions::new().group("tenant-a").dedup_id("invoice-9");
    /// let first = q.push_with("billing", b"invoice-9", &opts).await?;
    /// let again = q.push_with("billing", b"invoice-9", &opts).await?;
    /// assert_eq!((again.id, again.duplicate), (first.id, true));
    /// # Ok(()) }
    /// ```
    pub async fn push_with(
        &self,
        queue: &str,
        payload: impl AsRef<[u8]>,
        opts: &PushOptions,
    ) -> Result<Pushed> {
        let payload = payload.as_ref();
        validate::name("queue", queue)?;
        let max = self.backend.max_payload();
        if payload.len() > max {
            return Err(Error::invalid(
                "payload",
                format!(
                    "is {} bytes; this store takes at most {max} bytes per message. Store the data elsewhere and push a reference to it",
                    payload.len()
                ),
            ));
        }
        if let Some(g) = &opts.group {
            validate::name("group", g)?;
        }
        check_delay("delay", opts.delay)?;
        if let Some(d) = &opts.dedup_id {
            validate::name("dedup_id", d)?;
            if opts.dedup_window.is_zero() {
                return Err(Error::invalid("dedup_window", "must be more than zero"));
            }
            check_delay("dedup_window", opts.dedup_window)?;
        }
        let message = NewMessage {
            payload,
            delay: opts.delay,
            group: opts.group.as_deref(),
            dedup_id: opts.dedup_id.as_deref(),
            dedup_window: opts.dedup_window,
        };
        let span = tracing::debug_span!(
            "coord.queue.push",
            store = self.backend.capabilities().backend,
            name = queue,
            bytes = payload.len(),
            outcome = tracing::field::Empty
        );
        let r = crate::op::run(
            self.backend.capabilities().backend,
            span,
            self.backend.push(queue, &message),
            |p: &Pushed| if p.duplicate { "duplicate" } else { "pushed" },
        )
        .await;
        if r.is_ok() {
            metrics::queue_op(self.backend.capabilities().backend, "push");
        }
        r
    }

    /// Push `value` as JSON (`serde_json`), with `opts`.
    ///
    /// ```
    /// # async fn demo(q: coord_core::Queues) -> coord_core::Result<()> {
    /// use coord_core::PushOptions;
    /// q.push_json("jobs", &("resize", 640), &PushOptions::new()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn push_json<T: serde::Serialize + ?Sized>(
        &self,
        queue: &str,
        value: &T,
        opts: &PushOptions,
    ) -> Result<Pushed> {
        let bytes = serde_json::to_vec(value)
            .map_err(|e| Error::invalid("payload", format!("cannot be encoded as JSON: {e}")))?;
        self.push_with(queue, bytes, opts).await
    }

    /// Up to `limit` messages of `lane`, oldest first, whatever their
    /// state, without taking them (an inspection tool).
    ///
    /// ```
    /// # async fn demo(q: coord_core::Queues) -> coord_core::Result<()> {
    /// use coord_core::Lane;
    /// for m in q.peek("jobs", Lane::Dead, 10).await? {
    ///     println!("dead: {} ({} attempts)", m.id, m.attempts);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn peek(&self, queue: &str, lane: Lane, limit: usize) -> Result<Vec<Message>> {
        validate::name("queue", queue)?;
        check_limit(limit)?;
        let store = self.backend.capabilities().backend;
        op!(
            "coord.queue.peek",
            store,
            queue,
            self.backend.peek(queue, lane, limit)
        )
    }

    /// Move up to `limit` dead letters of `queue` back to its main lane,
    /// oldest first, deliverable at once with their attempt count reset.
    /// Returns how many moved.
    ///
    /// ```
    /// # async fn demo(q: coord_core::Queues) -> coord_core::Result<()> {
    /// let moved = q.redrive("jobs", 100).await?;
    /// println!("redrove {moved} dead letters");
    /// # Ok(()) }
    /// ```
    pub async fn redrive(&self, queue: &str, limit: usize) -> Result<u64> {
        validate::name("queue", queue)?;
        check_limit(limit)?;
        let store = self.backend.capabilities().backend;
        op!(
            "coord.queue.redrive",
            store,
            queue,
            self.backend.redrive(queue, limit)
        )
    }

    /// How many messages `queue` holds, by state. Also sets the
    /// `coord_queue_messages` gauges of `queue` (see [`metrics`](crate::metrics)):
    /// call it from a timer for the queues an operator watches.
    ///
    /// ```
    /// # async fn demo(q: coord_core::Queues) -> coord_core::Result<()> {
    /// let s = q.stats("jobs").await?;
    /// println!("{} ready, {} in flight, {} dead", s.ready, s.in_flight, s.dead);
    /// # Ok(()) }
    /// ```
    pub async fn stats(&self, queue: &str) -> Result<QueueStats> {
        validate::name("queue", queue)?;
        let store = self.backend.capabilities().backend;
        let stats = op!("coord.queue.stats", store, queue, self.backend.stats(queue))?;
        metrics::queue_stats(store, queue, &stats);
        Ok(stats)
    }

    /// Delete every message of `queue` (both lanes) and its dedup ids: an
    /// operator's tool. Consumers holding deliveries get
    /// [`Error::NotHeld`] from their ack. Returns how many were deleted.
    ///
    /// ```
    /// # async fn demo(q: coord_core::Queues) -> coord_core::Result<()> {
    /// println!("purged {}", q.purge("scratch").await?);
    /// # Ok(()) }
    /// ```
    pub async fn purge(&self, queue: &str) -> Result<u64> {
        validate::name("queue", queue)?;
        let store = self.backend.capabilities().backend;
        op!("coord.queue.purge", store, queue, self.backend.purge(queue))
    }
}
