//! The whole shared conformance suite against a real single-node etcd.
//!
//! The polling fallback is set to 60 s, so every wake-up a case relies on
//! comes from an etcd watch.

use std::time::Duration;

use conformance::testkit::etcd;

async fn make_coord() -> coord_core::Coord {
    coord_etcd::connect(&etcd::shared().url())
        .await
        .expect("connect to the test etcd")
        .with_poll_interval(Duration::from_secs(60))
}

conformance::suite!(make_coord);
