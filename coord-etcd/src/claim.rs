//! Claims: locks, elections and named leases.

pub(crate) mod attempt;
pub(crate) mod entries;
pub(crate) mod handoff;
pub(crate) mod holding;
pub(crate) mod named_lease;
pub(crate) mod waiters;
