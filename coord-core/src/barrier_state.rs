//! A barrier's state and its transitions, for backends that keep the whole
//! state as one value and decide in the client (the in-memory backend, etcd's
//! compare-and-swap). Backends with server-side scripts (Redis, PostgreSQL)
//! implement the same rules in their store's language; the conformance
//! suite holds them all to the same behaviour.

#[cfg(test)]
mod tests;

use crate::error::{Error, Result};
use crate::types::{Arrival, OwnerToken};

/// One barrier: its party count, its current generation, the generation
/// this state was made at, who has arrived in it (with each arrival's id),
/// the arrival ids withdrawn from it, and the arrival ids of the
/// generation that completed last (so a retried completing arrival is
/// recognised).
///
/// Every cleanup names the arrival it undoes: a withdraw removes one
/// arrival id (a participant's next wait stays) and leaves a tombstone of
/// it, so a late copy of that arrival is refused. Tombstones belong to the
/// current generation and are cleared when it completes.
///
/// Each participant's newest arrival that passed is remembered by its
/// stamp ([`OwnerToken::stamp`]: arrival ids rise with time within a
/// process): an arrival stamped no later is a late copy of a wait that has
/// ended (its generation may have completed long ago) and is refused, so
/// it never counts in a later generation. Stamps more than
/// [`LATE_COPY_HORIZON`](crate::late::LATE_COPY_HORIZON) older than the
/// newest are forgotten.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BarrierState {
    /// The party count of the current generation (meaningful while anybody
    /// has arrived).
    pub parties: u32,
    /// The current generation.
    pub generation: u64,
    /// The generation this state was made at: a generation below it
    /// belongs to an earlier state of the barrier, lost (expired, swept)
    /// with its arrivals. 0: never lost (the state is only dropped idle).
    pub born: u64,
    /// The arrivals of the current generation: participant and arrival id
    /// (32 hex digits). A participant may appear with several ids (two
    /// waits); it counts once.
    pub arrived: Vec<(String, String)>,
    /// The arrival ids withdrawn from the current generation (tombstones).
    pub withdrawn: Vec<String>,
    /// The generation that completed last and its arrival ids.
    pub last: Option<(u64, Vec<String>)>,
    /// Each participant's newest arrival stamp among those that passed or
    /// were withdrawn: an arrival of the participant stamped no later is a
    /// late copy of a wait that has ended, and counts nowhere (a
    /// withdrawn arrival's tombstone goes when its generation completes;
    /// this outlives it, to [`LATE_COPY_HORIZON`](crate::late::LATE_COPY_HORIZON)).
    pub latest: Vec<(String, u64)>,
}

impl BarrierState {
    /// An idle barrier made at `generation` (its birth).
    pub fn new(generation: u64) -> Self {
        BarrierState {
            parties: 0,
            generation,
            born: generation,
            arrived: Vec::new(),
            withdrawn: Vec::new(),
            last: None,
            latest: Vec::new(),
        }
    }

    /// The number of distinct participants of the current generation.
    fn members(&self) -> usize {
        let mut seen: Vec<&str> = Vec::with_capacity(self.arrived.len());
        for (p, _) in &self.arrived {
            if !seen.contains(&p.as_str()) {
                seen.push(p);
            }
        }
        seen.len()
    }

    /// Record `participant` (arrival id `arrival`) in the current
    /// generation. An idle barrier takes `parties` as its count; a busy one
    /// with another count refuses with [`Error::InvalidArgument`] and changes
    /// nothing. Arriving twice counts once. An arrival id recorded in the
    /// generation that completed last returns that generation as complete
    /// and changes nothing (a retry whose first reply was lost). A
    /// withdrawn arrival id is refused with [`Error::ArrivalLost`] and
    /// changes nothing (a late copy of an undone arrival). The
    /// `parties`-th participant completes the generation and moves to
    /// `next_generation(current)`, which must be greater.
    /// Returns the arrival and whether the state changed.
    pub fn arrive(
        &mut self,
        name: &str,
        parties: u32,
        participant: &str,
        arrival: &OwnerToken,
        next_generation: impl FnOnce(u64) -> u64,
    ) -> Result<(Arrival, bool)> {
        let id = arrival.to_hex();
        if let Some((g, ids)) = &self.last {
            if ids.contains(&id) {
                let arrival = Arrival {
                    generation: *g,
                    complete: true,
                };
                return Ok((arrival, false));
            }
        }
        if self.withdrawn.contains(&id) {
            return Err(Error::arrival_withdrawn(name));
        }
        if !self.arrived.iter().any(|(_, a)| *a == id)
            && self
                .latest
                .iter()
                .any(|(p, s)| p == participant && *s >= arrival.stamp())
        {
            // A late copy of an arrival no newer than one of this
            // participant's that passed: its wait has ended.
            return Err(Error::arrival_withdrawn(name));
        }
        if self.arrived.is_empty() {
            self.parties = parties;
        } else if self.parties != parties {
            return Err(Error::invalid(
                "parties",
                format!(
                    "barrier `{name}` is in use with {} parties; this call said {parties}",
                    self.parties
                ),
            ));
        }
        let open = Arrival {
            generation: self.generation,
            complete: false,
        };
        if self.arrived.iter().any(|(_, a)| *a == id) {
            return Ok((open, false));
        }
        let member = self.arrived.iter().any(|(p, _)| p == participant);
        self.arrived.push((participant.to_string(), id));
        if member || (self.members() as u64) < u64::from(self.parties) {
            // A second wait of a member counts once.
            return Ok((open, true));
        }
        let g = self.generation;
        self.generation = next_generation(g);
        debug_assert!(self.generation > g, "generations must rise");
        let arrived: Vec<(String, String)> = self.arrived.drain(..).collect();
        for (p, id) in &arrived {
            if let Some(t) = OwnerToken::from_hex(id) {
                self.note_latest(p, t.stamp());
            }
        }
        let ids = arrived.into_iter().map(|(_, id)| id).collect();
        self.withdrawn.clear();
        self.last = Some((g, ids));
        let done = Arrival {
            generation: g,
            complete: true,
        };
        Ok((done, true))
    }

    /// Remember `stamp` as `participant`'s newest arrival, and forget
    /// stamps past the horizon; whether that changed anything.
    fn note_latest(&mut self, participant: &str, stamp: u64) -> bool {
        let before = self.latest.clone();
        match self.latest.iter_mut().find(|(p, _)| p == participant) {
            Some((_, s)) => *s = (*s).max(stamp),
            None => self.latest.push((participant.to_string(), stamp)),
        }
        let newest = self.latest.iter().map(|(_, s)| *s).max().unwrap_or(0);
        let horizon = crate::late::LATE_COPY_HORIZON.as_micros() as u64;
        self.latest
            .retain(|(_, s)| s.saturating_add(horizon) >= newest);
        self.latest != before
    }

    /// Whether `generation` has completed; [`Error::ArrivalLost`] if it
    /// belongs to an earlier state of the barrier (lost with its arrivals:
    /// whether it completed is unknown, and it must not pass).
    pub fn is_complete(&self, name: &str, generation: u64) -> Result<bool> {
        if generation < self.born {
            return Err(Error::arrival_state_lost(name, generation));
        }
        Ok(self.generation > generation)
    }

    /// Withdraw arrival `arrival` of `participant` from `generation`
    /// unless that completed, and leave a tombstone of the id in the
    /// current generation. Only that arrival goes: the participant's other
    /// arrivals (a next wait) stay. A generation of an earlier state (lost)
    /// has nothing to withdraw. Returns (`true` if the arrival no longer
    /// counts, `false` if the generation completed; whether the state
    /// changed).
    pub fn withdraw(
        &mut self,
        generation: u64,
        participant: &str,
        arrival: &OwnerToken,
    ) -> (bool, bool) {
        if generation >= self.born && self.generation > generation {
            return (false, false);
        }
        let id = arrival.to_hex();
        let before = self.arrived.len();
        self.arrived
            .retain(|(p, a)| !(p == participant && *a == id));
        let mut changed = self.arrived.len() != before;
        if !self.withdrawn.contains(&id) {
            self.withdrawn.push(id);
            changed = true;
        }
        // Outlives the tombstone: a late copy landing after the open
        // generation completed is refused by its stamp.
        changed |= self.note_latest(participant, arrival.stamp());
        (true, changed)
    }

    /// Nobody waits and no withdrawn arrival is remembered: the state may
    /// be dropped (if generations keep rising when it is made again). The
    /// last generation's arrival ids go with it; a retry of an arrival
    /// that old finds a new generation (the barrier went idle, so its
    /// waiter has long passed or given up).
    pub fn is_idle(&self) -> bool {
        self.arrived.is_empty() && self.withdrawn.is_empty()
    }

    /// The state as text: the party count, the generation, the last
    /// completed generation and its arrival ids (`-` if none), `=` with the
    /// birth and the withdrawn ids, then one arrival per line as
    /// `id participant`, after one line per participant's newest stamp as
    /// `~stamp participant` (names have no control characters, so a
    /// newline never occurs in one; ids have no space and no `~`).
    pub fn encode(&self) -> String {
        let last = match &self.last {
            Some((g, ids)) => format!("{g} {}", ids.join(",")),
            None => "-".to_string(),
        };
        let mut s = format!(
            "{}\n{}\n{last}\n={} {}",
            self.parties,
            self.generation,
            self.born,
            self.withdrawn.join(",")
        );
        for (p, stamp) in &self.latest {
            s.push_str(&format!("\n~{stamp} {p}"));
        }
        for (p, id) in &self.arrived {
            s.push('\n');
            s.push_str(id);
            s.push(' ');
            s.push_str(p);
        }
        s
    }

    /// Parse [`encode`](BarrierState::encode)'s text; `None` if corrupt.
    /// Text written before births and tombstones were kept reads as born
    /// 0 with none withdrawn.
    pub fn decode(text: &str) -> Option<Self> {
        let ids = |s: &str| -> Vec<String> {
            if s.is_empty() {
                Vec::new()
            } else {
                s.split(',').map(str::to_string).collect()
            }
        };
        let mut lines = text.split('\n').peekable();
        let parties = lines.next()?.parse().ok()?;
        let generation = lines.next()?.parse().ok()?;
        let last = match lines.next()? {
            "-" => None,
            l => {
                let (g, l) = l.split_once(' ')?;
                Some((g.parse().ok()?, ids(l)))
            }
        };
        let (mut born, mut withdrawn) = (0, Vec::new());
        if let Some(l) = lines.next_if(|l| l.starts_with('=')) {
            let (b, w) = l[1..].split_once(' ')?;
            born = b.parse().ok()?;
            withdrawn = ids(w);
        }
        let mut arrived = Vec::new();
        let mut latest = Vec::new();
        for l in lines {
            if let Some(l) = l.strip_prefix('~') {
                let (stamp, p) = l.split_once(' ')?;
                latest.push((p.to_string(), stamp.parse().ok()?));
                continue;
            }
            let (id, p) = l.split_once(' ')?;
            arrived.push((p.to_string(), id.to_string()));
        }
        Some(BarrierState {
            parties,
            generation,
            born,
            arrived,
            withdrawn,
            last,
            latest,
        })
    }
}
