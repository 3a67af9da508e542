//! The rules [`QueueState`](super::super::QueueState) is held to, written
//! plainly: one list of every message pushed (acked ones kept, marked),
//! scanned at every step; each lane's clock and its groups' turns.
//!
//! The turn rule: a lane has a clock `V`; a group present in the lane has
//! a turn; a group with no message in the lane that gets one starts at
//! `turn = V + 1` (after the turn being served). A pop delivers, among the groups' candidates (unordered:
//! the group's lowest ready id; ordered: its lowest id, if ready), the one
//! of the lowest `(turn, id)`, and then sets `V = max(V, turn)` and the
//! group's turn to `V + 1`. A group leaving the lane forgets its turn.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::queue_backend::{ABANDONED_POP_MEMORY, Lane, QueueConfig};
use crate::types::OwnerToken;

/// Where a pushed message is, as the rules say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    Ready,
    Delayed,
    InFlight,
    Dead,
    Acked,
}

/// One message pushed (not a duplicate).
#[derive(Debug, Clone)]
pub(super) struct MMsg {
    pub(super) lane: Lane,
    pub(super) group: String,
    pub(super) payload: Vec<u8>,
    pub(super) enqueued_at: SystemTime,
    pub(super) attempts: u32,
    /// Delayed or in flight until (with `holder`); `None`: ready.
    pub(super) at: Option<Instant>,
    pub(super) holder: Option<OwnerToken>,
    pub(super) acked: bool,
    /// The consumers of its deliveries, oldest first, with the tokens.
    pub(super) deliveries: Vec<(OwnerToken, u64)>,
    /// Its attempts before its latest delivery.
    pub(super) attempts_before: u32,
}

/// What a pop should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Expect {
    Delivered { id: u64, attempts: u32, token: u64 },
    Empty(Option<Duration>),
}

fn li(lane: Lane) -> usize {
    match lane {
        Lane::Main => 0,
        Lane::Dead => 1,
    }
}

/// The model's state.
#[derive(Debug)]
pub(super) struct Model {
    pub(super) now: Instant,
    pub(super) msgs: BTreeMap<u64, MMsg>,
    pub(super) clock: [u64; 2],
    pub(super) turns: [BTreeMap<String, u64>; 2],
    /// Dedup id: the first message's id, and the end of the window its
    /// first push opened.
    pub(super) dedup: HashMap<String, (u64, Instant)>,
    pub(super) abandoned: Vec<(OwnerToken, Instant)>,
    /// The last id or token issued.
    pub(super) counter: u64,
    pub(super) window: Duration,
    pub(super) config: QueueConfig,
}

impl Model {
    pub(super) fn new(now: Instant, window: Duration, config: QueueConfig) -> Self {
        Model {
            now,
            msgs: BTreeMap::new(),
            clock: [0; 2],
            turns: [BTreeMap::new(), BTreeMap::new()],
            dedup: HashMap::new(),
            abandoned: Vec::new(),
            counter: 0,
            window,
            config,
        }
    }

    /// Time passes: delays and deadlines that came due make their
    /// messages ready.
    pub(super) fn advance(&mut self, by: Duration) {
        self.now += by;
        for m in self.msgs.values_mut() {
            if m.at.is_some_and(|t| t <= self.now) {
                m.at = None;
                m.holder = None;
            }
        }
    }

    pub(super) fn class(&self, id: u64) -> Class {
        let m = &self.msgs[&id];
        match (m.acked, m.lane, m.at, m.holder) {
            (true, ..) => Class::Acked,
            (_, Lane::Dead, ..) => Class::Dead,
            (_, _, None, _) => Class::Ready,
            (_, _, Some(_), Some(_)) => Class::InFlight,
            (_, _, Some(_), None) => Class::Delayed,
        }
    }

    /// The live messages of `lane` in group `g`, lowest id first.
    fn members(&self, lane: Lane, g: &str) -> Vec<u64> {
        let live = |m: &MMsg| !m.acked && m.lane == lane && m.group == g;
        self.msgs
            .iter()
            .filter(|(_, m)| live(m))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Put `id` into `lane` (a group new to the lane starts at its clock + 1).
    fn enter(&mut self, lane: Lane, id: u64) {
        let g = self.msgs[&id].group.clone();
        if self.members(lane, &g).is_empty() {
            self.turns[li(lane)].insert(g, self.clock[li(lane)] + 1);
        }
        let m = self.msgs.get_mut(&id).expect("known");
        m.lane = lane;
    }

    /// Take `id` out of its lane (`acked`: for good).
    fn leave(&mut self, id: u64, acked: bool) {
        let m = self.msgs.get_mut(&id).expect("known");
        let (lane, g) = (m.lane, m.group.clone());
        // Out of every lane while it moves.
        m.acked = true;
        if self.members(lane, &g).is_empty() {
            self.turns[li(lane)].remove(&g);
        }
        self.msgs.get_mut(&id).expect("known").acked = acked;
    }

    /// A push: `None` for a duplicate (with the first message's id).
    pub(super) fn push(
        &mut self,
        payload: Vec<u8>,
        enqueued_at: SystemTime,
        delay: Duration,
        group: &str,
        dedup: Option<&str>,
    ) -> (u64, bool) {
        if let Some(d) = dedup {
            if let Some((id, until)) = self.dedup.get(d) {
                if *until > self.now {
                    return (*id, true);
                }
            }
        }
        self.counter += 1;
        let id = self.counter;
        if let Some(d) = dedup {
            self.dedup
                .insert(d.to_string(), (id, self.now + self.window));
        }
        let at = (!delay.is_zero()).then(|| self.now + delay);
        let m = MMsg {
            lane: Lane::Main,
            group: group.to_string(),
            payload,
            enqueued_at,
            attempts: 0,
            at,
            holder: None,
            acked: true,
            deliveries: Vec::new(),
            attempts_before: 0,
        };
        self.msgs.insert(id, m);
        self.enter(Lane::Main, id);
        self.msgs.get_mut(&id).expect("known").acked = false;
        (id, false)
    }

    fn is_abandoned(&self, who: &OwnerToken) -> bool {
        self.abandoned
            .iter()
            .any(|(t, until)| t == who && *until > self.now)
    }

    /// A group's candidate: unordered, its lowest ready id; ordered, its
    /// lowest id if ready.
    fn candidate_of(&self, lane: Lane, g: &str) -> Option<u64> {
        let ids = self.members(lane, g);
        let ready = |id: &&u64| self.msgs[*id].at.is_none();
        if self.config.ordered_groups {
            ids.first().filter(ready).copied()
        } else {
            ids.iter().find(ready).copied()
        }
    }

    /// A pop by `who` for `visibility`.
    pub(super) fn pop(&mut self, lane: Lane, who: OwnerToken, visibility: Duration) -> Expect {
        if self.is_abandoned(&who) {
            return Expect::Empty(None);
        }
        loop {
            let mut best: Option<(u64, u64, String)> = None;
            for (g, turn) in &self.turns[li(lane)] {
                if let Some(id) = self.candidate_of(lane, g) {
                    if best.as_ref().is_none_or(|(t, i, _)| (*turn, id) < (*t, *i)) {
                        best = Some((*turn, id, g.clone()));
                    }
                }
            }
            let Some((turn, id, g)) = best else {
                let next = self
                    .msgs
                    .values()
                    .filter(|m| !m.acked && m.lane == lane)
                    .filter_map(|m| m.at)
                    .min();
                return Expect::Empty(next.map(|t| t - self.now));
            };
            let max = self.config.max_deliveries;
            if lane == Lane::Main && max.is_some_and(|max| self.msgs[&id].attempts >= max) {
                self.leave(id, false);
                self.enter(Lane::Dead, id);
                continue;
            }
            let v = self.clock[li(lane)].max(turn);
            self.clock[li(lane)] = v;
            self.turns[li(lane)].insert(g, v + 1);
            self.counter += 1;
            let (now, token) = (self.now, self.counter);
            let m = self.msgs.get_mut(&id).expect("known");
            m.attempts_before = m.attempts;
            m.attempts += 1;
            m.at = Some(now + visibility);
            m.holder = Some(who);
            m.deliveries.push((who, token));
            return Expect::Delivered {
                id,
                attempts: m.attempts,
                token,
            };
        }
    }

    /// Whether `id` is in flight in `lane` to `who`, deadline not passed.
    pub(super) fn held(&self, lane: Lane, id: u64, who: &OwnerToken) -> bool {
        self.msgs.get(&id).is_some_and(|m| {
            !m.acked
                && m.lane == lane
                && m.holder.as_ref() == Some(who)
                && m.at.is_some_and(|t| t > self.now)
        })
    }

    /// An ack: `Some(whether the group has more)` if taken.
    pub(super) fn ack(&mut self, lane: Lane, id: u64, who: &OwnerToken) -> Option<bool> {
        if !self.held(lane, id, who) {
            return None;
        }
        self.leave(id, true);
        let g = self.msgs[&id].group.clone();
        Some(!self.members(lane, &g).is_empty())
    }

    pub(super) fn nack(&mut self, lane: Lane, id: u64, who: &OwnerToken, delay: Duration) -> bool {
        if !self.held(lane, id, who) {
            return false;
        }
        let now = self.now;
        let m = self.msgs.get_mut(&id).expect("known");
        m.holder = None;
        m.at = (!delay.is_zero()).then(|| now + delay);
        true
    }

    pub(super) fn extend(&mut self, lane: Lane, id: u64, who: &OwnerToken, vis: Duration) -> bool {
        if !self.held(lane, id, who) {
            return false;
        }
        let now = self.now;
        self.msgs.get_mut(&id).expect("known").at = Some(now + vis);
        true
    }

    /// An abandon: the message given back, if any.
    pub(super) fn abandon(&mut self, lane: Lane, who: OwnerToken) -> Option<u64> {
        self.abandoned.push((who, self.now + ABANDONED_POP_MEMORY));
        let id = *self.msgs.keys().find(|id| self.held(lane, **id, &who))?;
        let m = self.msgs.get_mut(&id).expect("known");
        m.attempts = m.attempts.saturating_sub(1);
        m.at = None;
        m.holder = None;
        Some(id)
    }

    /// A redrive of up to `limit` dead letters not in flight.
    pub(super) fn redrive(&mut self, limit: usize) -> u64 {
        let ids: Vec<u64> = self
            .msgs
            .iter()
            .filter(|(_, m)| !m.acked && m.lane == Lane::Dead && m.holder.is_none())
            .take(limit)
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            self.leave(*id, false);
            let m = self.msgs.get_mut(id).expect("known");
            m.attempts = 0;
            m.at = None;
            m.holder = None;
            self.enter(Lane::Main, *id);
        }
        ids.len() as u64
    }

    /// Whether nothing is left that matters now.
    pub(super) fn idle(&self) -> bool {
        self.msgs.values().all(|m| m.acked)
            && self.dedup.values().all(|(_, until)| *until <= self.now)
            && !self.abandoned.iter().any(|(_, until)| *until > self.now)
    }
}
