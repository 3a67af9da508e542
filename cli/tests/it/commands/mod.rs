//! The `coord` binary run as a user runs it, against real Redis, PostgreSQL
//! and etcd servers started by the test kit.

mod force_release;
mod lock_runs_a_command;
mod other_primitives;
mod stores_urls_and_input;
