//! Property tests: random runs of pushes (delayed or not, in groups, with
//! dedup ids), pops by several consumers (and by abandoned ones), acks,
//! nacks and extends by the consumer holding the message and by stale
//! ones, abandons, redrives and time passing by random steps, held to the
//! plain model in `model.rs` after every step.

mod check;
mod model;

use proptest::prelude::*;

/// Who makes an ack, a nack or an extend of a message.
#[derive(Debug, Clone, Copy)]
enum Who {
    /// The consumer of its latest delivery (stale if that lapsed or was
    /// given back).
    Latest,
    /// The consumer of one of its deliveries (stale unless the latest).
    Earlier(usize),
    /// One of the consumers that pop.
    Slot(usize),
    /// A consumer that never popped.
    Stranger,
}

/// Who pops.
#[derive(Debug, Clone, Copy)]
enum Popper {
    /// One of the consumers (a new token after each of its abandons).
    Slot(usize),
    /// A late copy of an abandoned consumer's attempt.
    Abandoned(usize),
    /// A fresh consumer.
    Fresh,
}

#[derive(Debug, Clone)]
enum Op {
    Push {
        delay_ms: u64,
        group: Option<u8>,
        dedup: Option<u8>,
    },
    Pop {
        who: Popper,
        dead: bool,
        visibility_ms: u64,
    },
    Ack {
        who: Who,
        pick: usize,
        wrong_lane: bool,
    },
    Nack {
        who: Who,
        pick: usize,
        delay_ms: u64,
    },
    Extend {
        who: Who,
        pick: usize,
        visibility_ms: u64,
    },
    Abandon {
        slot: usize,
        dead: bool,
    },
    Redrive {
        limit: usize,
    },
    Advance {
        ms: u64,
    },
}

/// How many consumers pop.
const SLOTS: usize = 3;

/// Delays and visibilities: often none or short, sometimes longer than
/// the dedup windows.
fn millis() -> impl Strategy<Value = u64> {
    prop_oneof![2 => Just(0u64), 3 => 1..120u64, 1 => 120..600u64]
}

/// Time steps: none, under the windows, a few windows, and (rarely) past
/// the memory of abandoned consumers.
fn step() -> impl Strategy<Value = u64> {
    prop_oneof![2 => Just(0u64), 4 => 1..80u64, 2 => 80..700u64, 1 => 9_000..12_000u64]
}

fn who() -> impl Strategy<Value = Who> {
    prop_oneof![
        4 => Just(Who::Latest),
        2 => any::<usize>().prop_map(Who::Earlier),
        2 => (0..SLOTS).prop_map(Who::Slot),
        1 => Just(Who::Stranger),
    ]
}

fn popper() -> impl Strategy<Value = Popper> {
    prop_oneof![
        6 => (0..SLOTS).prop_map(Popper::Slot),
        1 => any::<usize>().prop_map(Popper::Abandoned),
        1 => Just(Popper::Fresh),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let push = (
        millis(),
        prop::option::of(0..3u8),
        prop::option::weighted(0.5, 0..2u8),
    );
    prop_oneof![
        4 => push.prop_map(|(delay_ms, group, dedup)| Op::Push { delay_ms, group, dedup }),
        5 => (popper(), prop::bool::weighted(0.15), 1..400u64).prop_map(
            |(who, dead, visibility_ms)| Op::Pop { who, dead, visibility_ms }
        ),
        2 => (who(), any::<usize>(), prop::bool::weighted(0.1))
            .prop_map(|(who, pick, wrong_lane)| Op::Ack { who, pick, wrong_lane }),
        2 => (who(), any::<usize>(), millis())
            .prop_map(|(who, pick, delay_ms)| Op::Nack { who, pick, delay_ms }),
        1 => (who(), any::<usize>(), 1..400u64)
            .prop_map(|(who, pick, visibility_ms)| Op::Extend { who, pick, visibility_ms }),
        1 => (0..SLOTS, prop::bool::weighted(0.15))
            .prop_map(|(slot, dead)| Op::Abandon { slot, dead }),
        1 => (0..4usize).prop_map(|limit| Op::Redrive { limit }),
        3 => step().prop_map(|ms| Op::Advance { ms }),
    ]
}

proptest! {
    /// Every step does what the model says, and: no message is lost (each
    /// pushed, non-duplicate message is ready, delayed, in flight, acked or
    /// dead-lettered, exactly one); an ack, nack or extend by a consumer
    /// not holding the message within its visibility is refused and
    /// changes nothing; a message's delivery tokens strictly rise; a
    /// message is in flight to one consumer at most, only before its
    /// deadline; a message delivered `max_deliveries` times goes to the
    /// dead lane at its next turn and is never delivered from the main
    /// lane again before a redrive; a dedup id repeated within the window
    /// of its first push adds nothing, after it adds a message; groups are
    /// served by the turn rule (`model.rs`); an abandoned delivery comes
    /// back ready with its attempt uncounted, and the abandoned consumer's
    /// pops deliver nothing while it is remembered.
    #[test]
    fn random_runs_keep_the_queue_rules(
        ordered in any::<bool>(),
        max_deliveries in prop::option::of(1..=3u32),
        window_ms in prop::sample::select(vec![50u64, 200, 1000]),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        check::random_runs_keep_the_queue_rules(ordered, max_deliveries, window_ms, ops)?;
    }

    /// Unordered groups, nothing ever given back: while a group has ready
    /// messages, no other group is delivered three times without it being
    /// delivered once (each busy group once per round; a group served
    /// last in one round may be served first in the next).
    #[test]
    fn a_busy_group_waits_at_most_one_extra_delivery_per_other_group(
        ops in prop::collection::vec(prop::option::of(0..4u8), 1..120),
    ) {
        check::a_busy_group_waits_at_most_one_extra_delivery_per_other_group(ops)?;
    }
}
