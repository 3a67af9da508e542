//! The whole shared conformance suite again, with every statement going
//! through a real PgBouncer in transaction pooling mode (no session state
//! survives between statements). LISTEN cannot work through it: the
//! client detects that (its probe notification never comes back), reports
//! `notifications: false` and waiters fall back to polling.

use conformance::testkit::postgres::pgbouncer;

async fn make_coord() -> coord_core::Coord {
    let coord = coord_postgres::connect(&pgbouncer().url())
        .await
        .expect("connect through pgbouncer");
    assert!(
        !coord.capabilities().notifications,
        "LISTEN through PgBouncer in transaction mode must be detected as not working"
    );
    coord
}

conformance::suite!(make_coord);
