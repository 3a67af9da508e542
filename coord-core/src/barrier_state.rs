//! A barrier's state and its transitions, for backends that keep the whole
//! state as one value and decide in the client (the in-memory backend, etcd's
//! compare-and-swap). Backends with server-side scripts (Redis, PostgreSQL)
//! implement the same rules in their store's language; the conformance
//! suite holds them all to the same behaviour.

use crate::error::{Error, Result};
use crate::types::Arrival;

/// One barrier: its party count, its current generation and who has
/// arrived in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BarrierState {
    /// The party count of the current generation (meaningful while anybody
    /// has arrived).
    pub parties: u32,
    /// The current generation.
    pub generation: u64,
    /// The distinct participants of the current generation.
    pub arrived: Vec<String>,
}

impl BarrierState {
    /// An idle barrier at `generation`.
    pub fn new(generation: u64) -> Self {
        BarrierState {
            parties: 0,
            generation,
            arrived: Vec::new(),
        }
    }

    /// Record `participant` in the current generation. An idle barrier
    /// takes `parties` as its count; a busy one with another count refuses
    /// with [`Error::InvalidArgument`] and changes nothing. Arriving twice
    /// counts once. The `parties`-th arrival completes the generation and
    /// moves to `next_generation(current)`, which must be greater.
    /// Returns the arrival and whether the state changed.
    pub fn arrive(
        &mut self,
        name: &str,
        parties: u32,
        participant: &str,
        next_generation: impl FnOnce(u64) -> u64,
    ) -> Result<(Arrival, bool)> {
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
        if self.arrived.iter().any(|p| p == participant) {
            let arrival = Arrival {
                generation: self.generation,
                complete: false,
            };
            return Ok((arrival, false));
        }
        self.arrived.push(participant.to_string());
        if self.arrived.len() as u64 >= u64::from(self.parties) {
            let g = self.generation;
            self.generation = next_generation(g);
            debug_assert!(self.generation > g, "generations must rise");
            self.arrived.clear();
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
        self.arrived.retain(|p| p != participant);
        (true, self.arrived.len() != before)
    }

    /// Nobody waits: the state may be dropped (if generations keep rising
    /// when it is made again).
    pub fn is_idle(&self) -> bool {
        self.arrived.is_empty()
    }

    /// The state as text: the party count, the generation, then one
    /// participant per line (names have no control characters, so a
    /// newline never occurs in one).
    pub fn encode(&self) -> String {
        let mut s = format!("{}\n{}", self.parties, self.generation);
        for p in &self.arrived {
            s.push('\n');
            s.push_str(p);
        }
        s
    }

    /// Parse [`encode`](BarrierState::encode)'s text; `None` if corrupt.
    pub fn decode(text: &str) -> Option<Self> {
        let mut lines = text.split('\n');
        let parties = lines.next()?.parse().ok()?;
        let generation = lines.next()?.parse().ok()?;
        Some(BarrierState {
            parties,
            generation,
            arrived: lines.map(str::to_string).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_duplicates_mismatch_and_withdraw() {
        let mut b = BarrierState::new(7);
        let (a, changed) = b.arrive("x", 2, "p1", |g| g + 1).unwrap();
        assert_eq!((a.generation, a.complete, changed), (7, false, true));
        let (a, changed) = b.arrive("x", 2, "p1", |g| g + 1).unwrap();
        assert_eq!((a.generation, a.complete, changed), (7, false, false));
        let e = b.arrive("x", 3, "p2", |g| g + 1).unwrap_err();
        assert!(matches!(
            e,
            Error::InvalidArgument {
                field: "parties",
                ..
            }
        ));
        assert_eq!(b.arrived, vec!["p1".to_string()]);
        let (a, _) = b.arrive("x", 2, "p2", |g| g + 1).unwrap();
        assert_eq!((a.generation, a.complete), (7, true));
        assert!(b.is_complete(7) && !b.is_complete(8) && b.is_idle());
        assert_eq!(b.withdraw(7, "p1"), (false, false));
        b.arrive("x", 5, "q", |g| g + 1).unwrap();
        assert_eq!(b.withdraw(8, "q"), (true, true));
        assert_eq!(b.withdraw(8, "q"), (true, false));
        let round = BarrierState::decode(&b.encode()).unwrap();
        assert_eq!(round, b);
        assert!(BarrierState::decode("x").is_none());
    }
}
