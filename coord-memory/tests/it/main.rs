//! coord-memory's integration tests, one binary: each module checks one
//! behaviour of the in-memory store or of coord-core's logic through it.
//! Binaries of their own: `faults` (the fault suite, which
//! `scripts/faults` runs by itself, as in every backend crate), and
//! `lost_signal` and `spans`: tracing keeps process-wide state (the global
//! subscriber, each callsite's cached interest) that tests in other
//! modules would disturb.

mod support;

mod cleanup_on_cancel;
mod conformance_suite;
mod core_logic;
mod leaving_the_line;
mod lost_stays_lost;
mod metrics_recorded;
mod next_wait;
mod queue;
mod queue_faults;
mod regressions;
mod slow_store;
mod suite_catches_faulty_stores;
mod unsettled_arrival;
