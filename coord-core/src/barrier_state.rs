//! A barrier's state and its transitions, for backends that keep the whole
//! state as one value and decide in the client (the in-memory backend, etcd's
//! compare-and-swap). Backends with server-side scripts (Redis, PostgreSQL)
//! implement the same rules in their store's language; the conformance
//! suite holds them all to the same behaviour.

use crate::error::{Error, Result};
use crate::types::{Arrival, OwnerToken};

/// One barrier: its party count, its current generation, who has arrived
/// in it (with each arrival's id), and the arrival ids of the generation
/// that completed last (so a retried completing arrival is recognised).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BarrierState {
    /// The party count of the current generation (meaningful while anybody
    /// has arrived).
    pub parties: u32,
    /// The current generation.
    pub generation: u64,
    /// The distinct participants of the current generation, each with the
    /// id of the arrival (wait) that recorded it, as 32 hex digits.
    pub arrived: Vec<(String, String)>,
    /// The generation that completed last and its arrival ids.
    pub last: Option<(u64, Vec<String>)>,
}

impl BarrierState {
    /// An idle barrier at `generation`.
    pub fn new(generation: u64) -> Self {
        BarrierState {
            parties: 0,
            generation,
            arrived: Vec::new(),
            last: None,
        }
    }

    /// Record `participant` (arrival id `arrival`) in the current
    /// generation. An idle barrier takes `parties` as its count; a busy one
    /// with another count refuses with [`Error::InvalidArgument`] and changes
    /// nothing. Arriving twice counts once. An arrival id recorded in the
    /// generation that completed last returns that generation as complete
    /// and changes nothing (a retry whose first reply was lost). The
    /// `parties`-th arrival completes the generation and moves to
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
        if self.arrived.iter().any(|(p, _)| p == participant) {
            let arrival = Arrival {
                generation: self.generation,
                complete: false,
            };
            return Ok((arrival, false));
        }
        self.arrived.push((participant.to_string(), id));
        if self.arrived.len() as u64 >= u64::from(self.parties) {
            let g = self.generation;
            self.generation = next_generation(g);
            debug_assert!(self.generation > g, "generations must rise");
            let ids = self.arrived.drain(..).map(|(_, id)| id).collect();
            self.last = Some((g, ids));
            Ok((
                Arrival {
                    generation: g,
                    complete: true,
                },
                true,
            ))
        } else {
            Ok((
                Arrival {
                    generation: self.generation,
                    complete: false,
                },
                true,
            ))
        }
    }

    /// Whether `generation` has completed.
    pub fn is_complete(&self, generation: u64) -> bool {
        self.generation > generation
    }

    /// Withdraw `participant` from `generation` unless it completed.
    /// Returns (`true` if withdrawn or not there, `false` if the generation
    /// completed; whether the state changed).
    pub fn withdraw(&mut self, generation: u64, participant: &str) -> (bool, bool) {
        if self.is_complete(generation) {
            return (false, false);
        }
        let before = self.arrived.len();
        self.arrived.retain(|(p, _)| p != participant);
        (true, self.arrived.len() != before)
    }

    /// Nobody waits: the state may be dropped (if generations keep rising
    /// when it is made again). The last generation's arrival ids go with
    /// it; a retry of an arrival that old finds a new generation (the
    /// barrier went idle, so its waiter has long passed or given up).
    pub fn is_idle(&self) -> bool {
        self.arrived.is_empty()
    }

    /// The state as text: the party count, the generation, the last
    /// completed generation and its arrival ids (`-` if none), then one
    /// arrival per line as `id participant` (names have no control
    /// characters, so a newline never occurs in one; ids have no space).
    pub fn encode(&self) -> String {
        let last = match &self.last {
            Some((g, ids)) => format!("{g} {}", ids.join(",")),
            None => "-".to_string(),
        };
        let mut s = format!("{}\n{}\n{last}", self.parties, self.generation);
        for (p, id) in &self.arrived {
            s.push('\n');
            s.push_str(id);
            s.push(' ');
            s.push_str(p);
        }
        s
    }

    /// Parse [`encode`](BarrierState::encode)'s text; `None` if corrupt.
    pub fn decode(text: &str) -> Option<Self> {
        let mut lines = text.split('\n');
        let parties = lines.next()?.parse().ok()?;
        let generation = lines.next()?.parse().ok()?;
        let last = match lines.next()? {
            "-" => None,
            l => {
                let (g, ids) = l.split_once(' ')?;
                let ids = if ids.is_empty() {
                    Vec::new()
                } else {
                    ids.split(',').map(str::to_string).collect()
                };
                Some((g.parse().ok()?, ids))
            }
        };
        let mut arrived = Vec::new();
        for l in lines {
            let (id, p) = l.split_once(' ')?;
            arrived.push((p.to_string(), id.to_string()));
        }
        Some(BarrierState {
            parties,
            generation,
            arrived,
            last,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_duplicates_mismatch_and_withdraw() {
        let ids: Vec<OwnerToken> = (0..4).map(|_| OwnerToken::random()).collect();
        let mut b = BarrierState::new(7);
        let (a, changed) = b.arrive("x", 2, "p1", &ids[0], |g| g + 1).unwrap();
        assert_eq!((a.generation, a.complete, changed), (7, false, true));
        let (a, changed) = b.arrive("x", 2, "p1", &ids[0], |g| g + 1).unwrap();
        assert_eq!((a.generation, a.complete, changed), (7, false, false));
        let e = b.arrive("x", 3, "p2", &ids[1], |g| g + 1).unwrap_err();
        assert!(matches!(
            e,
            Error::InvalidArgument {
                field: "parties",
                ..
            }
        ));
        assert_eq!(b.arrived.len(), 1);
        let round = BarrierState::decode(&b.encode()).unwrap();
        assert_eq!(round, b);
        let (a, _) = b.arrive("x", 2, "p2", &ids[1], |g| g + 1).unwrap();
        assert_eq!((a.generation, a.complete), (7, true));
        assert!(b.is_complete(7) && !b.is_complete(8) && b.is_idle());
        assert_eq!(b.withdraw(7, "p1"), (false, false));
        b.arrive("x", 5, "q", &ids[2], |g| g + 1).unwrap();
        assert_eq!(b.withdraw(8, "q"), (true, true));
        assert_eq!(b.withdraw(8, "q"), (true, false));
        let round = BarrierState::decode(&b.encode()).unwrap();
        assert_eq!(round, b);
        assert!(BarrierState::decode("x").is_none());
    }

    #[test]
    fn a_retried_completing_arrival_does_not_join_the_next_generation() {
        let (a1, a2) = (OwnerToken::random(), OwnerToken::random());
        let mut b = BarrierState::new(1);
        b.arrive("x", 2, "p1", &a1, |g| g + 1).unwrap();
        let (done, _) = b.arrive("x", 2, "p2", &a2, |g| g + 1).unwrap();
        assert_eq!((done.generation, done.complete), (1, true));
        // p2's reply was lost; the retry carries the same arrival id.
        let (retry, changed) = b.arrive("x", 2, "p2", &a2, |g| g + 1).unwrap();
        assert_eq!(
            (retry.generation, retry.complete, changed),
            (1, true, false)
        );
        assert!(b.is_idle(), "no phantom member in generation 2");
        // A new wait of p2 (new id) joins generation 2 as usual.
        let (next, _) = b
            .arrive("x", 2, "p2", &OwnerToken::random(), |g| g + 1)
            .unwrap();
        assert_eq!((next.generation, next.complete), (2, false));
    }
}
