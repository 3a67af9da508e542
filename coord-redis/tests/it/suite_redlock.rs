//! The whole shared conformance suite against Redlock: three independent
//! Redis masters, started once for this test binary by the test kit
//! (`conformance::testkit::redis::redlock`), reached through a
//! `redlock://` URL. Redlock offers locks, leases and fencing tokens; the
//! cases of every other primitive are skipped with the reason the backend
//! gives (`Capabilities::unsupported`), printed by each case.
//!
//! Every call to `make_coord` builds a FRESH client, as a separate process
//! would have.

use conformance::testkit::redis as kit;

async fn make_coord() -> coord_core::Coord {
    coord_redis::connect(&kit::redlock().url())
        .await
        .expect("connect to the test Redlock masters")
}

conformance::suite!(make_coord);
