//! One public async fn per conformance case. Each takes a [`Factory`]
//! and panics with a message saying what the backend got wrong.

mod barrier;
mod election;
mod expiry;
mod fencing;
mod input;
mod inspect;
mod lease;
mod limiter;
mod lock;
mod queue;
mod rwlock;
mod semaphore;

pub use barrier::*;
pub use election::*;
pub use expiry::*;
pub use fencing::*;
pub use input::*;
pub use inspect::*;
pub use lease::*;
pub use limiter::*;
pub use lock::*;
pub use queue::*;
pub use rwlock::*;
pub use semaphore::*;

use std::time::Duration;

use crate::Factory;

/// The backend's capabilities are self-consistent.
pub async fn capabilities_are_consistent(f: &Factory) {
    let c = f.client().await;
    let caps = c.capabilities();
    assert!(!caps.backend.is_empty(), "backend name must be set");
    assert!(caps.min_ttl > Duration::ZERO, "min_ttl must be > 0");
    assert!(
        caps.ttl_granularity > Duration::ZERO
            && caps.ttl_granularity <= caps.min_ttl.max(caps.ttl_granularity),
        "ttl_granularity must be > 0"
    );
    for p in [
        c.locks().is_ok(),
        c.leases().is_ok(),
        c.fencing().is_ok(),
        c.elections().is_ok(),
        c.barriers().is_ok(),
        c.limiter().is_ok(),
    ] {
        assert!(
            p,
            "{}: every primitive is expected from a coord backend",
            caps.backend
        );
    }
}
