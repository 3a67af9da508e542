//! The `coord` command's integration tests, one binary: each module runs
//! the real `coord` binary against real stores started by the test kit.

mod common;

mod commands;
mod inspect;
mod ownership;
mod queue;
mod signals;
mod ui;
