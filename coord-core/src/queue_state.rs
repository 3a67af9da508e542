//! One work queue's state and its transitions: the delivery rule of
//! [`queue_backend`](crate::queue_backend) as a pure state machine, for
//! backends that keep a queue in their own memory and decide there (the
//! in-memory backend). Backends whose store decides (Redis and PostgreSQL
//! in scripts, etcd in transactions over its keys) implement the same
//! rules in their own way; the conformance suite holds them all to the
//! same behaviour, and the rule's pure pieces ([`serve_turn`],
//! [`candidate`], [`dead_letters`]) are here for them to share.
//!
//! [`QueueState`] holds one queue name: two lanes, each a map of messages
//! by id, a per-group index of ready ids (and of every id, for ordered
//! groups), the groups' turns and the lane's virtual clock, and one
//! timeline of the messages waiting for a time (delayed ones and
//! deliveries' deadlines), which each step that needs it first brings up
//! to date; the dedup ids with the end of their windows; the consumers
//! whose pop attempts were abandoned.
//!
//! Nothing here reads a clock, waits or wakes anybody: every step takes
//! `now` (on the caller's clock), takes new message ids and fencing tokens
//! from the caller's counter (a closure, called only when one is used, so
//! ids and tokens can share one rising sequence), and tells the caller
//! what it needs to wake waiters. The caller holds the lock.

mod lane;
#[cfg(test)]
mod properties;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::queue_backend::{
    ABANDONED_POP_MEMORY, Lane, Message, MessageId, NewMessage, PopAttempt, Pushed, QueueConfig,
    QueueStats,
};
use crate::types::{FencingToken, OwnerToken};
use lane::{LaneState, Msg};

/// How many dedup ids or abandoned consumers a queue keeps before a push
/// or an abandon drops those whose time has passed.
const SWEEP_ABOVE: usize = 1024;

/// Whether a map of dedup ids or abandoned consumers holding `len`
/// entries is due for a sweep ([`SWEEP_ABOVE`]).
fn sweep_due(len: usize) -> bool {
    len > SWEEP_ABOVE
}

/// The lane's clock and the group's turn after a delivery from a group at
/// `turn` while the lane's clock is `clock`: the clock moves to the turn
/// served and never back, and the group queues one past it (a group whose
/// turn fell behind gets one delivery, not a burst that makes up for the
/// time it waited).
///
/// ```
/// use coord_core::queue_state::serve_turn;
/// assert_eq!(serve_turn(5, 2), (5, 6));
/// assert_eq!(serve_turn(5, 9), (9, 10));
/// ```
pub fn serve_turn(clock: u64, turn: u64) -> (u64, u64) {
    let clock = clock.max(turn);
    (clock, clock.saturating_add(1))
}

/// A group's candidate for delivery, from its lowest id in the lane and
/// its lowest ready id: its lowest ready message, or with ordered groups
/// its lowest message only if that one is ready (a group whose oldest
/// message is in flight or delayed waits).
///
/// ```
/// use coord_core::queue_state::candidate;
/// assert_eq!(candidate(false, Some(3), Some(5)), Some(5));
/// assert_eq!(candidate(true, Some(3), Some(5)), None);
/// assert_eq!(candidate(true, Some(3), Some(3)), Some(3));
/// ```
pub fn candidate(ordered: bool, lowest: Option<u64>, lowest_ready: Option<u64>) -> Option<u64> {
    if ordered && lowest != lowest_ready {
        return None;
    }
    lowest_ready
}

/// Whether a candidate of `lane` already delivered `attempts` times goes
/// to the dead lane instead of being delivered: only in the main lane, and
/// only once its attempts reach [`QueueConfig::max_deliveries`].
///
/// ```
/// use coord_core::{Lane, QueueConfig, queue_state::dead_letters};
/// let cfg = QueueConfig::default().max_deliveries(2);
/// assert!(!dead_letters(Lane::Main, &cfg, 1));
/// assert!(dead_letters(Lane::Main, &cfg, 2));
/// assert!(!dead_letters(Lane::Dead, &cfg, 2));
/// ```
pub fn dead_letters(lane: Lane, config: &QueueConfig, attempts: u32) -> bool {
    lane == Lane::Main && config.max_deliveries.is_some_and(|max| attempts >= max)
}

/// How a queue keeps the order across groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Turns {
    /// Each group has a turn on the lane's virtual clock, moved by every
    /// delivery ([`serve_turn`]): the exact rule of
    /// [`queue_backend`](crate::queue_backend), for stores that decide one
    /// step of a queue at a time.
    #[default]
    PerGroup,
    /// Each message takes its turn when it becomes ready, and a delivery
    /// writes nothing shared, so concurrent pops need not take turns on
    /// one record (PostgreSQL). V, the lane's current turn, is the lowest
    /// turn of its ready messages, or with none ready the highest turn
    /// given in it. A new message takes V, or while its group has other
    /// messages in the lane max(V, the group's last turn + 1); a message
    /// given back keeps its turn or takes V if that is higher. For one
    /// consumer at a time the groups with ready messages take turns one
    /// message each as with [`Turns::PerGroup`]; the orders differ in
    /// which group goes first.
    PerMessage,
}

/// What an ack did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ack {
    /// The message was not in flight to that consumer (or its deadline
    /// passed): nothing changed.
    Refused,
    /// The message was deleted.
    Deleted {
        /// Whether its group still has messages in the lane (with ordered
        /// groups the next one may be deliverable now).
        group_has_more: bool,
    },
}

/// One queue name's messages, lanes, groups, dedup ids and abandoned
/// consumers (see the module docs).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use coord_core::queue_state::{Ack, QueueState};
/// use coord_core::{Lane, NewMessage, OwnerToken, PopAttempt, QueueConfig};
/// use tokio::time::Instant;
///
/// let mut q = QueueState::default();
/// let (mut counter, now) = (0u64, Instant::now());
/// let msg = NewMessage::new(b"job");
/// let pushed = q.push(now, &msg, SystemTime::now(), || { counter += 1; counter });
/// let me = OwnerToken::random();
/// let vis = Duration::from_secs(30);
/// let cfg = QueueConfig::default();
/// let PopAttempt::Delivered { message, .. } =
///     q.pop(now, Lane::Main, &me, vis, &cfg, || { counter += 1; counter })
/// else { panic!("nothing delivered") };
/// assert_eq!(message.id, pushed.id);
/// let acked = q.ack(now, Lane::Main, message.id, &me);
/// assert_eq!(acked, Ack::Deleted { group_has_more: false });
/// assert!(q.is_idle(now));
/// ```
#[derive(Debug, Clone, Default)]
pub struct QueueState {
    main: LaneState,
    dead: LaneState,
    /// Dedup id: the first message's id and when its window ends.
    dedup: HashMap<Box<str>, (u64, Instant)>,
    /// Consumers whose pop attempts were abandoned, until when: an
    /// attempt of one delivers nothing.
    abandoned: HashMap<OwnerToken, Instant>,
}

impl QueueState {
    /// An empty queue keeping its turns as `turns` says
    /// ([`QueueState::default`] keeps them per group).
    pub fn with_turns(turns: Turns) -> Self {
        let mut s = QueueState::default();
        s.main.turns = turns;
        s.dead.turns = turns;
        s
    }

    fn lane_mut(&mut self, lane: Lane) -> &mut LaneState {
        match lane {
            Lane::Main => &mut self.main,
            Lane::Dead => &mut self.dead,
        }
    }

    fn lane(&self, lane: Lane) -> &LaneState {
        match lane {
            Lane::Main => &self.main,
            Lane::Dead => &self.dead,
        }
    }

    /// Whether the state holds nothing that matters at `now`: no message
    /// in either lane, no dedup window open, no abandoned consumer still
    /// remembered (so a store may drop it).
    pub fn is_idle(&self, now: Instant) -> bool {
        self.main.is_empty()
            && self.dead.is_empty()
            && self.dedup.values().all(|(_, e)| *e <= now)
            && self.abandoned.values().all(|e| *e <= now)
    }

    /// How many messages both lanes hold, whatever their state.
    pub fn messages(&self) -> u64 {
        (self.main.msgs.len() + self.dead.msgs.len()) as u64
    }

    /// The in-flight message `id` of `lane` held by `owner`, not lapsed.
    fn held(&mut self, lane: Lane, id: u64, owner: &OwnerToken, now: Instant) -> Option<&mut Msg> {
        let l = self.lane_mut(lane);
        l.advance(now);
        l.msgs.get_mut(&id).filter(|m| m.held_by(owner, now))
    }

    /// Add `message` to the main lane at `now`, enqueued at `enqueued_at`
    /// (as deliveries show it), with the id `next_id()` returns (which must
    /// be above every id of the queue). A dedup id seen within the window
    /// of its first push is a duplicate: nothing changes, `next_id` is not
    /// called, and the first message's id is returned. A window is counted
    /// from the push that opened it; duplicates do not extend it.
    pub fn push(
        &mut self,
        now: Instant,
        message: &NewMessage<'_>,
        enqueued_at: SystemTime,
        next_id: impl FnOnce() -> u64,
    ) -> Pushed {
        if let Some(d) = message.dedup_id {
            if sweep_due(self.dedup.len()) {
                self.dedup.retain(|_, (_, e)| *e > now);
            }
            if let Some((id, expires)) = self.dedup.get(d) {
                if *expires > now {
                    return Pushed {
                        id: MessageId(*id),
                        duplicate: true,
                    };
                }
            }
        }
        let id = next_id();
        if let Some(d) = message.dedup_id {
            self.dedup
                .insert(d.into(), (id, now + message.dedup_window));
        }
        self.main.advance(now);
        self.main.insert(
            id,
            Msg {
                payload: message.payload.into(),
                group: message.group.unwrap_or("").into(),
                attempts: 0,
                enqueued_at,
                at: (!message.delay.is_zero()).then(|| now + message.delay),
                holder: None,
                turn: None,
            },
        );
        Pushed {
            id: MessageId(id),
            duplicate: false,
        }
    }

    /// One pop attempt on `lane` at `now` for `consumer`, per the delivery
    /// rule of [`queue_backend`](crate::queue_backend): due messages and
    /// lapsed deliveries become ready, candidates delivered
    /// `max_deliveries` times move to the dead lane, and the next message
    /// is delivered for `visibility` with the fencing token `next_token()`
    /// returns (called only for a delivery; it must be above every token
    /// issued for the queue). An abandoned consumer gets nothing.
    pub fn pop(
        &mut self,
        now: Instant,
        lane: Lane,
        consumer: &OwnerToken,
        visibility: Duration,
        config: &QueueConfig,
        next_token: impl FnOnce() -> u64,
    ) -> PopAttempt {
        if self
            .abandoned
            .get(consumer)
            .is_some_and(|until| *until > now)
        {
            return PopAttempt::Empty { next_in: None };
        }
        self.lane_mut(lane).advance(now);
        loop {
            let l = self.lane_mut(lane);
            let Some((id, group)) = l.next(config.ordered_groups) else {
                return PopAttempt::Empty {
                    next_in: l.next_in(now),
                };
            };
            let attempts = l.msgs.get(&id).map_or(0, |m| m.attempts);
            if dead_letters(lane, config, attempts) {
                if let Some(mut m) = l.remove(id) {
                    m.at = None;
                    m.holder = None;
                    self.dead.insert(id, m);
                }
                continue;
            }
            // `next` found both.
            if !l.msgs.contains_key(&id) || !l.serve(&group, id) {
                return PopAttempt::Empty { next_in: None };
            }
            let deadline = now + visibility;
            let Some(m) = l.msgs.get_mut(&id) else {
                return PopAttempt::Empty { next_in: None };
            };
            let token = next_token();
            m.attempts += 1;
            m.at = Some(deadline);
            m.holder = Some(*consumer);
            let message = m.message(id);
            l.timeline.insert((deadline, id));
            return PopAttempt::Delivered {
                message,
                token: FencingToken(token),
            };
        }
    }

    /// Delete message `id` of `lane` iff it is in flight to `consumer` and
    /// its deadline has not passed at `now`.
    pub fn ack(&mut self, now: Instant, lane: Lane, id: MessageId, consumer: &OwnerToken) -> Ack {
        if self.held(lane, id.0, consumer, now).is_none() {
            return Ack::Refused;
        }
        let l = self.lane_mut(lane);
        let m = l.remove(id.0);
        Ack::Deleted {
            group_has_more: m.is_some_and(|m| l.groups.contains_key(&m.group)),
        }
    }

    /// Give message `id` of `lane` back iff it is in flight to `consumer`
    /// (as [`ack`](Self::ack) checks): ready at once, or after `delay`,
    /// its attempts kept. `false`: nothing changed.
    pub fn nack(
        &mut self,
        now: Instant,
        lane: Lane,
        id: MessageId,
        consumer: &OwnerToken,
        delay: Duration,
    ) -> bool {
        if self.held(lane, id.0, consumer, now).is_none() {
            return false;
        }
        let at = (!delay.is_zero()).then(|| now + delay);
        self.lane_mut(lane).give_back(id.0, at);
        true
    }

    /// Set the deadline of message `id` of `lane` to `now + visibility` iff
    /// it is in flight to `consumer` (as [`ack`](Self::ack) checks); its
    /// attempts stay. `false`: nothing changed.
    pub fn extend(
        &mut self,
        now: Instant,
        lane: Lane,
        id: MessageId,
        consumer: &OwnerToken,
        visibility: Duration,
    ) -> bool {
        if self.held(lane, id.0, consumer, now).is_none() {
            return false;
        }
        self.lane_mut(lane).reschedule(id.0, now + visibility);
        true
    }

    /// Undo the pop attempts of `consumer` on `lane`: it is remembered for
    /// [`ABANDONED_POP_MEMORY`] from `now` (a pop of it delivers nothing),
    /// and a message in flight to it is ready again at once, its attempts
    /// back to what they were before that delivery. Returns whether a
    /// message was given back.
    pub fn abandon(&mut self, now: Instant, lane: Lane, consumer: &OwnerToken) -> bool {
        if sweep_due(self.abandoned.len()) {
            self.abandoned.retain(|_, until| *until > now);
        }
        self.abandoned.insert(*consumer, now + ABANDONED_POP_MEMORY);
        let l = self.lane_mut(lane);
        l.advance(now);
        let held = l
            .msgs
            .iter_mut()
            .find(|(_, m)| m.held_by(consumer, now))
            .map(|(&id, m)| {
                m.attempts = m.attempts.saturating_sub(1);
                id
            });
        match held {
            Some(id) => {
                l.give_back(id, None);
                true
            }
            None => false,
        }
    }

    /// Up to `limit` messages of `lane`, lowest id first, whatever their
    /// state.
    pub fn peek(&self, lane: Lane, limit: usize) -> Vec<Message> {
        self.lane(lane)
            .msgs
            .iter()
            .take(limit)
            .map(|(id, m)| m.message(*id))
            .collect()
    }

    /// Move up to `limit` dead letters not in flight at `now` back to the
    /// main lane, lowest id first, ready with their attempts reset to zero.
    /// Returns how many moved.
    pub fn redrive(&mut self, now: Instant, limit: usize) -> u64 {
        self.dead.advance(now);
        self.main.advance(now);
        let ids: Vec<u64> = self
            .dead
            .msgs
            .iter()
            .filter(|(_, m)| m.holder.is_none())
            .take(limit)
            .map(|(id, _)| *id)
            .collect();
        let v = self.main.v();
        for id in &ids {
            if let Some(mut m) = self.dead.remove(*id) {
                m.attempts = 0;
                m.at = None;
                m.holder = None;
                self.main.insert_at(*id, m, v);
            }
        }
        ids.len() as u64
    }

    /// How many messages the dead lane holds (a pop that raised it moved
    /// some there: its waiters are to be woken).
    pub fn dead_len(&self) -> usize {
        self.dead.msgs.len()
    }

    /// The counts of the queue's messages at `now`.
    pub fn stats(&self, now: Instant) -> QueueStats {
        let mut s = QueueStats {
            dead: self.dead.msgs.len() as u64,
            ..QueueStats::default()
        };
        for m in self.main.msgs.values() {
            match (m.at, m.holder) {
                (Some(t), Some(_)) if t > now => s.in_flight += 1,
                (Some(t), None) if t > now => s.delayed += 1,
                _ => s.ready += 1,
            }
        }
        s
    }
}
