//! Work queues in memory: the reference model of
//! [`coord_core::queue_backend`]'s delivery rule.
//!
//! Per queue name: two lanes, each a map of messages by id, a per-group
//! index of ready ids (and of every id, for ordered groups), the groups'
//! turns and the lane's virtual clock, and one timeline of the messages
//! waiting for a time (delayed ones and deliveries' deadlines), which each
//! step first brings up to date. Message ids come from the store's one
//! counter (the fencing tokens'), so they keep rising after a purge or
//! after an idle queue's entry is swept.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use coord_core::wake::Waiter;
use coord_core::{
    Capabilities, FencingToken, Lane, Message, MessageId, NewMessage, OwnerToken, PopAttempt,
    Pushed, QueueConfig, QueueStats, Result, async_trait,
};
use tokio::time::Instant;

use crate::MemoryBackend;

struct Msg {
    payload: Arc<[u8]>,
    group: Box<str>,
    attempts: u32,
    enqueued_at: SystemTime,
    /// Delayed until, or in flight until (with `holder`).
    at: Option<Instant>,
    holder: Option<OwnerToken>,
}

#[derive(Default)]
struct Group {
    /// Every id of the group in this lane.
    all: BTreeSet<u64>,
    /// The ready ones.
    ready: BTreeSet<u64>,
    turn: u64,
}

#[derive(Default)]
struct LaneState {
    msgs: BTreeMap<u64, Msg>,
    groups: HashMap<Box<str>, Group>,
    /// (time, id): delayed messages and in-flight deadlines.
    timeline: BTreeSet<(Instant, u64)>,
    clock: u64,
}

impl LaneState {
    /// Make due delayed messages and lapsed deliveries ready.
    fn advance(&mut self, now: Instant) {
        while let Some(&(t, id)) = self.timeline.first() {
            if t > now {
                break;
            }
            self.timeline.pop_first();
            if let Some(m) = self.msgs.get_mut(&id) {
                if m.at == Some(t) {
                    m.at = None;
                    m.holder = None;
                    if let Some(g) = self.groups.get_mut(&m.group) {
                        g.ready.insert(id);
                    }
                }
            }
        }
    }

    /// Insert a message (ready, or delayed until `at`).
    fn insert(&mut self, id: u64, msg: Msg) {
        let clock = self.clock;
        let g = self.groups.entry(msg.group.clone()).or_default();
        if g.all.is_empty() {
            g.turn = g.turn.max(clock);
        }
        g.all.insert(id);
        match msg.at {
            Some(t) => {
                self.timeline.insert((t, id));
            }
            None => {
                g.ready.insert(id);
            }
        }
        self.msgs.insert(id, msg);
    }

    /// Remove a message wherever it is.
    fn remove(&mut self, id: u64) -> Option<Msg> {
        let m = self.msgs.remove(&id)?;
        if let Some(t) = m.at {
            self.timeline.remove(&(t, id));
        }
        if let Some(g) = self.groups.get_mut(&m.group) {
            g.all.remove(&id);
            g.ready.remove(&id);
            if g.all.is_empty() {
                // Its turn is not kept: coming back it starts at the clock.
                self.groups.remove(&m.group);
            }
        }
        Some(m)
    }

    /// The id to deliver next, per the rule.
    fn next(&self, ordered: bool) -> Option<(u64, Box<str>)> {
        let mut best: Option<(u64, u64, &Box<str>)> = None;
        for (name, g) in &self.groups {
            let cand = if ordered {
                match (g.all.first(), g.ready.first()) {
                    (Some(a), Some(r)) if a == r => Some(*a),
                    _ => None,
                }
            } else {
                g.ready.first().copied()
            };
            if let Some(id) = cand {
                let key = (g.turn, id);
                if best.is_none_or(|(t, i, _)| key < (t, i)) {
                    best = Some((g.turn, id, name));
                }
            }
        }
        best.map(|(_, id, name)| (id, name.clone()))
    }

    fn next_in(&self, now: Instant) -> Option<Duration> {
        self.timeline
            .first()
            .map(|(t, _)| t.saturating_duration_since(now))
    }

    fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }
}

/// One queue name's state.
#[derive(Default)]
pub(crate) struct QueueState {
    main: LaneState,
    dead: LaneState,
    dedup: HashMap<Box<str>, (u64, Instant)>,
    /// Consumers whose pop attempts were abandoned, until when: an
    /// attempt of one delivers nothing.
    abandoned: HashMap<OwnerToken, Instant>,
}

impl QueueState {
    fn lane(&mut self, lane: Lane) -> &mut LaneState {
        match lane {
            Lane::Main => &mut self.main,
            Lane::Dead => &mut self.dead,
        }
    }

    pub(crate) fn idle(&self, now: Instant) -> bool {
        self.main.is_empty()
            && self.dead.is_empty()
            && self.dedup.values().all(|(_, e)| *e <= now)
            && self.abandoned.values().all(|e| *e <= now)
    }

    /// The in-flight message `id` of `lane` held by `owner`, not lapsed.
    fn held(&mut self, lane: Lane, id: u64, owner: &OwnerToken, now: Instant) -> Option<&mut Msg> {
        let l = self.lane(lane);
        l.advance(now);
        l.msgs
            .get_mut(&id)
            .filter(|m| m.holder.as_ref() == Some(owner) && m.at.is_some_and(|t| t > now))
    }
}

fn message(id: u64, m: &Msg) -> Message {
    Message {
        id: MessageId(id),
        payload: m.payload.to_vec(),
        group: (!m.group.is_empty()).then(|| m.group.to_string()),
        attempts: m.attempts,
        enqueued_at: m.enqueued_at,
    }
}

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
            let q = shard.entry(queue, QueueState::default, |q| q.idle(now));
            if let Some(d) = message.dedup_id {
                if q.dedup.len() > 1024 {
                    q.dedup.retain(|_, (_, e)| *e > now);
                }
                if let Some((id, expires)) = q.dedup.get(d) {
                    if *expires > now {
                        return Ok(Pushed {
                            id: MessageId(*id),
                            duplicate: true,
                        });
                    }
                }
            }
            let id = self.next_token();
            if let Some(d) = message.dedup_id {
                q.dedup.insert(d.into(), (id, now + message.dedup_window));
            }
            q.main.advance(now);
            q.main.insert(
                id,
                Msg {
                    payload: message.payload.into(),
                    group: message.group.unwrap_or("").into(),
                    attempts: 0,
                    enqueued_at: SystemTime::now(),
                    at: (!message.delay.is_zero()).then(|| now + message.delay),
                    holder: None,
                },
            );
            Pushed {
                id: MessageId(id),
                duplicate: false,
            }
        };
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
        let mut shard = self.queues.shard(queue);
        let Some(q) = shard.map.get_mut(queue) else {
            return Ok(PopAttempt::Empty { next_in: None });
        };
        if q.abandoned.get(consumer).is_some_and(|until| *until > now) {
            return Ok(PopAttempt::Empty { next_in: None });
        }
        q.lane(lane).advance(now);
        loop {
            let l = q.lane(lane);
            let Some((id, group)) = l.next(config.ordered_groups) else {
                return Ok(PopAttempt::Empty {
                    next_in: l.next_in(now),
                });
            };
            let attempts = l.msgs.get(&id).map_or(0, |m| m.attempts);
            if lane == Lane::Main && config.max_deliveries.is_some_and(|max| attempts >= max) {
                if let Some(mut m) = l.remove(id) {
                    m.at = None;
                    m.holder = None;
                    q.dead.insert(id, m);
                }
                continue;
            }
            // `next` found both, under this shard's lock.
            let (Some(g), true) = (l.groups.get_mut(&group), l.msgs.contains_key(&id)) else {
                return Ok(PopAttempt::Empty { next_in: None });
            };
            let clock = l.clock.max(g.turn);
            g.turn = clock + 1;
            g.ready.remove(&id);
            l.clock = clock;
            let deadline = now + visibility;
            let Some(m) = l.msgs.get_mut(&id) else {
                return Ok(PopAttempt::Empty { next_in: None });
            };
            let token = self.next_token();
            m.attempts += 1;
            m.at = Some(deadline);
            m.holder = Some(*consumer);
            let out = message(id, m);
            l.timeline.insert((deadline, id));
            return Ok(PopAttempt::Delivered {
                message: out,
                token: FencingToken(token),
            });
        }
    }

    async fn ack(
        &self,
        queue: &str,
        lane: Lane,
        id: MessageId,
        consumer: &OwnerToken,
    ) -> Result<bool> {
        let now = Instant::now();
        let more = {
            let mut shard = self.queues.shard(queue);
            let Some(q) = shard.map.get_mut(queue) else {
                return Ok(false);
            };
            if q.held(lane, id.0, consumer, now).is_none() {
                return Ok(false);
            }
            let l = q.lane(lane);
            let m = l.remove(id.0);
            m.is_some_and(|m| l.groups.contains_key(&m.group))
        };
        if more {
            // An ordered group may deliver its next message now.
            self.queue_wakeups.notify_one(&wake_key(queue, lane));
        }
        Ok(true)
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
            let Some(m) = q.held(lane, id.0, consumer, now) else {
                return Ok(false);
            };
            let old = m.at.take();
            m.holder = None;
            let at = (!delay.is_zero()).then(|| now + delay);
            m.at = at;
            let group = m.group.clone();
            let l = q.lane(lane);
            if let Some(t) = old {
                l.timeline.remove(&(t, id.0));
            }
            match at {
                Some(t) => {
                    l.timeline.insert((t, id.0));
                }
                None => {
                    if let Some(g) = l.groups.get_mut(&group) {
                        g.ready.insert(id.0);
                    }
                }
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
            let q = shard.entry(queue, QueueState::default, |q| q.idle(now));
            if q.abandoned.len() > 1024 {
                q.abandoned.retain(|_, until| *until > now);
            }
            q.abandoned
                .insert(*consumer, now + coord_core::ABANDONED_POP_MEMORY);
            let l = q.lane(lane);
            l.advance(now);
            let held = l.msgs.iter_mut().find(|(_, m)| {
                m.holder.as_ref() == Some(consumer) && m.at.is_some_and(|t| t > now)
            });
            match held {
                Some((&id, m)) => {
                    let old = m.at.take();
                    m.holder = None;
                    m.attempts = m.attempts.saturating_sub(1);
                    let group = m.group.clone();
                    if let Some(t) = old {
                        l.timeline.remove(&(t, id));
                    }
                    if let Some(g) = l.groups.get_mut(&group) {
                        g.ready.insert(id);
                    }
                    true
                }
                None => false,
            }
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
        let Some(m) = q.held(lane, id.0, consumer, now) else {
            return Ok(false);
        };
        let old = m.at.replace(now + visibility);
        let l = q.lane(lane);
        if let Some(t) = old {
            l.timeline.remove(&(t, id.0));
        }
        l.timeline.insert((now + visibility, id.0));
        Ok(true)
    }

    async fn peek(&self, queue: &str, lane: Lane, limit: usize) -> Result<Vec<Message>> {
        let shard = self.queues.shard(queue);
        let Some(q) = shard.map.get(queue) else {
            return Ok(Vec::new());
        };
        let l = match lane {
            Lane::Main => &q.main,
            Lane::Dead => &q.dead,
        };
        Ok(l.msgs
            .iter()
            .take(limit)
            .map(|(id, m)| message(*id, m))
            .collect())
    }

    async fn redrive(&self, queue: &str, limit: usize) -> Result<u64> {
        let now = Instant::now();
        let moved = {
            let mut shard = self.queues.shard(queue);
            let Some(q) = shard.map.get_mut(queue) else {
                return Ok(0);
            };
            q.dead.advance(now);
            q.main.advance(now);
            let ids: Vec<u64> = q
                .dead
                .msgs
                .iter()
                .filter(|(_, m)| m.holder.is_none())
                .take(limit)
                .map(|(id, _)| *id)
                .collect();
            for id in &ids {
                if let Some(mut m) = q.dead.remove(*id) {
                    m.attempts = 0;
                    m.at = None;
                    m.holder = None;
                    q.main.insert(*id, m);
                }
            }
            ids.len() as u64
        };
        if moved > 0 {
            self.queue_wakeups.notify_all(&wake_key(queue, Lane::Main));
        }
        Ok(moved)
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats> {
        let now = Instant::now();
        let shard = self.queues.shard(queue);
        let Some(q) = shard.map.get(queue) else {
            return Ok(QueueStats::default());
        };
        let mut s = QueueStats {
            dead: q.dead.msgs.len() as u64,
            ..QueueStats::default()
        };
        for m in q.main.msgs.values() {
            match (m.at, m.holder) {
                (Some(t), Some(_)) if t > now => s.in_flight += 1,
                (Some(t), None) if t > now => s.delayed += 1,
                _ => s.ready += 1,
            }
        }
        Ok(s)
    }

    async fn purge(&self, queue: &str) -> Result<u64> {
        let mut shard = self.queues.shard(queue);
        Ok(shard
            .map
            .remove(queue)
            .map_or(0, |q| (q.main.msgs.len() + q.dead.msgs.len()) as u64))
    }

    async fn subscribe(&self, queue: &str, lane: Lane) -> Result<Waiter> {
        Ok(self.queue_wakeups.subscribe(&wake_key(queue, lane)))
    }
}
