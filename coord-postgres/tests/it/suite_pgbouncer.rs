//! The whole shared conformance suite again, with every statement going
//! through a real PgBouncer in transaction pooling mode (no session state
//! survives between statements). LISTEN cannot work through it: the
//! client detects that (its probe notification never comes back), reports
//! `notifications: false` and waiters fall back to polling.
//!
//! The probe waits 2 s for a notification that never comes, so only the
//! first client of this binary runs it (and must detect that LISTEN does
//! not work); the others connect with listening off, which gives the same
//! client (`notifications: false`, polling waiters) without the wait.
//! Otherwise a case that makes its clients one after the other (the
//! semaphore load case) would start them 2 s apart, and they would never
//! contend.

use std::sync::atomic::{AtomicBool, Ordering};

use conformance::testkit::postgres::pgbouncer;

async fn make_coord() -> coord_core::Coord {
    static PROBED: AtomicBool = AtomicBool::new(false);
    let probe = !PROBED.swap(true, Ordering::SeqCst);
    let coord = coord_postgres::builder(&pgbouncer().url())
        .listen(probe)
        .connect()
        .await
        .expect("connect through pgbouncer");
    assert!(
        !coord.capabilities().notifications,
        "LISTEN through PgBouncer in transaction mode must be detected as not working"
    );
    coord
}

conformance::suite!(make_coord);
