//! One lane of a queue: its messages by id, its groups (every id, the
//! ready ids, the turn), the timeline of messages waiting for a time and
//! the lane's virtual clock.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::{candidate, serve_turn};
use crate::queue_backend::{Message, MessageId};
use crate::types::OwnerToken;

/// A stored message.
#[derive(Debug, Clone)]
pub(super) struct Msg {
    pub(super) payload: Arc<[u8]>,
    pub(super) group: Box<str>,
    pub(super) attempts: u32,
    pub(super) enqueued_at: SystemTime,
    /// Delayed until, or in flight until (with `holder`).
    pub(super) at: Option<Instant>,
    pub(super) holder: Option<OwnerToken>,
}

impl Msg {
    /// The message as a delivery or a peek shows it.
    pub(super) fn message(&self, id: u64) -> Message {
        Message {
            id: MessageId(id),
            payload: self.payload.to_vec(),
            group: (!self.group.is_empty()).then(|| self.group.to_string()),
            attempts: self.attempts,
            enqueued_at: self.enqueued_at,
        }
    }

    /// Whether it is in flight to `owner` and its deadline has not passed.
    pub(super) fn held_by(&self, owner: &OwnerToken, now: Instant) -> bool {
        self.holder.as_ref() == Some(owner) && self.at.is_some_and(|t| t > now)
    }
}

/// One group of a lane, kept while it has messages in the lane.
#[derive(Debug, Clone, Default)]
pub(super) struct Group {
    /// Every id of the group in this lane.
    pub(super) all: BTreeSet<u64>,
    /// The ready ones.
    pub(super) ready: BTreeSet<u64>,
    pub(super) turn: u64,
}

/// One lane's messages, groups, timeline and clock.
#[derive(Debug, Clone, Default)]
pub(super) struct LaneState {
    pub(super) msgs: BTreeMap<u64, Msg>,
    pub(super) groups: HashMap<Box<str>, Group>,
    /// (time, id): delayed messages and in-flight deadlines.
    pub(super) timeline: BTreeSet<(Instant, u64)>,
    pub(super) clock: u64,
}

impl LaneState {
    /// Make due delayed messages and lapsed deliveries ready.
    pub(super) fn advance(&mut self, now: Instant) {
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
    pub(super) fn insert(&mut self, id: u64, msg: Msg) {
        let clock = self.clock;
        let g = self.groups.entry(msg.group.clone()).or_default();
        if g.all.is_empty() {
            // After the turn being served: a group that leaves and comes
            // back does not go before groups that waited.
            g.turn = g.turn.max(clock.saturating_add(1));
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
    pub(super) fn remove(&mut self, id: u64) -> Option<Msg> {
        let m = self.msgs.remove(&id)?;
        if let Some(t) = m.at {
            self.timeline.remove(&(t, id));
        }
        if let Some(g) = self.groups.get_mut(&m.group) {
            g.all.remove(&id);
            g.ready.remove(&id);
            if g.all.is_empty() {
                // Its turn is not kept: coming back it starts at the clock + 1.
                self.groups.remove(&m.group);
            }
        }
        Some(m)
    }

    /// The id to deliver next, per the rule, and its group.
    pub(super) fn next(&self, ordered: bool) -> Option<(u64, Box<str>)> {
        let mut best: Option<(u64, u64, &Box<str>)> = None;
        for (name, g) in &self.groups {
            let lowest = g.all.first().copied();
            let cand = candidate(ordered, lowest, g.ready.first().copied());
            if let Some(id) = cand {
                let key = (g.turn, id);
                if best.is_none_or(|(t, i, _)| key < (t, i)) {
                    best = Some((g.turn, id, name));
                }
            }
        }
        best.map(|(_, id, name)| (id, name.clone()))
    }

    /// Serve group `group`: the lane's clock moves to its turn (never
    /// back), the group queues one past it, and `id` leaves its ready ids.
    /// `false` if the group is not there.
    pub(super) fn serve(&mut self, group: &str, id: u64) -> bool {
        let Some(g) = self.groups.get_mut(group) else {
            return false;
        };
        let (clock, turn) = serve_turn(self.clock, g.turn);
        g.turn = turn;
        g.ready.remove(&id);
        self.clock = clock;
        true
    }

    /// Make message `id` ready again, or delayed until `at` (a nack, an
    /// abandon): its holder and deadline go.
    pub(super) fn give_back(&mut self, id: u64, at: Option<Instant>) {
        let Some(m) = self.msgs.get_mut(&id) else {
            return;
        };
        let old = m.at.take();
        m.holder = None;
        m.at = at;
        let group = m.group.clone();
        if let Some(t) = old {
            self.timeline.remove(&(t, id));
        }
        match at {
            Some(t) => {
                self.timeline.insert((t, id));
            }
            None => {
                if let Some(g) = self.groups.get_mut(&group) {
                    g.ready.insert(id);
                }
            }
        }
    }

    /// Move message `id`'s time to `at` (an extend): its entry on the
    /// timeline moves with it.
    pub(super) fn reschedule(&mut self, id: u64, at: Instant) {
        let Some(m) = self.msgs.get_mut(&id) else {
            return;
        };
        if let Some(t) = m.at.replace(at) {
            self.timeline.remove(&(t, id));
        }
        self.timeline.insert((at, id));
    }

    /// The time until the first entry of the timeline.
    pub(super) fn next_in(&self, now: Instant) -> Option<Duration> {
        self.timeline
            .first()
            .map(|(t, _)| t.saturating_duration_since(now))
    }

    pub(super) fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }
}
