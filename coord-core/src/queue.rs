//! Work queues: at-least-once delivery with visibility timeouts, fenced
//! deliveries, dead letters and fair sharing across groups (tenants).
//!
//! A delivery is a claim like a lock: it is held by a fresh owner token
//! until its visibility deadline, carries a fencing token, and its guard is
//! the same [`Guard`] locks use (extend, watchdog, lost signal, give-back on
//! drop). Only the store-specific half ([`Queue`]) differs per backend; the
//! rules it follows are in [`queue_backend`](crate::queue_backend).

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::Attempt;
use crate::claim::{ClaimBackend, End, Guard};
use crate::coord::{Coord, Settings};
use crate::error::{Error, Result};
use crate::metrics;
use crate::queue_backend::{
    DEFAULT_DEDUP_WINDOW, Lane, Message, MessageId, NewMessage, PopAttempt, Pushed, Queue,
    QueueConfig, QueueStats,
};
use crate::settle::{self, Armed, Undo};
use crate::types::{Capabilities, OwnerToken};
use crate::validate;
use crate::wait;

/// The most messages one `peek` or `redrive` call handles.
pub const MAX_BATCH: usize = 1000;

/// How to push a message: a delay, a group (tenant) key, a dedup id.
///
/// ```
/// use std::time::Duration;
/// let opts = coord_core::PushOptions::new()
///     .group("tenant-7")
///     .delay(Duration::from_secs(5))
///     .dedup_id("order-1234");
/// assert_eq!(opts.group.as_deref(), Some("tenant-7"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushOptions {
    /// Not deliverable before now + `delay` (default zero).
    pub delay: Duration,
    /// The group (tenant) the message belongs to (default: the group `""`).
    pub group: Option<String>,
    /// A repeated push with this id within `dedup_window` of the first is a
    /// no-op returning the first message's id.
    pub dedup_id: Option<String>,
    /// How long a dedup id is remembered (default
    /// [`DEFAULT_DEDUP_WINDOW`], 5 minutes).
    pub dedup_window: Duration,
}

impl Default for PushOptions {
    fn default() -> Self {
        PushOptions {
            delay: Duration::ZERO,
            group: None,
            dedup_id: None,
            dedup_window: DEFAULT_DEDUP_WINDOW,
        }
    }
}

impl PushOptions {
    /// No delay, no group, no dedup id.
    ///
    /// ```
    /// assert!(coord_core::PushOptions::new().group.is_none());
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Deliverable only after `delay`.
    ///
    /// ```
    /// # use std::time::Duration;
    /// assert_eq!(coord_core::PushOptions::new().delay(Duration::from_secs(1)).delay, Duration::from_secs(1));
    /// ```
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Put the message in `group` (FIFO within it, round-robin across
    /// groups).
    ///
    /// ```
    /// assert_eq!(coord_core::PushOptions::new().group("a").group.as_deref(), Some("a"));
    /// ```
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Deduplicate on `id` within the dedup window.
    ///
    /// ```
    /// assert_eq!(coord_core::PushOptions::new().dedup_id("x").dedup_id.as_deref(), Some("x"));
    /// ```
    pub fn dedup_id(mut self, id: impl Into<String>) -> Self {
        self.dedup_id = Some(id.into());
        self
    }

    /// Remember dedup ids for `window`.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let o = coord_core::PushOptions::new().dedup_window(Duration::from_secs(60));
    /// assert_eq!(o.dedup_window, Duration::from_secs(60));
    /// ```
    pub fn dedup_window(mut self, window: Duration) -> Self {
        self.dedup_window = window;
        self
    }
}

/// How to pop: which lane, for how long a delivery stays invisible to
/// others, how long to wait for one, whether the watchdog keeps it.
///
/// ```
/// use std::time::Duration;
/// let opts = coord_core::PopOptions::new(Duration::from_secs(30))
///     .wait(Duration::from_secs(10))
///     .watchdog(true);
/// assert!(opts.watchdog);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PopOptions {
    /// The lane to pop from (default [`Lane::Main`]).
    pub lane: Lane,
    /// How long the delivery is invisible to other consumers (and each
    /// extension's length).
    pub visibility: Duration,
    /// How long to wait for a message; zero means one attempt.
    pub wait: Duration,
    /// Start the watchdog on the delivery (extends at a third of the
    /// visibility until ack or nack).
    pub watchdog: bool,
}

impl PopOptions {
    /// Main lane, `visibility`, no waiting, no watchdog.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let o = coord_core::PopOptions::new(Duration::from_secs(30));
    /// assert_eq!(o.wait, Duration::ZERO);
    /// ```
    pub fn new(visibility: Duration) -> Self {
        PopOptions {
            lane: Lane::Main,
            visibility,
            wait: Duration::ZERO,
            watchdog: false,
        }
    }

    /// Wait up to `wait` for a message.
    ///
    /// ```
    /// # use std::time::Duration;
    /// assert_eq!(coord_core::PopOptions::new(Duration::from_secs(1)).wait(Duration::from_secs(2)).wait, Duration::from_secs(2));
    /// ```
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Pop from `lane` (the dead letters, with [`Lane::Dead`]).
    ///
    /// ```
    /// # use std::time::Duration;
    /// use coord_core::Lane;
    /// assert_eq!(coord_core::PopOptions::new(Duration::from_secs(1)).lane(Lane::Dead).lane, Lane::Dead);
    /// ```
    pub fn lane(mut self, lane: Lane) -> Self {
        self.lane = lane;
        self
    }

    /// Keep the delivery invisible with the watchdog until ack or nack.
    ///
    /// ```
    /// # use std::time::Duration;
    /// assert!(coord_core::PopOptions::new(Duration::from_secs(1)).watchdog(true).watchdog);
    /// ```
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }
}

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

    /// Take the next message of `queue` for `visibility`, waiting up to
    /// `wait` for one. `Ok(None)`: none came within `wait`.
    ///
    /// Errors: [`Error::InvalidArgument`] (nothing sent); store errors.
    /// Cost: one round trip when a message is ready. Cancel-safe: if the
    /// future is dropped while an attempt is on its way, the attempt's
    /// reply is still awaited (each attempt runs in a task of its own).
    /// An attempt whose outcome nobody saw (dropped, timed out, its reply
    /// lost) is abandoned in the background ([`Queue::abandon`]): a
    /// message it delivered comes back at once, not counted as a delivery
    /// (so `max_deliveries(1)` still delivers it once), and a copy of it
    /// landing later delivers nothing.
    ///
    /// ```
    /// # async fn demo(q: coord_core::Queues) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// while let Some(d) = q.pop("jobs", Duration::from_secs(30), Duration::from_secs(1)).await? {
    ///     // ... do the work, writing with d.fencing_token() ...
    ///     d.ack().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn pop(
        &self,
        queue: &str,
        visibility: Duration,
        wait: Duration,
    ) -> Result<Option<Delivery>> {
        self.pop_with(queue, PopOptions::new(visibility).wait(wait))
            .await
    }

    /// Pop as `opts` say (lane, visibility, wait, watchdog).
    ///
    /// ```
    /// # async fn demo(q: coord_core::Queues) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// use coord_core::{Lane, PopOptions};
    /// let opts = PopOptions::new(Duration::from_secs(30)).lane(Lane::Dead);
    /// if let Some(dead) = q.pop_with("jobs", opts).await? {
    ///     println!("dead letter {} after {} attempts", dead.id(), dead.attempts());
    ///     dead.ack().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn pop_with(&self, queue: &str, opts: PopOptions) -> Result<Option<Delivery>> {
        validate::name("queue", queue)?;
        let visibility = validate::ttl("visibility", opts.visibility, self.capabilities())?;
        if self.config.max_deliveries == Some(0) {
            return Err(Error::invalid(
                "max_deliveries",
                "is 0; must be at least 1 (or None: never dead-letter)",
            ));
        }
        // Dead letters are not dead-lettered again: the stores apply
        // `max_deliveries` to the main lane only (`queue_state::dead_letters`).
        let config = self.config;
        let store = self.backend.capabilities().backend;
        let span = tracing::debug_span!(
            "coord.queue.pop",
            store = store,
            name = queue,
            lane = opts.lane.as_str(),
            outcome = tracing::field::Empty,
            waited_ms = tracing::field::Empty
        );
        let start = Instant::now();
        let lane = opts.lane;
        let got: Mutex<Option<(Message, Instant, OwnerToken)>> = Mutex::new(None);
        // In `coord_waiting` from the first empty answer until this pop ends.
        let waiting = std::sync::OnceLock::new();
        let outcome = wait::until(
            || {
                let b = self.backend.clone();
                let got = &got;
                async move {
                    let sent = Instant::now();
                    // Each attempt is its own consumer: one whose reply
                    // nobody saw is abandoned on its own, and never used
                    // again.
                    let owner = OwnerToken::random();
                    // The attempt runs in its own task, and the cleanup that
                    // undoes it stays armed until its reply is in hand: if
                    // this pop is dropped meanwhile, the reply still
                    // arrives, to the cleanup.
                    let (b2, name) = (b.clone(), queue.to_string());
                    let task = tokio::spawn(async move {
                        b2.try_pop(&name, lane, &owner, visibility, &config).await
                    });
                    let mut in_flight = Armed::new(GiveBack {
                        backend: b.clone(),
                        queue: queue.to_string(),
                        lane,
                        owner,
                        task,
                    });
                    let reply = (&mut in_flight.get_mut().task).await;
                    // The reply is in hand: a delivery goes to the guard
                    // built from it, with no await in between.
                    in_flight.settled();
                    let reply = match reply {
                        Ok(r) => r,
                        Err(e) => {
                            abandon(b, queue.to_string(), lane, owner, None);
                            return Err(Error::Store {
                                backend: store,
                                operation: "queue pop",
                                message: format!("the pop attempt's task failed: {e}"),
                                source: None,
                            });
                        }
                    };
                    match reply {
                        Ok(PopAttempt::Delivered { message, token }) => {
                            *got.lock().unwrap_or_else(|p| p.into_inner()) =
                                Some((message, sent, owner));
                            Ok(Attempt::Granted(token))
                        }
                        Ok(PopAttempt::Empty { next_in }) => Ok(Attempt::Held {
                            expires_in: next_in,
                        }),
                        Err(e) => {
                            // A timeout or a lost connection: the attempt
                            // may have reached the store, or may still.
                            if e.is_retryable() {
                                abandon(b, queue.to_string(), lane, owner, None);
                            }
                            Err(e)
                        }
                    }
                }
            },
            || {
                let _ = waiting.set(metrics::Counted::waiting(store, "delivery"));
                let b = self.backend.clone();
                async move { b.subscribe(queue, lane).await }
            },
            wait::deadline_in(opts.wait),
            self.settings.poll_interval,
        )
        .instrument(span.clone())
        .await;
        drop(waiting);
        span.record("waited_ms", start.elapsed().as_millis() as u64);
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                span.record("outcome", "error");
                metrics::error(store, &e);
                return Err(e);
            }
        };
        let taken = got.lock().unwrap_or_else(|p| p.into_inner()).take();
        match (outcome.granted, taken) {
            (Some(token), Some((message, sent_at, owner))) => {
                span.record("outcome", "delivered");
                metrics::queue_op(store, "deliver");
                let mut guard = Guard::new(
                    ClaimBackend::Delivery {
                        queue: self.backend.clone(),
                        lane,
                        id: message.id,
                    },
                    queue,
                    owner,
                    token,
                    visibility,
                    sent_at,
                );
                if opts.watchdog {
                    guard.keep_alive();
                }
                Ok(Some(Delivery {
                    guard,
                    message,
                    lane,
                }))
            }
            _ => match outcome.last_error {
                Some(e) => {
                    span.record("outcome", "error");
                    metrics::error(store, &e);
                    Err(e)
                }
                None => {
                    span.record("outcome", "empty");
                    Ok(None)
                }
            },
        }
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

/// The undo of a pop attempt whose reply its pop did not wait for: once the
/// reply comes, what the attempt may have done is abandoned ([`abandon`]).
struct GiveBack {
    backend: Arc<dyn Queue>,
    queue: String,
    lane: Lane,
    owner: OwnerToken,
    /// The attempt on its way.
    task: tokio::task::JoinHandle<Result<PopAttempt>>,
}

impl Undo for GiveBack {
    fn start(self) {
        let GiveBack {
            backend,
            queue,
            lane,
            owner,
            task,
        } = self;
        settle::spawn(async move {
            let id = match task.await {
                Ok(Ok(PopAttempt::Delivered { message, .. })) => Some(message.id),
                Ok(Ok(PopAttempt::Empty { .. })) => return,
                Ok(Err(e)) if !e.is_retryable() => return,
                _ => None,
            };
            abandon_now(backend, queue, lane, owner, id).await;
        });
    }
}

/// Abandon, in the background, the pop attempt made as `owner`, which
/// delivered `id` if its reply said so ([`abandon_now`]).
fn abandon(
    backend: Arc<dyn Queue>,
    queue: String,
    lane: Lane,
    owner: OwnerToken,
    id: Option<MessageId>,
) {
    settle::spawn(abandon_now(backend, queue, lane, owner, id));
}

/// Undo the pop attempt made as `owner`, whose outcome no caller saw
/// ([`Queue::abandon`]: what it delivered comes back uncounted, and a copy
/// landing later delivers nothing), sent again while the store does not
/// answer. A store without it: the delivery `id` a reply showed is given
/// back (a nack without delay); one whose reply was lost comes back when
/// its visibility lapses.
async fn abandon_now(
    backend: Arc<dyn Queue>,
    queue: String,
    lane: Lane,
    owner: OwnerToken,
    id: Option<MessageId>,
) {
    let store = backend.capabilities().backend;
    let r = settle::retrying(store, "queue_give_back", &queue, || {
        backend.abandon(&queue, lane, &owner)
    })
    .await;
    if let (Err(Error::Unsupported { .. }), Some(id)) = (r, id) {
        let _ = settle::retrying(store, "queue_give_back", &queue, || {
            backend.nack(&queue, lane, id, &owner, Duration::ZERO)
        })
        .await;
    }
}

/// A message delivered to this consumer: a [`Guard`] (through `Deref`, so
/// [`fencing_token`](Guard::fencing_token), [`remaining`](Guard::remaining),
/// [`extend`](Guard::extend) (the visibility), [`keep_alive`](Guard::keep_alive),
/// [`lost`](Guard::lost) and [`lost_token`](Guard::lost_token) work as for
/// locks), plus the message.
///
/// End it with [`ack`](Delivery::ack) (done: deleted) or
/// [`nack`](Delivery::nack) (give it back, after a delay).
///
/// # Dropping
/// Dropping a delivery without ack or nack stops its watchdog and gives it
/// back at once in the background (a nack without delay) if a tokio
/// runtime is available; otherwise it is delivered again when its
/// visibility lapses.
///
/// ```
/// # async fn demo(q: coord_core::Queues) -> coord_core::Result<()> {
/// use std::time::Duration;
/// if let Some(mut d) = q.pop("jobs", Duration::from_secs(10), Duration::from_secs(1)).await? {
///     d.keep_alive(); // long work: extend the visibility until ack
///     let stop = d.lost_token(); // cancelled if the delivery lapses
///     // ... work, stopping if `stop` is cancelled ...
///     # let _ = stop;
///     d.ack().await?;
/// }
/// # Ok(()) }
/// ```
#[must_use = "dropping a delivery gives it back in the background; ack or nack it"]
pub struct Delivery {
    guard: Guard,
    message: Message,
    lane: Lane,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("queue", &self.guard.name())
            .field("lane", &self.lane)
            .field("message", &self.message)
            .field("fencing_token", &self.guard.fencing_token())
            .field("remaining", &self.guard.remaining())
            .finish()
    }
}

impl Delivery {
    /// The message id.
    ///
    /// ```
    /// # fn demo(d: coord_core::Delivery) { println!("{}", d.id()); }
    /// ```
    pub fn id(&self) -> MessageId {
        self.message.id
    }

    /// The queue's name.
    ///
    /// ```
    /// # fn demo(d: coord_core::Delivery) { println!("{}", d.queue()); }
    /// ```
    pub fn queue(&self) -> &str {
        self.guard.name()
    }

    /// The lane it was popped from.
    ///
    /// ```
    /// # fn demo(d: coord_core::Delivery) { println!("{:?}", d.lane()); }
    /// ```
    pub fn lane(&self) -> Lane {
        self.lane
    }

    /// The payload bytes.
    ///
    /// ```
    /// # fn demo(d: coord_core::Delivery) { println!("{} bytes", d.payload().len()); }
    /// ```
    pub fn payload(&self) -> &[u8] {
        &self.message.payload
    }

    /// The payload decoded from JSON.
    ///
    /// Errors: [`Error::Payload`] if it is not a `T` (the delivery is
    /// unchanged).
    ///
    /// ```
    /// # fn demo(d: coord_core::Delivery) -> coord_core::Result<()> {
    /// let (task, size): (String, u32) = d.json()?;
    /// # let _ = (task, size); Ok(()) }
    /// ```
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_slice(&self.message.payload).map_err(|e| Error::Payload {
            id: self.message.id.0,
            message: format!("not the JSON of {}: {e}", std::any::type_name::<T>()),
        })
    }

    /// Its group (`None`: the group `""`).
    ///
    /// ```
    /// # fn demo(d: coord_core::Delivery) { println!("{:?}", d.group()); }
    /// ```
    pub fn group(&self) -> Option<&str> {
        self.message.group.as_deref()
    }

    /// How many times it has been delivered, this time included (1 the
    /// first time).
    ///
    /// ```
    /// # fn demo(d: coord_core::Delivery) { assert!(d.attempts() >= 1); }
    /// ```
    pub fn attempts(&self) -> u32 {
        self.message.attempts
    }

    /// When it was pushed (the store's clock where it has one).
    ///
    /// ```
    /// # fn demo(d: coord_core::Delivery) { println!("{:?}", d.enqueued_at()); }
    /// ```
    pub fn enqueued_at(&self) -> SystemTime {
        self.message.enqueued_at
    }

    /// The whole message.
    ///
    /// ```
    /// # fn demo(d: coord_core::Delivery) { assert_eq!(d.message().id, d.id()); }
    /// ```
    pub fn message(&self) -> &Message {
        &self.message
    }

    /// Done: delete the message iff this delivery still holds it, after
    /// stopping the watchdog.
    ///
    /// Errors: [`Error::NotHeld`] if the visibility lapsed (it may have
    /// been delivered to another consumer; nothing was changed); store
    /// errors (then it is delivered again after its visibility).
    /// Cost: one round trip.
    ///
    /// ```
    /// # async fn demo(d: coord_core::Delivery) -> coord_core::Result<()> {
    /// d.ack().await?;
    /// # Ok(()) }
    /// ```
    pub async fn ack(self) -> Result<()> {
        let store = self.guard.store();
        let r = self.guard.end(End::Ack).await;
        if r.is_ok() {
            metrics::queue_op(store, "ack");
        }
        r
    }

    /// Give the message back iff this delivery still holds it: deliverable
    /// again after `delay` (zero: at once), attempt count kept.
    ///
    /// Errors: as for [`ack`](Delivery::ack); a delay over a year is
    /// [`Error::InvalidArgument`]: nothing is sent, and the message is
    /// delivered again when its visibility lapses. Cost: one round trip.
    ///
    /// ```
    /// # async fn demo(d: coord_core::Delivery) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// d.nack(Duration::from_secs(30)).await?; // try again in 30 s
    /// # Ok(()) }
    /// ```
    pub async fn nack(self, delay: Duration) -> Result<()> {
        if let Err(e) = check_delay("delay", delay) {
            // Nothing is sent, and nothing is given back on drop either:
            // the message is delivered again when its visibility lapses.
            self.guard.forget();
            return Err(e);
        }
        let store = self.guard.store();
        let r = self.guard.end(End::Nack(delay)).await;
        if r.is_ok() {
            metrics::queue_op(store, "nack");
        }
        r
    }
}

impl Deref for Delivery {
    type Target = Guard;
    fn deref(&self) -> &Guard {
        &self.guard
    }
}

impl DerefMut for Delivery {
    fn deref_mut(&mut self) -> &mut Guard {
        &mut self.guard
    }
}
