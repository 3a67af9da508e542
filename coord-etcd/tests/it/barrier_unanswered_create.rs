//! A barrier arrival that creates the barrier's key (on a lease granted
//! for it) lands, but its reply never comes: the client's connection is
//! cut under the call, which fails (not by its timeout). Meanwhile another
//! participant arrives and the generation completes with the first one
//! counted. The first wait must pass that generation: the other passed
//! with it counted (`docs/guarantees.md`: nobody passes with a participant
//! counted whose wait ends without passing; a retried arrival never joins
//! a later generation).
//!
//! What it guards: `barrier_cas` (`src/barrier.rs`) revokes a lease it
//! granted for the key only once the key is known to be on another lease.
//! Revoking it whenever the transaction that put the key on it failed
//! (though that transaction may have landed) deleted the key with the
//! completed generation's record, and a's retry (the same arrival id)
//! arrived anew in a barrier made again.

use std::time::Duration;

use conformance::testkit::etcd;
use conformance::testkit::proxy::{FaultProxy, Mode};
use late_support::{SEC, connect, direct, unique, until};

use crate::late_support;

async fn raw() -> etcd_client::Client {
    etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap()
}

/// The barrier key's create revision and lease, if it exists.
async fn key_of(prefix: &str, name: &str) -> Option<(i64, i64)> {
    let key = format!("{prefix}barrier/{name}");
    let mut resp = raw().await.get(key.as_bytes(), None).await.unwrap();
    resp.take_kvs()
        .first()
        .map(|kv| (kv.create_revision(), kv.lease()))
}

async fn created_at(prefix: &str, name: &str) -> Option<i64> {
    key_of(prefix, name).await.map(|(c, _)| c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_counted_in_a_passed_generation_passes_it_though_its_creating_arrival_was_cut() {
    let prefix = unique("barrier-cut-create");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    proxy.close_after_loss(true);
    // Patient: the held arrival fails by the cut, not by a timeout.
    let far = connect(proxy.port(), &prefix, 10 * SEC).await.coord();
    let near = direct(&prefix).await.coord();
    let (far, near) = (far.barriers().unwrap(), near.barriers().unwrap());
    far.wait("warm", 1, "w", 5 * SEC).await.unwrap();
    let name = "gate";
    assert_eq!(created_at(&prefix, name).await, None);
    // The arrival's transaction is the only request carrying "a-first".
    proxy.deliver_late(
        |b| b.windows(7).any(|w| w == b"a-first"),
        Duration::from_millis(100),
        Duration::from_millis(2500),
    );
    let a = {
        let far = far.clone();
        tokio::spawn(async move { far.wait(name, 2, "a-first", 8 * SEC).await })
    };
    until("the arrival held", 10 * SEC, || proxy.held() == 1).await;
    // Its reply (and every reply through the proxy) is dropped from now on.
    proxy.set(Mode::DropReplies);
    until("the arrival delivered", 10 * SEC, || proxy.delivered() == 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (first, lease) = key_of(&prefix, name)
        .await
        .expect("the held arrival created the barrier");
    let b = near.wait(name, 2, "b", 5 * SEC).await;
    let passed = b.expect("b passes with a, whose arrival landed");
    // The cut (2.5 s after the hold) fails a's call; let what it sends then
    // land, then answer again.
    tokio::time::sleep(Duration::from_millis(2800)).await;
    proxy.heal();
    // If a arrived again in a barrier made anew, c makes it pass again.
    let since = tokio::time::Instant::now();
    while created_at(&prefix, name).await == Some(first) && since.elapsed() < 5 * SEC {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let now = created_at(&prefix, name).await;
    let c = near.wait(name, 2, "c", 3 * SEC).await;
    let a = a.await.unwrap();
    // -1: the lease is gone (revoked: its TTL is 30 s).
    let ttl = raw()
        .await
        .lease_time_to_live(lease, None)
        .await
        .unwrap()
        .ttl();
    assert_eq!(
        a.as_ref().ok(),
        Some(&passed),
        "b passed generation {passed} with a counted, but a's wait ended {a:?} (c: {c:?}; the \
         barrier key, created at {first}, is now created at {now:?}: the key a's arrival \
         created was deleted after b passed; its lease {lease:x} has TTL {ttl})"
    );
}
