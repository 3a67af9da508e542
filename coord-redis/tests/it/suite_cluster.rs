//! The whole shared conformance suite against a real Redis Cluster: three
//! masters and three replicas, started once for this test binary by the
//! test kit (`conformance::testkit::redis::cluster`), reached through a
//! `redis+cluster://` URL listing every node.
//!
//! Every call to `make_coord` builds a FRESH client, as a separate process
//! would have.

use conformance::testkit::redis as kit;

async fn make_coord() -> coord_core::Coord {
    coord_redis::connect(&kit::cluster().url())
        .await
        .expect("connect to the test Redis Cluster")
}

conformance::suite!(make_coord);
