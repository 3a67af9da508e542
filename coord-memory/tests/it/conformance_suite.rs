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

/// On a store without semaphores every semaphore case is gated: it says
/// why on stderr and returns, instead of failing on `Unsupported` (and
/// the handle is `Unsupported`, not something that half works).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn semaphore_cases_are_gated_on_a_store_without_semaphores() {
    let bare = || async { coord_core::Coord::from_backend(coord_memory::store("no-semaphores")) };
    let c = bare().await;
    assert!(matches!(
        c.semaphores(),
        Err(coord_core::Error::Unsupported { .. })
    ));
    let f = conformance::Factory::new(bare);
    use conformance::cases::*;
    semaphore_never_more_than_total_holders_under_load(&f).await;
    semaphore_crashed_holders_permit_returns_after_ttl(&f).await;
    semaphore_multi_permit_acquire_is_all_or_none(&f).await;
    semaphore_fencing_tokens_rise(&f).await;
    semaphore_stale_permit_cannot_release_or_extend(&f).await;
    semaphore_waiter_is_woken_by_notification(&f).await;
    semaphore_bad_input_is_rejected_and_writes_nothing(&f).await;
    semaphore_permits_total_mismatch_is_an_error(&f).await;
    semaphore_fifo_head_is_not_overtaken_by_smaller_requests(&f).await;
    semaphore_watchdog_keeps_permit_and_stops_at_release(&f).await;
    semaphore_release_wakes_every_waiter_that_fits(&f).await;
    semaphore_released_permit_is_free_at_once(&f).await;
}

/// The queue cases gate themselves on stores without queues; the reference
/// model must never be one of them, or they would skip here.
#[test]
fn memory_provides_queues_so_no_queue_case_is_skipped() {
    let coord = coord_memory::connect("memory://").expect("memory:// always connects");
    assert!(coord.queues().is_ok());
}

/// The inspection cases gate themselves on stores without inspect; the
/// reference model must never be one of them.
#[tokio::test]
async fn memory_inspects_so_no_inspect_case_is_skipped() {
    let coord = coord_memory::connect("memory://").expect("memory:// always connects");
    assert!(coord.locks().unwrap().inspect("x").await.is_ok());
    assert!(coord.leases().unwrap().inspect("x").await.is_ok());
    assert!(coord.semaphores().unwrap().inspect("x").await.is_ok());
}
