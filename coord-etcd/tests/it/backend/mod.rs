//! The etcd backend's own tests, on the raw traits, against a real
//! single-node etcd started by the test kit.
//!
//! This file holds the helpers the files below share: a backend, a TTL,
//! and the token of a grant.

use std::sync::Arc;
use std::time::Duration;

use conformance::testkit::etcd;
use coord_core::Attempt;
use coord_etcd::{EtcdBackend, EtcdOptions};

mod configuration;
mod lock_waiters;
mod locks;
mod other_primitives;

async fn backend() -> Arc<EtcdBackend> {
    EtcdBackend::connect(EtcdOptions::parse(&etcd::shared().url()).unwrap())
        .await
        .expect("connect to the test etcd")
}

fn ttl(b: &EtcdBackend) -> Duration {
    b.capabilities().min_ttl
}

fn granted(a: Attempt) -> u64 {
    match a {
        Attempt::Granted(t) => t.get(),
        other => panic!("expected a grant, got {other:?}"),
    }
}
