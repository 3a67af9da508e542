//! Claim keys named by their lease (`<prefix>lock|election/<name>/<lease
//! hex>`, the owner in the value, a spare lease's key written again by the
//! client's next claim): stale owners, reused keys and leases, races with
//! releases, force releases and cancellations, odd names.
//!
//! Each test drives a real etcd (the binary's shared server, a prefix of
//! its own per test) and checks the contract (docs/guarantees.md):
//! release and extend act only for the owner that holds and otherwise
//! report not held and change nothing; tokens rise over the grants of a
//! name; at most one holder at a time; a cancelled or refused attempt
//! leaves nothing behind; names and candidates are taken as they are.
//! Keys and leases are read from etcd directly, never from the client.
//!
//! This file holds the helpers the files below share: reading a name's
//! keys and what identifies their versions.

use crate::claim_support;
use std::time::Duration;

use conformance::testkit::wait::until;
use coord_core::{Attempt, OwnerToken};
use etcd_client::KeyValue;

use claim_support::claim_keys;

mod keys_on_a_lease;
mod odd_names;
mod release_races;
mod stale_owners;
mod waiters_and_tokens;

const LONG: Duration = Duration::from_secs(30);

async fn lock_keys(prefix: &str, name: &str) -> Vec<KeyValue> {
    claim_keys(prefix, "lock", name).await
}

fn hex(o: &OwnerToken) -> Vec<u8> {
    o.to_hex().into_bytes()
}

/// What identifies a stored key version: (key, create, mod, lease, value).
type Snap = (Vec<u8>, i64, i64, i64, Vec<u8>);

fn snap(kv: &KeyValue) -> Snap {
    (
        kv.key().to_vec(),
        kv.create_revision(),
        kv.mod_revision(),
        kv.lease(),
        kv.value().to_vec(),
    )
}

fn refused(a: coord_core::Result<Attempt>) {
    match a {
        Ok(Attempt::Held { .. }) => {}
        a => panic!("expected a refusal: {a:?}"),
    }
}

async fn until_keys(prefix: &str, name: &str, n: usize, limit: Duration) {
    until(&format!("{n} keys under lock {name:?}"), limit, || async {
        lock_keys(prefix, name).await.len() == n
    })
    .await;
}
