//! Shared helpers of coord-memory's integration tests.
#![allow(dead_code)]

pub mod faulty;
pub mod forward_queue;
pub mod scoped_tracing;
