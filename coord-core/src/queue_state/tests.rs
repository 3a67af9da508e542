//! Unit tests of the queue state machine: single rules, step by step.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::*;

const MS: Duration = Duration::from_millis(1);

/// A state with its own id and token counter.
struct Q {
    s: QueueState,
    counter: u64,
    t0: Instant,
}

impl Q {
    fn new() -> Self {
        Self::with(Turns::PerGroup)
    }

    fn with(turns: Turns) -> Self {
        Q {
            s: QueueState::with_turns(turns),
            counter: 0,
            t0: Instant::now(),
        }
    }

    /// The groups of `n` deliveries to `who`, each acked at once.
    fn drain(&mut self, ms: u64, who: &OwnerToken, n: usize) -> Vec<String> {
        let cfg = QueueConfig::default();
        (0..n)
            .map(|_| {
                let (m, _) = self.pop(ms, who, &cfg).expect("a message");
                let acked = self.s.ack(self.at(ms), Lane::Main, m.id, who);
                assert!(matches!(acked, Ack::Deleted { .. }));
                m.group.unwrap_or_default()
            })
            .collect()
    }

    /// Turns kept per message: a1 pushed, then three b's; a1 delivered to
    /// `holder` (not acked), then two b's served to `who` and acked.
    fn a_held_while_two_of_three_bs_served() -> (Self, OwnerToken, OwnerToken, MessageId) {
        let mut q = Q::with(Turns::PerMessage);
        let cfg = QueueConfig::default();
        let (holder, who) = (OwnerToken::random(), OwnerToken::random());
        let a1 = q.push(0, Some("a"), None).id;
        q.push_many(0, "b", 3);
        assert_eq!(q.pop(0, &holder, &cfg).unwrap().0.id, a1);
        q.drain(0, &who, 2);
        (q, holder, who, a1)
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    /// `n` messages of `group`, pushed at `ms`.
    fn push_many(&mut self, ms: u64, group: &str, n: usize) {
        for _ in 0..n {
            self.push(ms, Some(group), None);
        }
    }

    fn push(&mut self, ms: u64, group: Option<&str>, dedup: Option<&str>) -> Pushed {
        let msg = NewMessage {
            payload: b"p",
            delay: Duration::ZERO,
            group,
            dedup_id: dedup,
            dedup_window: 100 * MS,
        };
        let (now, counter) = (self.at(ms), &mut self.counter);
        self.s.push(now, &msg, SystemTime::UNIX_EPOCH, || {
            *counter += 1;
            *counter
        })
    }

    fn pop(&mut self, ms: u64, who: &OwnerToken, cfg: &QueueConfig) -> Option<(Message, u64)> {
        let (now, counter) = (self.at(ms), &mut self.counter);
        let next = || {
            *counter += 1;
            *counter
        };
        match self.s.pop(now, Lane::Main, who, 50 * MS, cfg, next) {
            PopAttempt::Delivered { message, token } => Some((message, token.0)),
            PopAttempt::Empty { .. } => None,
        }
    }
}

#[test]
fn a_dedup_window_runs_from_the_first_push_not_from_duplicates() {
    let mut q = Q::new();
    let first = q.push(0, None, Some("d"));
    assert!(!first.duplicate);
    assert_eq!(
        q.push(60, None, Some("d")),
        Pushed {
            duplicate: true,
            ..first
        }
    );
    // 100 ms after the first push: the window is over, whatever came in it.
    let again = q.push(100, None, Some("d"));
    assert!(!again.duplicate && again.id > first.id);
}

#[test]
fn a_stale_consumers_ack_nack_and_extend_change_nothing() {
    let mut q = Q::new();
    let cfg = QueueConfig::default();
    let (a, b) = (OwnerToken::random(), OwnerToken::random());
    q.push(0, None, None);
    let (m, t1) = q.pop(0, &a, &cfg).unwrap();
    // `a`'s visibility lapses at 50 ms; `b` gets the message.
    let (m2, t2) = q.pop(50, &b, &cfg).unwrap();
    assert_eq!((m2.id, m2.attempts), (m.id, 2));
    assert!(t2 > t1);
    let now = q.at(60);
    assert_eq!(q.s.ack(now, Lane::Main, m.id, &a), Ack::Refused);
    assert!(!q.s.nack(now, Lane::Main, m.id, &a, Duration::ZERO));
    assert!(!q.s.extend(now, Lane::Main, m.id, &a, 10 * MS));
    let stats = q.s.stats(now);
    assert_eq!((stats.in_flight, stats.ready), (1, 0));
    assert_eq!(
        q.s.ack(now, Lane::Main, m.id, &b),
        Ack::Deleted {
            group_has_more: false
        }
    );
}

#[test]
fn an_abandoned_delivery_comes_back_uncounted_and_its_consumer_gets_nothing() {
    let mut q = Q::new();
    let cfg = QueueConfig::default().max_deliveries(1);
    let (a, b) = (OwnerToken::random(), OwnerToken::random());
    q.push(0, None, None);
    q.pop(0, &a, &cfg).unwrap();
    assert!(q.s.abandon(q.at(1), Lane::Main, &a));
    // A late copy of `a`'s attempt delivers nothing.
    assert!(q.pop(2, &a, &cfg).is_none());
    // Not dead-lettered: that delivery did not count.
    let (m, _) = q.pop(2, &b, &cfg).unwrap();
    assert_eq!(m.attempts, 1);
}

/// Past [`SWEEP_ABOVE`] dedup ids, a push with one sweeps those whose
/// window ended, however many there are.
#[test]
fn a_sweep_of_dedup_ids_drops_every_ended_window() {
    let mut q = Q::new();
    for i in 0..SWEEP_ABOVE + 2 {
        q.push(0, None, Some(&format!("d{i}")));
    }
    // Every window (100 ms) ended: the next push with a dedup id sweeps.
    q.push(200, None, Some("last"));
    assert_eq!(q.s.dedup.len(), 1, "dedup ids whose window ended were kept");
}

/// Past [`SWEEP_ABOVE`] abandoned consumers, an abandon sweeps the ones
/// whose memory ended, and only those: a consumer abandoned a moment
/// before is still refused.
#[test]
fn a_sweep_of_abandoned_consumers_keeps_the_live_ones() {
    let mut q = Q::new();
    let cfg = QueueConfig::default();
    let victim = OwnerToken::random();
    q.push(0, None, None);
    q.s.abandon(q.at(0), Lane::Main, &victim);
    for _ in 0..SWEEP_ABOVE {
        q.s.abandon(q.at(0), Lane::Main, &OwnerToken::random());
    }
    // One more, a second later: the sweep runs, and every entry is live.
    q.s.abandon(q.at(1000), Lane::Main, &OwnerToken::random());
    assert!(
        q.pop(1001, &victim, &cfg).is_none(),
        "a late attempt of a consumer abandoned a second ago delivered"
    );
    // Once their memory ended, the sweep drops them.
    let later = 1000 + ABANDONED_POP_MEMORY.as_millis() as u64 + 1;
    q.s.abandon(q.at(later), Lane::Main, &OwnerToken::random());
    assert_eq!(
        q.s.abandoned.len(),
        1,
        "the sweep kept consumers whose memory ended"
    );
}

#[test]
fn a_message_delivered_max_deliveries_times_goes_to_the_dead_lane() {
    let mut q = Q::new();
    let cfg = QueueConfig::default().max_deliveries(2);
    let who = OwnerToken::random();
    q.push(0, None, None);
    q.pop(0, &who, &cfg).unwrap();
    q.pop(50, &who, &cfg).unwrap();
    assert!(q.pop(100, &who, &cfg).is_none());
    let stats = q.s.stats(q.at(100));
    assert_eq!((stats.ready, stats.dead), (0, 1));
    assert_eq!(q.s.peek(Lane::Dead, 10)[0].attempts, 2);
    assert_eq!(q.s.redrive(q.at(100), 10), 1);
    assert_eq!(q.s.peek(Lane::Main, 10)[0].attempts, 0);
}

#[test]
fn groups_are_served_one_message_each_in_turn() {
    let mut q = Q::new();
    let cfg = QueueConfig::default();
    let who = OwnerToken::random();
    q.push_many(0, "big", 3);
    q.push(0, Some("small"), None);
    let order: Vec<String> = (0..4)
        .map(|_| q.pop(0, &who, &cfg).unwrap().0.group.unwrap())
        .collect();
    assert_eq!(order, ["big", "small", "big", "big"]);
}

/// Turns kept per message: a group pushed after another's backlog is
/// served one message each in turn, as with turns per group.
#[test]
fn per_message_turns_serve_groups_one_message_each() {
    let mut q = Q::with(Turns::PerMessage);
    let who = OwnerToken::random();
    q.push_many(0, "big", 3);
    q.push_many(0, "small", 2);
    assert_eq!(q.drain(0, &who, 5), ["big", "small", "big", "small", "big"]);
}

/// Turns kept per message: a group that arrives after another was served
/// for a while joins at the current turn and the two alternate.
#[test]
fn per_message_turns_let_a_late_group_join_at_once() {
    let mut q = Q::with(Turns::PerMessage);
    let who = OwnerToken::random();
    q.push_many(0, "old", 10);
    q.drain(0, &who, 5);
    q.push_many(0, "new", 3);
    assert_eq!(
        q.drain(0, &who, 6),
        ["old", "new", "old", "new", "old", "new"]
    );
}

/// Turns kept per message: a message given back keeps its place, before
/// its group's later messages, and takes the current turn if it fell
/// behind it.
#[test]
fn per_message_turns_keep_a_given_back_message_in_place() {
    let mut q = Q::with(Turns::PerMessage);
    let cfg = QueueConfig::default();
    let who = OwnerToken::random();
    let a1 = q.push(0, Some("a"), None).id;
    let a2 = q.push(0, Some("a"), None).id;
    let b1 = q.push(0, Some("b"), None).id;
    let (m, _) = q.pop(0, &who, &cfg).unwrap();
    assert_eq!(m.id, a1);
    assert!(q.s.nack(q.at(0), Lane::Main, a1, &who, Duration::ZERO));
    let ids: Vec<MessageId> = (0..3).map(|_| q.pop(0, &who, &cfg).unwrap().0.id).collect();
    assert_eq!(ids, [a1, b1, a2]);
}

/// Turns kept per message: a group whose one message waited in flight
/// while another was served gets no burst of credit when it pushes a
/// backlog: the two alternate.
#[test]
fn per_message_turns_give_a_group_that_waited_no_credit() {
    let mut q = Q::with(Turns::PerMessage);
    let cfg = QueueConfig::default();
    let (holder, who) = (OwnerToken::random(), OwnerToken::random());
    q.push(0, Some("a"), None);
    q.pop(0, &holder, &cfg).unwrap();
    q.push_many(0, "b", 6);
    q.drain(0, &who, 6);
    q.push_many(0, "a", 6);
    q.push_many(0, "b", 3);
    assert_eq!(q.drain(0, &who, 6), ["a", "b", "a", "b", "a", "b"]);
}

/// Turns kept per message: a message pushed with a delay gets its turn
/// when it comes due, at the current turn, not at the one of its push.
#[test]
fn per_message_turns_give_a_delayed_message_its_turn_when_due() {
    let mut q = Q::with(Turns::PerMessage);
    let cfg = QueueConfig::default();
    let who = OwnerToken::random();
    let msg = NewMessage {
        payload: b"p",
        delay: 10 * MS,
        group: Some("late"),
        dedup_id: None,
        dedup_window: Duration::ZERO,
    };
    q.push_many(0, "x", 4);
    let now = q.at(0);
    let counter = &mut q.counter;
    let delayed =
        q.s.push(now, &msg, SystemTime::UNIX_EPOCH, || {
            *counter += 1;
            *counter
        })
        .id;
    q.drain(0, &who, 2);
    // Due now: it takes the current turn (x's third message's), so it
    // comes after that message (a lower id) and before x's fourth; had it
    // kept the turn of its push, it would come first.
    let ids: Vec<MessageId> = (0..3)
        .map(|_| q.pop(20, &who, &cfg).unwrap().0.id)
        .collect();
    assert_eq!(ids[1], delayed, "{ids:?}");
}

/// Turns kept per message: a message given back after the others moved on
/// takes the current turn, so the lane's turn does not go back with it: a
/// group arriving next queues behind the ready messages, not before them.
#[test]
fn per_message_turns_do_not_go_back_with_a_given_back_message() {
    let (mut q, holder, who, a1) = Q::a_held_while_two_of_three_bs_served();
    assert!(q.s.nack(q.at(0), Lane::Main, a1, &holder, Duration::ZERO));
    q.push(0, Some("c"), None);
    assert_eq!(q.drain(0, &who, 3), ["a", "b", "c"]);
}

/// The same for a delivery that lapsed: made ready again at the current
/// turn, not back at its old one.
#[test]
fn per_message_turns_do_not_go_back_with_a_lapsed_delivery() {
    let (mut q, _, who, _) = Q::a_held_while_two_of_three_bs_served();
    // The holder's 50 ms ran out: the push finds the delivery lapsed.
    q.push(60, Some("c"), None);
    assert_eq!(q.drain(60, &who, 3), ["a", "b", "c"]);
}

/// Turns kept per message: a group whose messages were all served comes
/// back at the current turn, as a new group does, not after its own last
/// turn: it goes before a group that arrives after it.
#[test]
fn per_message_turns_let_a_group_that_emptied_come_back_at_the_current_turn() {
    let mut q = Q::with(Turns::PerMessage);
    let who = OwnerToken::random();
    for g in ["a", "a", "a", "b", "b", "b"] {
        q.push(0, Some(g), None);
    }
    assert_eq!(q.drain(0, &who, 5), ["a", "b", "a", "b", "a"]);
    // a is empty now (its last turn 2); b's last message is ready at 2.
    q.push(0, Some("a"), None);
    q.push(0, Some("c"), None);
    assert_eq!(q.drain(0, &who, 3), ["b", "a", "c"]);
}
