//! Late copies of an owner's own requests, one scenario for every store
//! that refuses them (`coord_core::late`): each backend's tests call it
//! with a client behind a [`FaultProxy`](crate::testkit::proxy::FaultProxy)
//! and one connected directly.

mod barrier;
mod claims;
mod queue;

use std::time::Duration;

pub use barrier::{late_copy_of_a_timed_out_barrier_arrival, late_copy_of_an_arrival_that_passed};
pub use claims::{
    late_copy_after_extend, late_copy_of_an_extend_after_a_later_one, late_extend_after_a_later_one,
};
pub use queue::{dropped_pop_with_one_delivery_allowed, late_pop_with_one_delivery_allowed};

/// When the held request reaches the store, from its send: time enough
/// for the retry and the extend (each tried again until answered) on a
/// loaded machine.
const DELAY: Duration = Duration::from_millis(3000);
/// When the held request's connection is cut (the client reconnects).
const CUT_AFTER: Duration = Duration::from_millis(300);
