//! Shared helpers of coord-memory's integration tests.
#![allow(dead_code)]

pub mod faulty;
pub mod scoped_tracing;
