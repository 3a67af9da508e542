//! The whole shared conformance suite against a real `redis-server`
//! (started once for this test binary by the test kit).
//!
//! Every call to `make_coord` builds a FRESH client (its own command and
//! subscriber connections), as a separate process would have; the cases
//! that prove wake-ups come from notifications set the polling fallback
//! long themselves.

use conformance::testkit::redis as kit;

async fn make_coord() -> coord_core::Coord {
    coord_redis::connect(&kit::url())
        .await
        .expect("connect to the test redis-server")
}

conformance::suite!(make_coord);
