//! A cleanup that outlasts an outage, the same on every store: what an
//! operation whose reply never came may have left is undone in the
//! background, sent again while the store does not answer
//! (docs/guarantees.md §8), not given up after a few tries and left to
//! its TTL.

use std::time::{Duration, Instant};

use coord_core::Coord;

use crate::testkit::proxy::FaultProxy;
use crate::testkit::wait::{holds_within, until_answered};

/// How long the store does not answer: longer than a few tries of a
/// cleanup, with their backoff and call timeouts.
pub const OUTAGE: Duration = Duration::from_secs(15);

/// The lock's TTL: what a given-up cleanup would leave the name held for.
pub const TTL: Duration = Duration::from_secs(60);

/// How soon after the heal the name must be free: a cleanup's longest
/// pause between sends, a reconnect, and room for a loaded machine.
pub const FREED_WITHIN: Duration = Duration::from_secs(12);

/// `via` (a client through `proxy`, call timeout under a second) holds
/// lock `name` with a 60 s TTL. The store stops answering it (`proxy`
/// drops everything) for [`OUTAGE`], so its release fails and is left to
/// the background cleanup. After the heal the name must be free for
/// `direct` within [`FREED_WITHIN`], long before the TTL.
pub async fn release_in_a_long_outage(via: &Coord, direct: &Coord, proxy: &FaultProxy, name: &str) {
    // After the outage the connections that lost bytes are closed, as a
    // real network's time out, and the client connects again.
    proxy.close_after_loss(true);
    let far = via.locks().unwrap();
    let near = direct.locks().unwrap();
    let guard = until_answered(
        Instant::now() + Duration::from_secs(20),
        "the first acquire",
        || far.acquire(name, TTL, Duration::from_secs(5)),
    )
    .await;
    proxy.blackhole();
    let outage = Instant::now();
    let r = guard.release().await;
    assert!(r.is_err(), "the release was answered in the outage: {r:?}");
    tokio::time::sleep_until((outage + OUTAGE).into()).await;
    let held = near.try_acquire(name, TTL).await.unwrap();
    assert!(
        held.is_none(),
        "the lock was free before the outage ended: the release got through"
    );
    proxy.heal();
    let freed = holds_within(FREED_WITHIN, || async {
        matches!(near.try_acquire(name, TTL).await, Ok(Some(_)))
    })
    .await;
    assert!(
        freed.is_some(),
        "lock {name} was still held {FREED_WITHIN:?} after the store answered again \
         (its TTL is {TTL:?}): the release's cleanup was given up during the outage"
    );
}
