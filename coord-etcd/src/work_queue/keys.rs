//! The work queue's key layout and the records stored under it (see
//! `work_queue.rs` for what each key is for).
//!
//! Everything of one queue name lives under `<prefix>wq/<escaped name>/`;
//! lanes are `M` (main) and `D` (dead), groups are written `_<escaped
//! group>` (the group `""` is `_`), ids and times are 20-digit decimals so
//! that keys sort by them.

use coord_core::queue_state::candidate;
use coord_core::{Lane, OwnerToken};

use crate::client::keys::{escape, prefix_end};

/// `M` or `D`.
fn tag(l: Lane) -> &'static str {
    match l {
        Lane::Main => "M",
        Lane::Dead => "D",
    }
}

/// A number as it is written into keys.
fn num(n: u64) -> String {
    format!("{n:020}")
}

/// The number in the last 20 bytes of `key`.
pub(crate) fn id_of(key: &[u8]) -> Option<u64> {
    let tail = key.get(key.len().checked_sub(20)?..)?;
    std::str::from_utf8(tail).ok()?.parse().ok()
}

/// The two numbers `<a:020>/<b:020>` at the end of `key`.
pub(crate) fn pair_of(key: &[u8]) -> Option<(u64, u64)> {
    let start = key.len().checked_sub(41)?;
    let first = key.get(start..start + 20)?;
    if key.get(start + 20) != Some(&b'/') {
        return None;
    }
    let a = std::str::from_utf8(first).ok()?.parse().ok()?;
    Some((a, id_of(key)?))
}

/// The keys of one queue name.
#[derive(Debug, Clone)]
pub(crate) struct QKeys {
    base: String,
}

impl QKeys {
    /// `base`: `<prefix>wq/<escaped name>/`.
    pub(crate) fn new(base: String) -> Self {
        QKeys { base }
    }

    fn k(&self, tail: &str) -> Vec<u8> {
        format!("{}{tail}", self.base).into_bytes()
    }

    /// Every key of the queue: `[start, end)`.
    pub(crate) fn all(&self) -> (Vec<u8>, Vec<u8>) {
        let b = self.base.as_bytes().to_vec();
        let e = prefix_end(&b);
        (b, e)
    }

    /// `m/`: the message records of both lanes.
    pub(crate) fn metas_both(&self) -> Vec<u8> {
        self.k("m/")
    }

    /// `m/<lane>/`: the lane's message records by id.
    pub(crate) fn metas(&self, l: Lane) -> Vec<u8> {
        self.k(&format!("m/{}/", tag(l)))
    }

    /// `m/<lane>/<id>`.
    pub(crate) fn meta(&self, l: Lane, id: u64) -> Vec<u8> {
        self.k(&format!("m/{}/{}", tag(l), num(id)))
    }

    /// `p/<lane>/<id>`.
    pub(crate) fn payload(&self, l: Lane, id: u64) -> Vec<u8> {
        self.k(&format!("p/{}/{}", tag(l), num(id)))
    }

    /// `g/<lane>/`: the lane's group records.
    pub(crate) fn groups(&self, l: Lane) -> Vec<u8> {
        self.k(&format!("g/{}/", tag(l)))
    }

    /// `g/<lane>/_<group>`: the group's record (turn, lowest ready id).
    pub(crate) fn group(&self, l: Lane, g: &str) -> Vec<u8> {
        self.k(&format!("g/{}/_{}", tag(l), escape(g)))
    }

    /// `h/<lane>/_<group>`: the group's head (lowest id).
    pub(crate) fn head(&self, l: Lane, g: &str) -> Vec<u8> {
        self.k(&format!("h/{}/_{}", tag(l), escape(g)))
    }

    /// `a/<lane>/_<group>/`: every message of the group in the lane.
    pub(crate) fn members(&self, l: Lane, g: &str) -> Vec<u8> {
        self.k(&format!("a/{}/_{}/", tag(l), escape(g)))
    }

    /// `r/<lane>/`: the ready messages of every group of the lane.
    pub(crate) fn readies_all(&self, l: Lane) -> Vec<u8> {
        self.k(&format!("r/{}/", tag(l)))
    }

    /// `r/<lane>/_<group>/`: the group's ready messages (each with a copy
    /// of its record, which does not change while it is ready).
    pub(crate) fn readies(&self, l: Lane, g: &str) -> Vec<u8> {
        self.k(&format!("r/{}/_{}/", tag(l), escape(g)))
    }

    /// `i/<lane>/`: both candidate indexes of the lane and its timeline
    /// (what its watch covers).
    pub(crate) fn indexes(&self, l: Lane) -> Vec<u8> {
        self.k(&format!("i/{}/", tag(l)))
    }

    /// `i/<lane>/u/` (the lowest ready message of each group) or
    /// `i/<lane>/o/` (ordered groups: the oldest message, if ready).
    pub(crate) fn index(&self, l: Lane, ordered: bool) -> Vec<u8> {
        let which = if ordered { "o" } else { "u" };
        self.k(&format!("i/{}/{which}/", tag(l)))
    }

    /// `i/<lane>/<u|o>/<turn>/<id>`.
    pub(crate) fn index_entry(&self, l: Lane, ordered: bool, turn: u64, id: u64) -> Vec<u8> {
        let mut k = self.index(l, ordered);
        k.extend_from_slice(format!("{}/{}", num(turn), num(id)).as_bytes());
        k
    }

    /// `i/<lane>/t/`: delayed messages and delivery deadlines by time
    /// (under `i/<lane>/` so that the lane's watch sees delayed messages
    /// come).
    pub(crate) fn timeline(&self, l: Lane) -> Vec<u8> {
        self.k(&format!("i/{}/t/", tag(l)))
    }

    /// `i/<lane>/t/<unix ms>/<id>`.
    pub(crate) fn time_entry(&self, l: Lane, at_ms: u64, id: u64) -> Vec<u8> {
        self.k(&format!("i/{}/t/{}/{}", tag(l), num(at_ms), num(id)))
    }

    /// `c/<lane>`: the lane's virtual clock.
    pub(crate) fn clock(&self, l: Lane) -> Vec<u8> {
        self.k(&format!("c/{}", tag(l)))
    }

    /// `x/<owner>`: a consumer whose pop attempts were abandoned, on a
    /// lease (an attempt of it delivers nothing while the key lives).
    pub(crate) fn abandoned(&self, consumer: &OwnerToken) -> Vec<u8> {
        self.k(&format!("x/{}", consumer.to_hex()))
    }

    /// `d/<dedup id>`.
    pub(crate) fn dedup(&self, d: &str) -> Vec<u8> {
        self.k(&format!("d/{}", escape(d)))
    }
}

/// `prefix` followed by the id `n`: a key of a by-id list.
pub(crate) fn with_id(prefix: &[u8], n: u64) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(num(n).as_bytes());
    k
}

/// The smallest key after `key`.
pub(crate) fn after(key: &[u8]) -> Vec<u8> {
    let mut k = key.to_vec();
    k.push(0);
    k
}

/// Where a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Deliverable.
    Ready,
    /// Not before this time (unix ms, the writer's clock).
    Delayed(u64),
    /// Delivered to this owner until this time.
    InFlight(u64, OwnerToken),
}

/// A message's record (`m/<lane>/<id>`); its payload is a key of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Meta {
    pub(crate) group: String,
    pub(crate) attempts: u32,
    pub(crate) enqueued_ms: u64,
    /// The payload's length in bytes.
    pub(crate) len: u64,
    pub(crate) state: State,
}

impl Meta {
    /// `1|attempts|enqueued|len|state|group`, the state `R`, `D<ms>` or
    /// `F<ms>:<owner hex>`.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let state = match self.state {
            State::Ready => "R".to_string(),
            State::Delayed(t) => format!("D{t}"),
            State::InFlight(t, o) => format!("F{t}:{}", o.to_hex()),
        };
        format!(
            "1|{}|{}|{}|{state}|{}",
            self.attempts, self.enqueued_ms, self.len, self.group
        )
        .into_bytes()
    }

    /// The record in `b`, or `None` if it is not one.
    pub(crate) fn decode(b: &[u8]) -> Option<Meta> {
        let s = std::str::from_utf8(b).ok()?;
        let mut it = s.splitn(6, '|');
        if it.next()? != "1" {
            return None;
        }
        let attempts = it.next()?.parse().ok()?;
        let enqueued_ms = it.next()?.parse().ok()?;
        let len = it.next()?.parse().ok()?;
        let st = it.next()?;
        let group = it.next()?.to_string();
        let state = match st.split_at_checked(1)? {
            ("R", "") => State::Ready,
            ("D", t) => State::Delayed(t.parse().ok()?),
            ("F", rest) => {
                let (t, o) = rest.split_once(':')?;
                State::InFlight(t.parse().ok()?, OwnerToken::from_hex(o)?)
            }
            _ => return None,
        };
        Some(Meta {
            group,
            attempts,
            enqueued_ms,
            len,
            state,
        })
    }

    /// Its time on the timeline, if it has one.
    pub(crate) fn at(&self) -> Option<u64> {
        match self.state {
            State::Ready => None,
            State::Delayed(t) | State::InFlight(t, _) => Some(t),
        }
    }

    /// Whether it is in the group's ready list.
    pub(crate) fn ready(&self) -> bool {
        self.state == State::Ready
    }

    /// The value of its timeline entry: `D` or `F`, then the group.
    pub(crate) fn time_value(&self) -> Vec<u8> {
        let kind = if matches!(self.state, State::InFlight(..)) {
            "F"
        } else {
            "D"
        };
        format!("{kind}{}", self.group).into_bytes()
    }
}

/// A timeline entry's value: (in flight, group).
pub(crate) fn parse_time_value(v: &[u8]) -> Option<(bool, String)> {
    let s = std::str::from_utf8(v).ok()?;
    let (kind, group) = s.split_at_checked(1)?;
    match kind {
        "F" => Some((true, group.to_string())),
        "D" => Some((false, group.to_string())),
        _ => None,
    }
}

/// A group of one lane, kept in two keys while it has a message in the
/// lane: its record `g/<lane>/_<group>` (turn and lowest ready id: what a
/// delivery changes) and its head `h/<lane>/_<group>` (its lowest id: what
/// an ack of its oldest message changes), so that the two do not collide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Group {
    /// The group's turn (virtual clock).
    pub(crate) turn: u64,
    /// Its lowest id in the lane.
    pub(crate) head: u64,
    /// Its lowest ready id; 0: none.
    pub(crate) ready: u64,
}

impl Group {
    /// The record's value: `<turn> <ready>`.
    pub(crate) fn record(turn: u64, ready: u64) -> Vec<u8> {
        format!("{turn} {ready}").into_bytes()
    }

    /// The head's value: the id as a 20-digit decimal, so that values
    /// compare as the numbers do.
    pub(crate) fn head_value(head: u64) -> Vec<u8> {
        num(head).into_bytes()
    }

    /// (turn, ready) from a record.
    pub(crate) fn parse_record(b: &[u8]) -> Option<(u64, u64)> {
        let (t, r) = std::str::from_utf8(b).ok()?.split_once(' ')?;
        Some((t.parse().ok()?, r.parse().ok()?))
    }

    /// The group from its record and its head.
    pub(crate) fn of(record: &[u8], head: &[u8]) -> Option<Group> {
        let (turn, ready) = Self::parse_record(record)?;
        let head: u64 = std::str::from_utf8(head).ok()?.parse().ok()?;
        (head > 0).then_some(Group { turn, head, ready })
    }

    /// The group's entry in a candidate index, as (turn, id): unordered,
    /// its lowest ready message; ordered, its oldest message if ready.
    pub(crate) fn entry(&self, ordered: bool) -> Option<(u64, u64)> {
        let ready = (self.ready != 0).then_some(self.ready);
        candidate(ordered, Some(self.head), ready).map(|id| (self.turn, id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let o = OwnerToken::random();
        for state in [State::Ready, State::Delayed(5), State::InFlight(7, o)] {
            let m = Meta {
                group: "a|b c".into(),
                attempts: 3,
                enqueued_ms: 12,
                len: 9,
                state,
            };
            assert_eq!(Meta::decode(&m.encode()), Some(m.clone()));
            let (f, g) = parse_time_value(&m.time_value()).unwrap();
            assert_eq!(
                (f, g.as_str()),
                (matches!(state, State::InFlight(..)), "a|b c")
            );
        }
        assert_eq!(Meta::decode(b"1|x"), None);
        assert_eq!(Meta::decode(b"2|1|1|1|R|"), None);
        let g = Group {
            turn: 4,
            head: 2,
            ready: 0,
        };
        let (r, h) = (Group::record(4, 0), Group::head_value(2));
        assert_eq!(Group::of(&r, &h), Some(g));
        assert_eq!(Group::of(&r, b"0"), None);
        assert!(Group::head_value(9) < Group::head_value(10));
    }

    #[test]
    fn keys_sort_by_number_and_parse_back() {
        let k = QKeys::new("p/wq/q/".into());
        let e = k.index_entry(Lane::Main, false, 3, 42);
        assert_eq!(e, b"p/wq/q/i/M/u/00000000000000000003/00000000000000000042");
        assert_eq!(pair_of(&e), Some((3, 42)));
        assert_eq!(id_of(&k.meta(Lane::Dead, 7)), Some(7));
        assert!(k.meta(Lane::Main, 9) < k.meta(Lane::Main, 10));
        assert_eq!(k.group(Lane::Main, ""), b"p/wq/q/g/M/_");
        assert_eq!(k.members(Lane::Main, "a/b"), b"p/wq/q/a/M/_a%2Fb/");
        assert_eq!(pair_of(b"short"), None);
    }
}
