//! The randomness of the core (owner tokens, wait jitter), with a
//! per-thread override for deterministic simulation.
//!
//! By default every draw comes from `rand`'s thread-local CSPRNG. A
//! simulator that runs a whole workload on one thread (a current-thread
//! tokio runtime) calls [`seed_thread`] first: from then on, draws on that
//! thread come from a generator seeded with that value, so one seed gives
//! one history. [`unseed_thread`] goes back to the CSPRNG. Never seed a
//! thread that serves real clients: seeded owner tokens are guessable.
//!
//! For the same reason every `tokio::select!` in the core is `biased`:
//! when several branches are ready at once (common under paused time), the
//! first listed wins, instead of one drawn from tokio's unseeded generator.
//!
//! ```
//! coord_core::rng::seed_thread(7);
//! let a = coord_core::OwnerToken::random();
//! let (s1, s2) = (coord_core::late::stamp(), coord_core::late::stamp());
//! coord_core::rng::seed_thread(7);
//! assert_eq!(coord_core::OwnerToken::random(), a);
//! // Stamps count up from a fixed start: the same, and still rising.
//! assert_eq!((coord_core::late::stamp(), coord_core::late::stamp()), (s1, s2));
//! assert!(s2 > s1);
//! coord_core::rng::unseed_thread();
//! ```

use std::cell::RefCell;

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

thread_local! {
    static SEEDED: RefCell<Option<StdRng>> = const { RefCell::new(None) };
    /// The last stamp ([`crate::late::stamp`]) of a seeded thread: stamps
    /// there count up from a fixed start instead of reading the clock.
    static STAMP: std::cell::Cell<Option<i64>> = const { std::cell::Cell::new(None) };
}

/// From now on, draws on this thread come from a generator seeded with
/// `seed` (see the module docs). For simulation and tests only.
pub fn seed_thread(seed: u64) {
    SEEDED.with(|s| *s.borrow_mut() = Some(StdRng::seed_from_u64(seed)));
    STAMP.with(|s| s.set(Some(1_000_000_000_000_000)));
}

/// Go back to the thread-local CSPRNG on this thread.
pub fn unseed_thread() {
    SEEDED.with(|s| *s.borrow_mut() = None);
    STAMP.with(|s| s.set(None));
}

/// On a seeded thread, the next stamp (one above the last); `None`
/// otherwise.
pub(crate) fn seeded_stamp() -> Option<i64> {
    STAMP.with(|s| {
        let next = s.get()? + 1;
        s.set(Some(next));
        Some(next)
    })
}

/// Fill `bytes` with random bytes.
pub(crate) fn fill_bytes(bytes: &mut [u8]) {
    SEEDED.with(|s| match s.borrow_mut().as_mut() {
        Some(r) => r.fill_bytes(bytes),
        None => rand::rng().fill_bytes(bytes),
    });
}

/// A random integer in `lo..=hi`.
pub(crate) fn range_inclusive(lo: u64, hi: u64) -> u64 {
    SEEDED.with(|s| match s.borrow_mut().as_mut() {
        Some(r) => r.random_range(lo..=hi),
        None => rand::rng().random_range(lo..=hi),
    })
}
