//! The health probe on a path that stops answering, the same on every
//! store: bounded by the call timeout, and healthy again after the heal.

use std::time::Duration;

use coord_core::{Coord, Error};
use tokio::time::{Instant, sleep};

use crate::testkit::proxy::FaultProxy;

/// `coord` reaches its store through `proxy` only, with call timeout
/// `timeout`. While the proxy drops everything, `health` answers
/// [`Error::Unavailable`] within the call timeout (plus a margin for a
/// loaded machine), never hangs; once healed, it answers again within a
/// few seconds (the client reconnects on its own).
pub async fn unanswered_probe(coord: &Coord, proxy: &FaultProxy, timeout: Duration) {
    // Healthy before the fault: a probe answered (one may miss a short
    // call timeout on a loaded machine; a probe changes nothing).
    crate::testkit::wait::until_answered(
        std::time::Instant::now() + Duration::from_secs(10),
        "the health probe before the fault",
        || coord.health(),
    )
    .await;
    proxy.blackhole();
    let start = Instant::now();
    let r = tokio::time::timeout(timeout * 4 + Duration::from_secs(2), coord.health())
        .await
        .expect("health hung on a store that does not answer");
    let took = start.elapsed();
    assert!(
        matches!(r, Err(Error::Unavailable { .. })),
        "health through a dead path: {r:?}"
    );
    assert!(
        took <= timeout * 2 + Duration::from_millis(500),
        "health through a dead path took {took:?} (call timeout {timeout:?})"
    );
    proxy.heal();
    let healed = Instant::now();
    loop {
        match coord.health().await {
            Ok(h) => {
                println!(
                    "health: unavailable after {took:?}, healthy again {:?} after the heal ({})",
                    healed.elapsed(),
                    h.server.version
                );
                return;
            }
            Err(e) if healed.elapsed() < Duration::from_secs(10) => {
                assert!(e.is_retryable(), "after the heal: {e:?}");
                sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("still unhealthy 10 s after the heal: {e:?}"),
        }
    }
}
