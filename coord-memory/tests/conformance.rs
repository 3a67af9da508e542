//! The whole conformance suite against the in-memory backend.

async fn make_coord() -> coord_core::Coord {
    // Every client of `memory://` shares the process-wide store, as clients
    // of one server would.
    coord_memory::connect("memory://").expect("memory:// always connects")
}

conformance::suite!(make_coord);
