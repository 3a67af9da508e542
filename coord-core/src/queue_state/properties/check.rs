//! The properties, as functions (rustfmt formats them; the `proptest!`
//! block only draws their inputs).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;
use tokio::time::Instant;

use super::model::{Class, Expect, Model};
use super::{Op, Popper, SLOTS, Who};
use crate::queue_backend::{Lane, MessageId, NewMessage, PopAttempt, Pushed, QueueConfig};
use crate::queue_state::{Ack, QueueState};
use crate::types::OwnerToken;

fn token(n: u64) -> OwnerToken {
    OwnerToken::from_hex(&format!("{:016x}{:016x}", 0xc0, n)).expect("32 hex digits")
}

/// A message as [`View`] sees it: lane, id, attempts, deadline and holder
/// (unless lapsed).
type Seen = (Lane, u64, u32, Option<Instant>, Option<OwnerToken>);

/// What a step must leave as it was when it changes nothing: each
/// message's lane, id, attempts, and deadline and holder where not
/// lapsed; the groups' turns and the lanes' clocks.
#[derive(Debug, PartialEq)]
struct View {
    msgs: Vec<Seen>,
    turns: Vec<(usize, String, u64)>,
    clocks: [u64; 2],
}

fn view(s: &QueueState, now: Instant) -> View {
    let mut msgs = Vec::new();
    let mut turns = Vec::new();
    for (i, lane) in [Lane::Main, Lane::Dead].into_iter().enumerate() {
        let l = s.lane(lane);
        for (id, m) in &l.msgs {
            let live = m.at.filter(|t| *t > now);
            let holder = live.and(m.holder);
            msgs.push((lane, *id, m.attempts, live, holder));
        }
        for (g, grp) in &l.groups {
            turns.push((i, g.to_string(), grp.turn));
        }
    }
    turns.sort();
    View {
        msgs,
        turns,
        clocks: [s.main.clock, s.dead.clock],
    }
}

/// The state's own bookkeeping agrees with itself: a message is ready
/// exactly when it is in its group's ready ids, waits for a time exactly
/// when that time is on the timeline, and has a holder only with a
/// deadline; groups hold exactly their messages and none is empty.
fn consistent(s: &QueueState) -> Result<(), TestCaseError> {
    for lane in [Lane::Main, Lane::Dead] {
        let l = s.lane(lane);
        let mut timeline = std::collections::BTreeSet::new();
        for (id, m) in &l.msgs {
            let g = l.groups.get(&m.group);
            prop_assert!(
                g.is_some_and(|g| g.all.contains(id)),
                "{} not in its group",
                id
            );
            let ready = g.is_some_and(|g| g.ready.contains(id));
            prop_assert_eq!(ready, m.at.is_none(), "ready index of {}", id);
            prop_assert!(
                m.holder.is_none() || m.at.is_some(),
                "held without deadline"
            );
            if let Some(t) = m.at {
                timeline.insert((t, *id));
            }
        }
        prop_assert_eq!(&timeline, &l.timeline, "timeline of {:?}", lane);
        let members: usize = l.groups.values().map(|g| g.all.len()).sum();
        prop_assert_eq!(members, l.msgs.len(), "group members of {:?}", lane);
        prop_assert!(
            l.groups.values().all(|g| !g.all.is_empty()),
            "an empty group"
        );
    }
    Ok(())
}

/// The state holds what the model says.
fn agrees(s: &QueueState, m: &Model) -> Result<(), TestCaseError> {
    consistent(s)?;
    let now = m.now;
    let mut counts = [0u64; 4];
    for (id, mm) in &m.msgs {
        let (main, dead) = (s.main.msgs.get(id), s.dead.msgs.get(id));
        // No message lost: in one lane at most, and in none only if acked.
        prop_assert!(main.is_none() || dead.is_none(), "{} in both lanes", id);
        let class = match (main, dead) {
            (None, None) => Class::Acked,
            (_, Some(_)) => Class::Dead,
            (Some(x), None) => match (x.at.filter(|t| *t > now), x.holder) {
                (None, _) => Class::Ready,
                (Some(_), Some(_)) => Class::InFlight,
                (Some(_), None) => Class::Delayed,
            },
        };
        prop_assert_eq!(class, m.class(*id), "where message {} is", id);
        if let Some(x) = main.or(dead) {
            prop_assert_eq!(x.attempts, mm.attempts, "attempts of {}", id);
            prop_assert_eq!(&*x.group, mm.group.as_str());
            prop_assert_eq!(&x.payload[..], &mm.payload[..]);
            prop_assert_eq!(x.enqueued_at, mm.enqueued_at);
            let live = x.at.filter(|t| *t > now);
            prop_assert_eq!((live, live.and(x.holder)), (mm.at, mm.holder), "{}", id);
        }
        match class {
            Class::Ready => counts[0] += 1,
            Class::Delayed => counts[1] += 1,
            Class::InFlight => counts[2] += 1,
            Class::Dead => counts[3] += 1,
            Class::Acked => {}
        }
    }
    let known = |id: &u64| m.msgs.contains_key(id);
    prop_assert!(s.main.msgs.keys().chain(s.dead.msgs.keys()).all(known));
    let st = s.stats(now);
    prop_assert_eq!(
        [st.ready, st.delayed, st.in_flight, st.dead],
        counts,
        "stats"
    );
    for (i, lane) in [Lane::Main, Lane::Dead].into_iter().enumerate() {
        let ids: Vec<u64> = s.peek(lane, usize::MAX).iter().map(|x| x.id.0).collect();
        let want: Vec<u64> = m
            .msgs
            .iter()
            .filter(|(id, x)| x.lane == lane && m.class(**id) != Class::Acked)
            .map(|(id, _)| *id)
            .collect();
        prop_assert_eq!(ids, want, "peek of {:?}", lane);
        let turns: Vec<(String, u64)> = m.turns[i].iter().map(|(g, t)| (g.clone(), *t)).collect();
        let mut real: Vec<(String, u64)> = (s.lane(lane).groups.iter())
            .map(|(g, x)| (g.to_string(), x.turn))
            .collect();
        real.sort();
        prop_assert_eq!(real, turns, "turns of {:?}", lane);
        prop_assert_eq!(s.lane(lane).clock, m.clock[i], "clock of {:?}", lane);
    }
    prop_assert_eq!(s.is_idle(now), m.idle(), "idle");
    Ok(())
}

/// One run's consumers and counters.
struct Run {
    s: QueueState,
    m: Model,
    /// The counter ids and tokens are taken from.
    counter: u64,
    slots: [OwnerToken; SLOTS],
    abandoned: Vec<OwnerToken>,
    made: u64,
    /// The latest token issued by a delivery.
    last_token: u64,
}

impl Run {
    fn fresh(&mut self) -> OwnerToken {
        self.made += 1;
        token(self.made)
    }

    /// The message an ack, nack or extend names (one delivered at least
    /// once, if any) and who makes it.
    fn target(&mut self, who: Who, pick: usize) -> Option<(u64, OwnerToken)> {
        let delivered: Vec<u64> = (self.m.msgs.iter())
            .filter(|(_, x)| !x.deliveries.is_empty())
            .map(|(id, _)| *id)
            .collect();
        let pool = if delivered.is_empty() {
            self.m.msgs.keys().copied().collect()
        } else {
            delivered
        };
        let id = *pool.get(pick % pool.len().max(1))?;
        let ds = &self.m.msgs[&id].deliveries;
        let by = match who {
            Who::Latest => ds.last().map(|d| d.0),
            Who::Earlier(i) => ds.get(i % ds.len().max(1)).map(|d| d.0),
            Who::Slot(i) => Some(self.slots[i]),
            Who::Stranger => None,
        };
        Some((id, by.unwrap_or_else(|| self.fresh())))
    }

    fn step(&mut self, i: usize, op: Op) -> Result<(), TestCaseError> {
        let now = self.m.now;
        let cfg = self.m.config;
        match op {
            Op::Push {
                delay_ms,
                group,
                dedup,
            } => {
                let payload = format!("m{i}").into_bytes();
                let at = UNIX_EPOCH + Duration::from_millis(i as u64);
                let (group, dedup) = (
                    group.map(|g| format!("g{g}")),
                    dedup.map(|d| format!("d{d}")),
                );
                let msg = NewMessage {
                    payload: &payload,
                    delay: Duration::from_millis(delay_ms),
                    group: group.as_deref(),
                    dedup_id: dedup.as_deref(),
                    dedup_window: self.m.window,
                };
                let before = self.counter;
                let counter = &mut self.counter;
                let got = self.s.push(now, &msg, at, || {
                    *counter += 1;
                    *counter
                });
                let g = group.as_deref().unwrap_or("");
                let (id, duplicate) =
                    (self.m).push(payload.clone(), at, msg.delay, g, dedup.as_deref());
                let want = Pushed {
                    id: MessageId(id),
                    duplicate,
                };
                prop_assert_eq!(got, want, "dedup window counted from the first push");
                prop_assert_eq!(self.counter, before + u64::from(!duplicate));
            }
            Op::Pop {
                who,
                dead,
                visibility_ms,
            } => {
                let tok = match who {
                    Popper::Slot(i) => self.slots[i],
                    Popper::Abandoned(i) if !self.abandoned.is_empty() => {
                        self.abandoned[i % self.abandoned.len()]
                    }
                    _ => self.fresh(),
                };
                let lane = if dead { Lane::Dead } else { Lane::Main };
                let vis = Duration::from_millis(visibility_ms);
                let main_before: Vec<u64> = self.s.main.msgs.keys().copied().collect();
                let want = self.m.pop(lane, tok, vis);
                let counter = &mut self.counter;
                let got = self.s.pop(now, lane, &tok, vis, &cfg, || {
                    *counter += 1;
                    *counter
                });
                match (got, want) {
                    (
                        PopAttempt::Delivered { message, token },
                        Expect::Delivered {
                            id,
                            attempts,
                            token: t,
                        },
                    ) => {
                        prop_assert_eq!((message.id.0, message.attempts), (id, attempts));
                        prop_assert_eq!(token.0, t);
                        let x = &self.m.msgs[&id];
                        prop_assert_eq!(&message.payload, &x.payload);
                        prop_assert_eq!(message.group.unwrap_or_default(), x.group.clone());
                        prop_assert_eq!(message.enqueued_at, x.enqueued_at);
                        let ds = &x.deliveries;
                        if let [.., (_, a), (_, b)] = ds[..] {
                            prop_assert!(a < b, "tokens of {} went {} then {}", id, a, b);
                        }
                        prop_assert!(token.0 > self.last_token, "token below an earlier one");
                        self.last_token = token.0;
                        if let (Lane::Main, Some(max)) = (lane, cfg.max_deliveries) {
                            prop_assert!(attempts <= max, "delivered past max_deliveries");
                        }
                    }
                    (PopAttempt::Empty { next_in }, Expect::Empty(n)) => {
                        prop_assert_eq!(next_in, n, "next_in");
                    }
                    (got, want) => {
                        prop_assert!(false, "pop gave {:?}, the rules say {:?}", got, want);
                    }
                }
                for id in main_before {
                    if let Some(x) = self.s.dead.msgs.get(&id) {
                        let max = cfg.max_deliveries;
                        let due = max.is_some_and(|max| x.attempts >= max);
                        prop_assert!(due, "{} dead-lettered before max_deliveries", id);
                    }
                }
            }
            Op::Ack {
                who,
                pick,
                wrong_lane,
            } => {
                let Some((id, by)) = self.target(who, pick) else {
                    return Ok(());
                };
                let mut lane = self.m.msgs[&id].lane;
                if wrong_lane {
                    lane = if lane == Lane::Main {
                        Lane::Dead
                    } else {
                        Lane::Main
                    };
                }
                let before = view(&self.s, now);
                let got = self.s.ack(now, lane, MessageId(id), &by);
                match self.m.ack(lane, id, &by) {
                    Some(more) => {
                        prop_assert_eq!(
                            got,
                            Ack::Deleted {
                                group_has_more: more
                            }
                        );
                    }
                    None => {
                        prop_assert_eq!(got, Ack::Refused, "a stale consumer's ack was taken");
                        prop_assert_eq!(view(&self.s, now), before, "a refused ack changed state");
                    }
                }
            }
            Op::Nack {
                who,
                pick,
                delay_ms,
            } => {
                let Some((id, by)) = self.target(who, pick) else {
                    return Ok(());
                };
                let lane = self.m.msgs[&id].lane;
                let before = view(&self.s, now);
                let got = self.s.nack(
                    now,
                    lane,
                    MessageId(id),
                    &by,
                    Duration::from_millis(delay_ms),
                );
                let want = self.m.nack(lane, id, &by, Duration::from_millis(delay_ms));
                prop_assert_eq!(got, want, "a nack taken iff by the holder in time");
                if !want {
                    prop_assert_eq!(view(&self.s, now), before, "a refused nack changed state");
                }
            }
            Op::Extend {
                who,
                pick,
                visibility_ms,
            } => {
                let Some((id, by)) = self.target(who, pick) else {
                    return Ok(());
                };
                let lane = self.m.msgs[&id].lane;
                let before = view(&self.s, now);
                let vis = Duration::from_millis(visibility_ms);
                let got = self.s.extend(now, lane, MessageId(id), &by, vis);
                let want = self.m.extend(lane, id, &by, vis);
                prop_assert_eq!(got, want, "an extend taken iff by the holder in time");
                if !want {
                    prop_assert_eq!(view(&self.s, now), before, "a refused extend changed state");
                }
            }
            Op::Abandon { slot, dead } => {
                let tok = self.slots[slot];
                self.abandoned.push(tok);
                self.slots[slot] = self.fresh();
                let lane = if dead { Lane::Dead } else { Lane::Main };
                let got = self.s.abandon(now, lane, &tok);
                let want = self.m.abandon(lane, tok);
                prop_assert_eq!(got, want.is_some(), "abandon gave back {:?}", want);
                if let Some(id) = want {
                    let x = &self.s.lane(lane).msgs[&id];
                    let before = self.m.msgs[&id].attempts_before;
                    prop_assert_eq!(x.attempts, before, "an abandoned delivery was counted");
                    prop_assert!(x.at.is_none() && x.holder.is_none(), "not given back");
                }
            }
            Op::Redrive { limit } => {
                prop_assert_eq!(self.s.redrive(now, limit), self.m.redrive(limit));
            }
            Op::Advance { ms } => self.m.advance(Duration::from_millis(ms)),
        }
        Ok(())
    }
}

pub(super) fn random_runs_keep_the_queue_rules(
    ordered: bool,
    max_deliveries: Option<u32>,
    window_ms: u64,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let config = QueueConfig {
        max_deliveries,
        ordered_groups: ordered,
    };
    let mut run = Run {
        s: QueueState::default(),
        m: Model::new(Instant::now(), Duration::from_millis(window_ms), config),
        counter: 0,
        slots: [token(1), token(2), token(3)],
        abandoned: Vec::new(),
        made: 3,
        last_token: 0,
    };
    for (i, op) in ops.into_iter().enumerate() {
        run.step(i, op)?;
        agrees(&run.s, &run.m)?;
        prop_assert_eq!(run.counter, run.m.counter, "ids and tokens taken");
    }
    Ok(())
}

pub(super) fn a_busy_group_waits_at_most_one_extra_delivery_per_other_group(
    ops: Vec<Option<u8>>,
) -> Result<(), TestCaseError> {
    const GROUPS: usize = 4;
    let mut s = QueueState::default();
    let now = Instant::now();
    let (cfg, vis, me) = (QueueConfig::default(), Duration::from_secs(3600), token(1));
    let mut counter = 0u64;
    let mut next = || {
        counter += 1;
        counter
    };
    let mut waiting = [0usize; GROUPS];
    let mut last_id = [0u64; GROUPS];
    // runs[a][b]: deliveries of `a` since `b` was last delivered, while
    // `b` had ready messages.
    let mut runs = [[0u32; GROUPS]; GROUPS];
    for g in ops {
        let Some(g) = g else {
            for (b, w) in waiting.iter().enumerate() {
                if *w == 0 {
                    runs.iter_mut().for_each(|r| r[b] = 0);
                }
            }
            match s.pop(now, Lane::Main, &me, vis, &cfg, &mut next) {
                PopAttempt::Delivered { message, .. } => {
                    let group = message.group.unwrap_or_default();
                    let a: usize = group[1..].parse().expect("g<n>");
                    prop_assert!(waiting[a] > 0 && message.id.0 > last_id[a], "FIFO in {}", a);
                    last_id[a] = message.id.0;
                    for b in (0..GROUPS).filter(|b| *b != a && waiting[*b] > 0) {
                        runs[a][b] += 1;
                        prop_assert!(runs[a][b] <= 2, "g{} served 3 times while g{} waited", a, b);
                    }
                    runs.iter_mut().for_each(|r| r[a] = 0);
                    waiting[a] -= 1;
                }
                PopAttempt::Empty { .. } => {
                    prop_assert!(waiting.iter().all(|w| *w == 0), "nothing delivered");
                }
            }
            continue;
        };
        let group = format!("g{g}");
        let msg = NewMessage {
            payload: b"x",
            delay: Duration::ZERO,
            group: Some(&group),
            dedup_id: None,
            dedup_window: Duration::ZERO,
        };
        s.push(now, &msg, SystemTime::UNIX_EPOCH, &mut next);
        waiting[usize::from(g)] += 1;
    }
    Ok(())
}
