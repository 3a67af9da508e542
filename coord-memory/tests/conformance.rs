//! The whole conformance suite against the in-memory backend.

async fn make_coord() -> coord_core::Coord {
    // Every client of `memory://` shares the process-wide store, as clients
    // of one server would.
    coord_memory::connect("memory://").expect("memory:// always connects")
}

conformance::suite!(make_coord);

/// The semaphore cases gate themselves on stores without semaphores; the
/// reference model must never be one of them, or they would skip here.
#[test]
fn memory_provides_semaphores_so_no_semaphore_case_is_skipped() {
    let coord = coord_memory::connect("memory://").expect("memory:// always connects");
    assert!(coord.semaphores().is_ok_and(|s| s.is_fifo()));
}
