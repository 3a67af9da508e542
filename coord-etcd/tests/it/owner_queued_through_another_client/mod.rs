//! One owner through several etcd clients: a refused attempt whose head
//! is the owner's own claim never queues; a release of an owner this
//! client only queued, or whose attempt's outcome is unknown, frees the
//! owner's claim held through another client but never its place in
//! another client's queue; a named lease granted again to its owner
//! through a second client moves the key onto the lease just granted; an
//! unknown-owner release of a named lease deletes the key at its create
//! revision; every extend also compares the key's lease.
//!
//! Each test drives the shared real etcd with a key prefix of its own and
//! reads keys and leases from etcd directly. What must hold (docs/guarantees.md §4):
//! never two holders, tokens never repeat or go back, no client ends a
//! lease it did not create (such a lease may carry that client's next
//! claim), `remaining()` never exceeds what the server would say, a
//! legitimate holder's renewals keep working, nothing is left behind.
//!
//! This file holds the helpers the files below share: reading a named
//! lease's key and state, and waiting for a condition.

use crate::claim_support;
use std::time::Duration;

use coord_core::Attempt;
use etcd_client::{KeyValue, LeaseTimeToLiveOptions};
use tokio::time::{Instant, sleep};

use claim_support::raw_etcd as raw;

mod extends_compare_the_lease;
mod moved_named_leases;
mod queued_or_pending_owner;

const TTL: Duration = Duration::from_secs(30);

fn refused(a: coord_core::Result<Attempt>, what: &str) {
    match a {
        Ok(Attempt::Held { .. }) => {}
        a => panic!("{what}: expected Held, got {a:?}"),
    }
}

/// The named lease's key `<prefix>lease/<name>` (names here need no escape).
async fn lease_kv(prefix: &str, name: &str) -> Option<KeyValue> {
    let key = format!("{prefix}lease/{name}");
    raw()
        .await
        .get(key.as_bytes(), None)
        .await
        .unwrap()
        .take_kvs()
        .into_iter()
        .next()
}

/// A lease's remaining TTL (-1: gone) and the keys it carries.
async fn lease_state(id: i64) -> (i64, Vec<Vec<u8>>) {
    let r = raw()
        .await
        .lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap();
    (r.ttl(), r.keys().to_vec())
}

/// Wait up to `limit` for `cond`.
async fn eventually<F, Fut>(limit: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + limit;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        sleep(Duration::from_millis(50)).await;
    }
}
