//! One public async fn per conformance case. Each takes a [`Factory`]
//! and panics with a message saying what the backend got wrong.

mod barrier;
mod barrier_late;
mod election;
mod expiry;
mod fair;
mod fencing;
mod health;
mod input;
mod inspect;
mod lease;
mod limiter;
mod list;
mod lock;
mod queue;
mod race;
mod rwlock;
mod semaphore;

pub use barrier::*;
pub use barrier_late::*;
pub use election::*;
pub use expiry::*;
pub use fair::*;
pub use fencing::*;
pub use health::*;
pub use input::*;
pub use inspect::*;
pub use lease::*;
pub use limiter::*;
pub use list::*;
pub use lock::*;
pub use queue::*;
pub use race::*;
pub use rwlock::*;
pub use semaphore::*;

use std::time::Duration;

use coord_core::Error;

use crate::Factory;

pub(crate) use crate::ROUNDS;

/// The handle `r` gives, or `None` when the store does not offer the
/// primitive: the case is then skipped with the store's reason printed
/// (`skipped: the redis backend does not support barriers: <why>`). A
/// store that does not offer a primitive must say why
/// ([`Capabilities::unsupported`](coord_core::Capabilities::unsupported)):
/// an `Unsupported` without a reason fails the case, so nothing is
/// skipped silently.
pub fn offered<T>(r: coord_core::Result<T>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e @ Error::Unsupported { reason, .. }) => {
            assert!(
                !reason.is_empty(),
                "{e}: a store that does not offer a primitive must say why \
                 (Capabilities::unsupported)"
            );
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("expected a handle or Unsupported, got {e:?}"),
    }
}

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
    // Locks, leases and fencing tokens are expected of every backend; the
    // others may be missing where the deployment cannot offer them, and
    // then the capabilities say why, and only of those.
    for (what, ok) in [
        ("locks", c.locks().is_ok()),
        ("leases", c.leases().is_ok()),
        ("fencing tokens", c.fencing().is_ok()),
    ] {
        assert!(ok, "{}: {what} are expected of every backend", caps.backend);
    }
    let missing = [
        ("elections", c.elections().err()),
        ("barriers", c.barriers().err()),
        ("rate limiters", c.limiter().err()),
    ];
    for (what, err) in missing {
        match err {
            None => assert!(
                caps.why_unsupported(what).is_empty(),
                "{}: {what} are offered, but the capabilities say why not",
                caps.backend
            ),
            Some(Error::Unsupported { reason, .. }) => assert!(
                !reason.is_empty() && reason == caps.why_unsupported(what),
                "{}: {what} are not offered, and the error does not give the \
                 capabilities' reason: {reason:?}",
                caps.backend
            ),
            Some(e) => panic!("{what}: expected a handle or Unsupported, got {e:?}"),
        }
    }
}
