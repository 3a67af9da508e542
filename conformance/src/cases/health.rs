//! Health cases.

use std::time::Duration;

use crate::Factory;

/// `Coord::health` makes one round trip and reports the store and
/// deployment its capabilities name, the server's version, a round trip
/// well under any call timeout, and exactly the primitives the handle
/// gives.
pub async fn health_reports_the_store_and_what_it_offers(f: &Factory) {
    let c = f.client().await;
    let h = c.health().await.expect("the health of a live store");
    let caps = c.capabilities();
    assert_eq!(h.backend, caps.backend);
    assert_eq!(h.deployment, caps.deployment);
    assert!(
        !h.server.version.trim().is_empty(),
        "{}: the server reported no version: {h:?}",
        caps.backend
    );
    assert!(
        h.round_trip < Duration::from_secs(5),
        "{}: a health round trip of {:?}",
        caps.backend,
        h.round_trip
    );
    let gives = [
        ("locks", c.locks().is_ok()),
        ("leases", c.leases().is_ok()),
        ("fencing", c.fencing().is_ok()),
        ("elections", c.elections().is_ok()),
        ("barriers", c.barriers().is_ok()),
        ("limiters", c.limiter().is_ok()),
        ("semaphores", c.semaphores().is_ok()),
        ("rwlocks", c.rw_locks().is_ok()),
        ("queues", c.queues().is_ok()),
    ];
    for (primitive, given) in gives {
        assert_eq!(
            h.primitives.contains(&primitive),
            given,
            "{}: health lists {:?}, and the handle {} {primitive}",
            caps.backend,
            h.primitives,
            if given { "gives" } else { "does not give" }
        );
    }
}
