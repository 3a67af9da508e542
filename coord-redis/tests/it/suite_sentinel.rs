//! The whole shared conformance suite against Redis behind Sentinel: a
//! master, a replica and three sentinels, started once for this test
//! binary by the test kit (`conformance::testkit::redis::sentinel`),
//! reached through a `redis+sentinel://` URL listing the sentinels.
//!
//! Every call to `make_coord` builds a FRESH client, as a separate process
//! would have.

use conformance::testkit::redis as kit;

async fn make_coord() -> coord_core::Coord {
    coord_redis::connect(&kit::sentinel().url())
        .await
        .expect("connect to the test Redis behind Sentinel")
}

conformance::suite!(make_coord);
