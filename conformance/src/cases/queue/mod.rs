//! Work queue cases: at-least-once delivery with visibility timeouts,
//! fenced deliveries, dead letters, dedup, delays and fairness across
//! groups (the rule is in `coord_core::queue_backend`).
//!
//! A store without queues (yet) skips every case here with the reason
//! [`QUEUE_GATE`] on stderr, never a silent pass.

mod contention;
mod dead_letters;
mod dedup;
mod delays;
mod groups;
mod input;
mod visibility;
mod wakeups;

pub use contention::*;
pub use dead_letters::*;
pub use dedup::*;
pub use delays::*;
pub use groups::*;
pub use input::*;
pub use visibility::*;
pub use wakeups::*;

use std::time::Duration;

use coord_core::{Coord, Error, FencingToken, Message, NewMessage, PopAttempt, Queues};

const LONG: Duration = Duration::from_secs(30);

/// How far a store's clock (which stamps `enqueued_at`) may be from this
/// process's wall clock.
pub const CLOCK_SLACK: Duration = Duration::from_secs(2);

/// Why every queue case skips on a store without work queues.
pub const QUEUE_GATE: &str = "work queue not implemented on this store yet";

/// The client's queues, or `None` (with the reason on stderr) if the store
/// has none yet. Any other error fails the case.
fn queues(c: &Coord) -> Option<Queues> {
    match c.queues() {
        Ok(q) => Some(q),
        Err(Error::Unsupported { backend, .. }) => {
            eprintln!("skipped: {QUEUE_GATE} ({backend})");
            None
        }
        Err(e) => panic!("queues(): expected a handle or Unsupported, got {e:?}"),
    }
}

fn field_of<T: std::fmt::Debug>(r: coord_core::Result<T>, what: &str) -> &'static str {
    match r {
        Err(Error::InvalidArgument { field, .. }) => field,
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    }
}

/// A message for the raw trait: no delay, group or dedup id.
fn raw_message(payload: &[u8]) -> NewMessage<'_> {
    NewMessage::new(payload)
}

/// The delivery of a raw `try_pop`, or a panic saying `what` expected one.
fn delivered(attempt: PopAttempt, what: &str) -> (Message, FencingToken) {
    match attempt {
        PopAttempt::Delivered { message, token } => (message, token),
        other => panic!("{what}: expected a delivery, got {other:?}"),
    }
}
