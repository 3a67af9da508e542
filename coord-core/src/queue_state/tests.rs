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
        Q {
            s: QueueState::default(),
            counter: 0,
            t0: Instant::now(),
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
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
    for _ in 0..3 {
        q.push(0, Some("big"), None);
    }
    q.push(0, Some("small"), None);
    let order: Vec<String> = (0..4)
        .map(|_| q.pop(0, &who, &cfg).unwrap().0.group.unwrap())
        .collect();
    assert_eq!(order, ["big", "small", "big", "big"]);
}
