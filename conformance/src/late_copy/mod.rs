//! Late copies of an owner's own requests, one scenario for every store
//! that refuses them (`coord_core::late`): each backend's tests call it
//! with a client behind a [`FaultProxy`]
//! and one connected directly.

mod barrier;
mod claims;
mod queue;

use std::time::{Duration, Instant};

use crate::testkit::proxy::FaultProxy;

pub use barrier::{
    late_copy_of_a_timed_out_barrier_arrival,
    late_copy_of_a_withdrawn_arrival_after_its_generation_completed,
    late_copy_of_an_arrival_that_passed,
};
pub use claims::{
    late_copy_after_extend, late_copy_of_an_extend_after_a_later_one, late_extend_after_a_later_one,
};
pub use queue::{
    dropped_pop_with_one_delivery_allowed, late_copy_of_a_delivery_extend_after_a_later_one,
    late_pop_with_one_delivery_allowed, late_push_lands_once,
};

/// When the held request reaches the store, from its send: time enough
/// for the retry and the extend (each tried again until answered) on a
/// loaded machine.
const DELAY: Duration = Duration::from_millis(3000);
/// When the held request's connection is cut (the client reconnects).
const CUT_AFTER: Duration = Duration::from_millis(300);

/// Wait until the client whose request the proxy held at `held_at` has
/// reconnected (that request's connection is cut at [`CUT_AFTER`]).
pub(super) async fn until_reconnected(held_at: Instant) {
    tokio::time::sleep_until((held_at + CUT_AFTER + Duration::from_millis(50)).into()).await;
}

/// By when a step must be answered to come before the copy of the request
/// held at `held_at` lands (at [`DELAY`]).
pub(super) fn before_the_copy(held_at: Instant) -> Instant {
    held_at + DELAY - Duration::from_millis(200)
}

/// `proxy` holds the next request naming `name` for [`DELAY`] and cuts
/// its connection after [`CUT_AFTER`].
pub(super) fn hold_next_naming(proxy: &FaultProxy, name: &str) {
    hold_next_naming_for(proxy, name, DELAY);
}

/// [`hold_next_naming`], the request held for `delay`.
pub(super) fn hold_next_naming_for(proxy: &FaultProxy, name: &str, delay: Duration) {
    let n = name.to_string();
    proxy.deliver_late(
        move |b: &[u8]| b.windows(n.len()).any(|w| w == n.as_bytes()),
        delay,
        CUT_AFTER,
    );
}

/// Re-exported where backends' late-copy tests have always found it.
pub use crate::testkit::wait::until_answered;
