//! Holder metadata and inspection on etcd, on the raw traits and the keys
//! they write, against a real single-node etcd: the metadata lives in the
//! grant's own key (so it goes with a release, an expiry or a force
//! release, and a later grant without it shows none), a retry by the same
//! owner keeps the grant as it is, semaphore grants are listed with their
//! permits, and queued lock and semaphore waiters are counted.
//!
//! This file holds the helpers the files below share: backends, prefixes
//! and reading keys' values straight from etcd.

use std::sync::Arc;
use std::time::Duration;

use conformance::testkit::etcd;
use coord_core::inspect::ClaimRecord;
use coord_core::{Attempt, FencingToken};
use coord_etcd::{EtcdBackend, EtcdOptions};

mod costs;
mod lease_metadata;
mod lock_metadata;
mod semaphore_grants;

const LONG: Duration = Duration::from_secs(30);

async fn backend(prefix: &str) -> Arc<EtcdBackend> {
    let url = format!("{}?prefix={prefix}", etcd::shared().url());
    EtcdBackend::connect(EtcdOptions::parse(&url).unwrap())
        .await
        .expect("connect to the test etcd")
}

fn prefix(case: &str) -> String {
    format!("inspect-{case}-{}/", std::process::id())
}

fn granted(a: Attempt) -> FencingToken {
    match a {
        Attempt::Granted(t) => t,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn one(r: &ClaimRecord) -> &coord_core::inspect::HolderRecord {
    assert_eq!(r.holders.len(), 1, "{r:?}");
    &r.holders[0]
}
