//! The work queue's store-specific half ([`Queue`]) and the plain data it
//! speaks in. Users want [`Queues`](crate::Queues).
//!
//! # The model every backend implements
//!
//! A queue name has two **lanes**, [`Lane::Main`] and [`Lane::Dead`] (its
//! dead-letter queue). Each message lives in exactly one lane, in one of
//! three states:
//!
//! - **ready**: visible (its `visible_at` has passed) and not claimed;
//! - **delayed**: not visible before `visible_at` (a delayed push, a nack
//!   with a delay);
//! - **in flight**: delivered to one consumer (an owner token) until its
//!   visibility deadline; a lapsed deadline makes it ready again (for
//!   redelivery, its attempt count kept).
//!
//! **Delivery order** ([`Queue::try_pop`]), one atomic step on the store:
//! 1. Candidates are the ready messages of the lane (in-flight messages
//!    whose deadline passed count as ready).
//! 2. Each group's candidate is its lowest-id ready message (FIFO within a
//!    group; messages without a group form the group `""`). With
//!    [`QueueConfig::ordered_groups`], a group's candidate is its lowest-id
//!    message of the lane and only if that one is ready: a group whose
//!    oldest message is in flight, nacked with a delay or delayed waits
//!    (strict FIFO, one at a time).
//! 3. Across groups, the candidate of the group with the lowest **turn** is
//!    delivered (ties: the lowest message id). A group's turn is a virtual
//!    clock: delivering from group `g` sets the lane's clock `V` to
//!    `max(V, turn(g))` and then `turn(g)` to `V + 1`; a group that had no
//!    message in the lane and gets one starts at `turn = V` (a group's turn
//!    is kept only while it has messages in the lane). `V` never goes
//!    back, and a group whose turn fell behind it (it waited on an
//!    in-flight or delayed message while others were served) gets one
//!    delivery and then queues behind the others, instead of a burst that
//!    makes up for the time it waited. So groups with
//!    ready messages are served round-robin, one message each, and a group
//!    with a 100,000-message backlog delays a group with 10 by at most one
//!    delivery per other busy group.
//!
//!    A store may keep turns per message instead
//!    ([`Turns::PerMessage`](crate::queue_state::Turns), PostgreSQL), so that
//!    a delivery writes nothing the next pop has to wait for: each message
//!    takes its turn when it becomes ready, and the next delivery is the
//!    ready candidate with the lowest (turn, id). Groups with ready messages
//!    still take turns one message each; concurrent pops may pass the
//!    messages other pops hold at that moment (at most one per concurrent
//!    pop).
//! 4. A candidate already delivered [`QueueConfig::max_deliveries`] times
//!    is moved to the dead lane instead (keeping id, payload, group,
//!    enqueue time and attempts) and the next candidate is considered.
//! 5. The delivered message gets `attempts += 1`, a visibility deadline of
//!    now + `visibility`, the consumer's owner token, and a fresh fencing
//!    token: strictly greater than every token issued for the queue before
//!    (both lanes share one sequence).
//!
//! `ack`, `nack` and `extend` act only if the message is in flight to that
//! owner token and its deadline has not passed (owner-checked, atomic), and
//! otherwise change nothing and return `false`.
//!
//! Message ids are unique per queue name and rise in push order.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;

/// How long a store remembers a consumer whose pop attempts were
/// abandoned ([`Queue::abandon`]), so that a copy of such an attempt still
/// in the network delivers nothing when it lands: as long as the left
/// marks of claims.
pub const ABANDONED_POP_MEMORY: Duration = Duration::from_secs(10);

use crate::error::Result;
use crate::types::{Capabilities, FencingToken, OwnerToken};
use crate::wake::Waiter;

/// The largest payload a store accepts by default: 256 KiB (SQS's limit).
pub const DEFAULT_MAX_PAYLOAD: usize = 256 * 1024;

/// The default dedup window: a second push with the same dedup id within
/// this time after the first is a no-op (SQS's 5 minutes).
pub const DEFAULT_DEDUP_WINDOW: Duration = Duration::from_secs(300);

/// The identity of a message within its queue: unique per queue name,
/// rising in push order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MessageId(pub u64);

impl MessageId {
    /// The raw number.
    ///
    /// ```
    /// assert_eq!(coord_core::MessageId(7).get(), 7);
    /// ```
    pub fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for MessageId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Which of a queue's two lanes: its messages, or its dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// The queue itself: pushes land here.
    Main,
    /// The dead-letter queue: messages delivered `max_deliveries` times
    /// without an ack. Inspect it with `peek`, take from it with `pop`,
    /// move it back with `redrive`.
    Dead,
}

impl Lane {
    /// A short name for keys, logs and errors: `main` or `dead`.
    ///
    /// ```
    /// assert_eq!(coord_core::Lane::Dead.as_str(), "dead");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Main => "main",
            Lane::Dead => "dead",
        }
    }
}

/// One message to push (already validated by the core: name rules for
/// `group` and `dedup_id`, payload within [`Queue::max_payload`], delay at
/// most a year).
#[derive(Debug, Clone, Copy)]
pub struct NewMessage<'a> {
    /// The payload bytes, stored as they are.
    pub payload: &'a [u8],
    /// Not deliverable before now + `delay` (zero: at once).
    pub delay: Duration,
    /// The group (tenant) key; `None` is the group `""`.
    pub group: Option<&'a str>,
    /// With a dedup id, a push repeating an id pushed within `dedup_window`
    /// is a no-op returning the first message's id.
    pub dedup_id: Option<&'a str>,
    /// How long a dedup id is remembered (only with `dedup_id`).
    pub dedup_window: Duration,
}

impl<'a> NewMessage<'a> {
    /// `payload`, deliverable at once, in the group `""`, without a dedup
    /// id; the methods below change one field each.
    ///
    /// ```
    /// use std::time::Duration;
    /// let m = coord_core::NewMessage::new(b"job")
    ///     .in_group(Some("tenant-a"))
    ///     .delayed(Duration::from_secs(5))
    ///     .dedup("job-17", Duration::from_secs(60));
    /// assert_eq!(m.group, Some("tenant-a"));
    /// assert_eq!(m.dedup_id, Some("job-17"));
    /// ```
    pub fn new(payload: &'a [u8]) -> Self {
        NewMessage {
            payload,
            delay: Duration::ZERO,
            group: None,
            dedup_id: None,
            dedup_window: Duration::ZERO,
        }
    }

    /// The message in `group` (`None`: the group `""`).
    pub fn in_group(self, group: Option<&'a str>) -> Self {
        NewMessage { group, ..self }
    }

    /// The message deliverable only after `delay`.
    pub fn delayed(self, delay: Duration) -> Self {
        NewMessage { delay, ..self }
    }

    /// The message with dedup id `id`, remembered for `window`.
    pub fn dedup(self, id: &'a str, window: Duration) -> Self {
        NewMessage {
            dedup_id: Some(id),
            dedup_window: window,
            ..self
        }
    }
}

/// What a push did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pushed {
    /// The message's id (the first message's, for a duplicate).
    pub id: MessageId,
    /// Whether the push was a duplicate of one within the dedup window (and
    /// so changed nothing).
    pub duplicate: bool,
}

/// How a queue delivers: passed with every pop, so it is configuration of
/// the consumers, not state in the store. Every consumer of a queue should
/// use the same one.
///
/// ```
/// let cfg = coord_core::QueueConfig::default()
///     .max_deliveries(3)
///     .ordered_groups(true);
/// assert_eq!(cfg.max_deliveries, Some(3));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueConfig {
    /// A message delivered this many times without an ack goes to the dead
    /// lane at its next delivery. `None` (the default): never.
    pub max_deliveries: Option<u32>,
    /// Whether a group's next message waits until its previous one is
    /// acked (strict FIFO per group). Default `false`: a group's messages
    /// are delivered in order but may be in flight together.
    pub ordered_groups: bool,
}

impl QueueConfig {
    /// Dead-letter a message after `n` deliveries without an ack (`n >= 1`).
    ///
    /// ```
    /// assert_eq!(coord_core::QueueConfig::default().max_deliveries(5).max_deliveries, Some(5));
    /// ```
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = Some(n);
        self
    }

    /// Deliver a group's messages one at a time, in order.
    ///
    /// ```
    /// assert!(coord_core::QueueConfig::default().ordered_groups(true).ordered_groups);
    /// ```
    pub fn ordered_groups(mut self, on: bool) -> Self {
        self.ordered_groups = on;
        self
    }
}

/// A stored message, as a delivery or a peek shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Message {
    /// Its id within the queue.
    pub id: MessageId,
    /// The payload bytes.
    pub payload: Vec<u8>,
    /// Its group; `None` for the group `""`.
    pub group: Option<String>,
    /// How many times it has been delivered, this delivery included.
    pub attempts: u32,
    /// When it was pushed, on the store's clock where it has one
    /// ([`Capabilities::server_clock`]), millisecond precision.
    pub enqueued_at: SystemTime,
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Message")
            .field("id", &self.id)
            .field("payload_len", &self.payload.len())
            .field("group", &self.group)
            .field("attempts", &self.attempts)
            .field("enqueued_at", &self.enqueued_at)
            .finish()
    }
}

/// The outcome of one pop attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PopAttempt {
    /// A message was delivered to the consumer.
    Delivered {
        /// The message (attempts counting this delivery).
        message: Message,
        /// The delivery's fencing token.
        token: FencingToken,
    },
    /// Nothing is deliverable now. `next_in`: the time until the earliest
    /// delayed message becomes visible or in-flight deadline lapses, where
    /// the store can tell, so a waiter tries again then without a
    /// notification.
    Empty {
        /// Time until something may become deliverable.
        next_in: Option<Duration>,
    },
}

/// How many messages a queue holds, by lane and state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Main lane: visible and unclaimed (lapsed deliveries included).
    pub ready: u64,
    /// Main lane: not visible yet (delayed pushes, nacks with a delay).
    pub delayed: u64,
    /// Main lane: delivered and within their visibility deadline.
    pub in_flight: u64,
    /// Dead lane: every message in it, whatever its state.
    pub dead: u64,
}

/// A work queue with visibility timeouts, acks, dead letters and fair
/// delivery across groups: the store-specific half of
/// [`Queues`](crate::Queues). The module docs of `queue_backend` state the
/// model; arguments are validated by the core.
///
/// ```
/// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
/// use std::time::Duration;
/// use coord_core::{Lane, NewMessage, OwnerToken, PopAttempt, QueueConfig};
/// let raw = coord.raw_queue()?;
/// let msg = NewMessage::new(b"job");
/// let pushed = raw.push("jobs", &msg).await?;
/// let me = OwnerToken::random();
/// if let PopAttempt::Delivered { message, .. } = raw
///     .try_pop("jobs", Lane::Main, &me, Duration::from_secs(30), &QueueConfig::default())
///     .await?
/// {
///     assert_eq!(message.id, pushed.id);
///     assert!(raw.ack("jobs", Lane::Main, message.id, &me).await?);
/// }
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Queue: Send + Sync + 'static {
    /// What this backend promises (`server_clock`: whose clock delays and
    /// visibility deadlines run on).
    fn capabilities(&self) -> &Capabilities;

    /// The largest payload this store takes, in bytes (default
    /// [`DEFAULT_MAX_PAYLOAD`]). A larger one is
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) before any
    /// I/O.
    fn max_payload(&self) -> usize {
        DEFAULT_MAX_PAYLOAD
    }

    /// Whether the store promises that an acknowledged push survives a
    /// restart of the store (PostgreSQL, etcd). Default false: memory, and
    /// Redis, where it depends on the server's persistence settings, which
    /// the client cannot see or promise.
    fn durable(&self) -> bool {
        false
    }

    /// Add a message to the main lane of `queue`.
    async fn push(&self, queue: &str, message: &NewMessage<'_>) -> Result<Pushed>;

    /// One attempt to deliver the next message of `lane` (see the module
    /// docs for which) to `consumer` for `visibility`. `config`'s
    /// `max_deliveries` applies to the main lane only: a dead letter is
    /// delivered whatever its attempts ([`dead_letters`](crate::queue_state::dead_letters)).
    async fn try_pop(
        &self,
        queue: &str,
        lane: Lane,
        consumer: &OwnerToken,
        visibility: Duration,
        config: &QueueConfig,
    ) -> Result<PopAttempt>;

    /// Delete message `id` iff it is in flight to `consumer` and its
    /// deadline has not passed. `Ok(false)`: nothing changed.
    async fn ack(
        &self,
        queue: &str,
        lane: Lane,
        id: MessageId,
        consumer: &OwnerToken,
    ) -> Result<bool>;

    /// Give message `id` back iff it is in flight to `consumer` (as `ack`
    /// checks): it becomes visible again after `delay`, keeping its attempt
    /// count, and wakes a waiter (with a delay: so that it learns when the
    /// message comes due). With ordered groups its group waits for it.
    /// `Ok(false)`: nothing changed.
    async fn nack(
        &self,
        queue: &str,
        lane: Lane,
        id: MessageId,
        consumer: &OwnerToken,
        delay: Duration,
    ) -> Result<bool>;

    /// Undo the pop attempts made as `consumer` whose replies no caller
    /// saw (a pop dropped, timed out or cut off mid-call; core uses a fresh
    /// `consumer` per attempt and never another call with it). A message
    /// in flight to `consumer` is given back at once, its attempt count
    /// back to what it was before that delivery (no consumer saw it: with
    /// `max_deliveries(1)` it is still delivered once), waking a waiter;
    /// and `consumer` is remembered for at least [`ABANDONED_POP_MEMORY`]
    /// (or twice the store's call timeout, if longer), so that an attempt
    /// of it that reaches the store later delivers nothing. Idempotent.
    ///
    /// The default returns [`Error::Unsupported`](crate::Error::Unsupported):
    /// core then gives back by id what a reply it did see delivered (a
    /// nack without delay), and a delivery whose reply was lost stays in
    /// flight until its visibility lapses.
    async fn abandon(&self, queue: &str, lane: Lane, consumer: &OwnerToken) -> Result<()> {
        let _ = (queue, lane, consumer);
        Err(crate::Error::Unsupported {
            backend: self.capabilities().backend,
            primitive: "abandoning a pop attempt",
            reason: "",
        })
    }

    /// Set the visibility deadline of message `id` to now + `visibility`
    /// iff it is in flight to `consumer` and not lapsed. Never changes the
    /// fencing token or the attempt count. `Ok(false)`: nothing changed.
    async fn extend(
        &self,
        queue: &str,
        lane: Lane,
        id: MessageId,
        consumer: &OwnerToken,
        visibility: Duration,
    ) -> Result<bool>;

    /// Up to `limit` messages of `lane`, lowest id first, whatever their
    /// state, without claiming them (`attempts` as delivered so far).
    async fn peek(&self, queue: &str, lane: Lane, limit: usize) -> Result<Vec<Message>>;

    /// Move up to `limit` messages of the dead lane back to the main lane,
    /// lowest id first, ready at once with their attempt count reset to
    /// zero (ids kept). In-flight dead letters are not moved. Returns how
    /// many moved; wakes waiters of the main lane.
    async fn redrive(&self, queue: &str, limit: usize) -> Result<u64>;

    /// Counts of the queue's messages.
    async fn stats(&self, queue: &str) -> Result<QueueStats>;

    /// Delete every message of both lanes of `queue` and its dedup ids
    /// (an operator's tool). Returns how many messages were deleted.
    async fn purge(&self, queue: &str) -> Result<u64>;

    /// Register for wake-ups when `lane` of `queue` may have a message to
    /// deliver (a push, a nack, a redrive, an ack in an ordered group),
    /// before attempting. The default never wakes: waiting then relies on
    /// [`PopAttempt::Empty::next_in`] and polling.
    async fn subscribe(&self, _queue: &str, _lane: Lane) -> Result<Waiter> {
        Ok(Waiter::never())
    }
}
