//! One lane of a queue: its messages by id, its groups (every id, the
//! ready ids, the turn), the timeline of messages waiting for a time and
//! the lane's virtual clock.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::{Turns, candidate, serve_turn};
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
    /// Its place across groups ([`Turns::PerMessage`]): given when it is
    /// first ready.
    pub(super) turn: Option<u64>,
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
    /// The highest turn given to its messages ([`Turns::PerMessage`]).
    pub(super) last: Option<u64>,
}

/// One lane's messages, groups, timeline and clock.
#[derive(Debug, Clone, Default)]
pub(super) struct LaneState {
    pub(super) msgs: BTreeMap<u64, Msg>,
    pub(super) groups: HashMap<Box<str>, Group>,
    /// (time, id): delayed messages and in-flight deadlines.
    pub(super) timeline: BTreeSet<(Instant, u64)>,
    pub(super) clock: u64,
    pub(super) turns: Turns,
}

impl LaneState {
    /// Make due delayed messages and lapsed deliveries ready.
    /// With [`Turns::PerMessage`], V is taken once, before them: a message
    /// that had a turn takes max(turn, V), one pushed with a delay its
    /// first turn as a new message of its group, in the order they came
    /// due.
    pub(super) fn advance(&mut self, now: Instant) {
        let v = self.v();
        while let Some(&(t, id)) = self.timeline.first() {
            if t > now {
                break;
            }
            self.timeline.pop_first();
            let per_message = self.turns == Turns::PerMessage;
            if let Some(m) = self.msgs.get_mut(&id) {
                if m.at == Some(t) {
                    m.at = None;
                    m.holder = None;
                    if let Some(g) = self.groups.get_mut(&m.group) {
                        g.ready.insert(id);
                        if per_message {
                            let turn = match m.turn {
                                Some(old) => old.max(v),
                                None => g.last.map_or(v, |l| v.max(l.saturating_add(1))),
                            };
                            m.turn = Some(turn);
                            g.last = Some(g.last.map_or(turn, |l| l.max(turn)));
                        }
                    }
                }
            }
        }
    }

    /// V, the lane's current turn ([`Turns::PerMessage`]): the lowest turn
    /// of its ready messages, or with none ready the highest turn given in
    /// it (0 for an empty lane).
    pub(super) fn v(&self) -> u64 {
        let ready = self
            .groups
            .values()
            .flat_map(|g| g.ready.iter())
            .filter_map(|id| self.msgs.get(id).and_then(|m| m.turn))
            .min();
        ready
            .or_else(|| self.groups.values().filter_map(|g| g.last).max())
            .unwrap_or(0)
    }

    /// Insert a message (ready, or delayed until `at`).
    pub(super) fn insert(&mut self, id: u64, msg: Msg) {
        let v = self.v();
        self.insert_at(id, msg, v);
    }

    /// [`insert`](Self::insert) with V given (a batch takes it once).
    pub(super) fn insert_at(&mut self, id: u64, mut msg: Msg, v: u64) {
        let clock = self.clock;
        let per_message = self.turns == Turns::PerMessage;
        let g = self.groups.entry(msg.group.clone()).or_default();
        if per_message && msg.at.is_none() {
            // A group's entry lives only while it has messages (`remove`
            // drops it with its last one), so a last turn means the group
            // has other messages in the lane: this one goes after them.
            let turn = g.last.map_or(v, |l| v.max(l.saturating_add(1)));
            msg.turn = Some(turn);
            g.last = Some(turn);
        }
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
            let cand = match self.turns {
                Turns::PerGroup => {
                    candidate(ordered, lowest, g.ready.first().copied()).map(|id| (g.turn, id))
                }
                Turns::PerMessage if ordered => candidate(true, lowest, g.ready.first().copied())
                    .map(|id| (self.turn_of(id), id)),
                Turns::PerMessage => g.ready.iter().map(|&id| (self.turn_of(id), id)).min(),
            };
            if let Some((turn, id)) = cand {
                let key = (turn, id);
                if best.is_none_or(|(t, i, _)| key < (t, i)) {
                    best = Some((turn, id, name));
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
        if self.turns == Turns::PerMessage {
            g.ready.remove(&id);
            return true;
        }
        let (clock, turn) = serve_turn(self.clock, g.turn);
        g.turn = turn;
        g.ready.remove(&id);
        self.clock = clock;
        true
    }

    /// Make message `id` ready again, or delayed until `at` (a nack, an
    /// abandon): its holder and deadline go.
    /// With [`Turns::PerMessage`], one ready at once takes max(turn, V).
    pub(super) fn give_back(&mut self, id: u64, at: Option<Instant>) {
        let v = self.v();
        let per_message = self.turns == Turns::PerMessage;
        let Some(m) = self.msgs.get_mut(&id) else {
            return;
        };
        if per_message && at.is_none() {
            let turn = m.turn.map_or(v, |t| t.max(v));
            m.turn = Some(turn);
            if let Some(g) = self.groups.get_mut(&m.group) {
                g.last = Some(g.last.map_or(turn, |l| l.max(turn)));
            }
        }
        m.holder = None;
        if let Some(t) = std::mem::replace(&mut m.at, at) {
            self.timeline.remove(&(t, id));
        }
        match at {
            Some(t) => {
                self.timeline.insert((t, id));
            }
            None => {
                if let Some(g) = self.groups.get_mut(&m.group) {
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

    /// A message's turn ([`Turns::PerMessage`]).
    fn turn_of(&self, id: u64) -> u64 {
        self.msgs.get(&id).and_then(|m| m.turn).unwrap_or(0)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }
}
