//! coord-memory's integration tests, one binary: each module checks one
//! behaviour of the in-memory store or of coord-core's logic through it.
//! `faults` is the fault suite's workloads on this store (`scripts/faults`
//! runs that module by itself, as in every backend crate). The tests that subscribe to
//! `tracing` (`lost_signal`, `spans`) do so on their own threads only, never
//! process-wide (`support::scoped_tracing`).

mod support;

mod cleanup_on_cancel;
mod conformance_suite;
mod core_logic;
mod expiry_instant;
mod extend_deadlines;
mod fair_wait;
mod faults;
mod idle_sweep;
mod leaving_the_line;
mod lost_signal;
mod lost_stays_lost;
mod metrics_recorded;
mod next_wait;
mod queue;
mod queue_faults;
mod queue_lost_replies;
mod reference_model;
mod regressions;
mod semaphore_wakeups;
mod slow_store;
mod spans;
mod suite_catches_faulty_stores;
mod unsettled_arrival;
