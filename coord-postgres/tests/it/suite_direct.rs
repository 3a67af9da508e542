//! The whole shared conformance suite against a real PostgreSQL 15 (a
//! throwaway cluster started by the test kit), connected directly, with
//! the polling fallback set to 60 s so that every prompt wake-up is proven
//! to come from LISTEN/NOTIFY.

use std::time::Duration;

use conformance::testkit::postgres::cluster;

async fn make_coord() -> coord_core::Coord {
    let coord = coord_postgres::connect(&cluster().url())
        .await
        .expect("connect to the test cluster");
    assert!(
        coord.capabilities().notifications,
        "a direct connection must LISTEN"
    );
    coord.with_poll_interval(Duration::from_secs(60))
}

conformance::suite!(make_coord);
