//! [`Fencing`]: blocking fencing tokens per resource.

use crate::blocking::Rt;
use crate::{FencingToken, Result};

/// Fencing tokens per resource: the blocking form of [`crate::Fencing`].
/// Cheap to clone. Get one with [`Coord::fencing`](crate::blocking::Coord::fencing).
#[derive(Clone)]
pub struct Fencing {
    pub(super) inner: coord_core::Fencing,
    pub(super) rt: Rt,
}

impl std::fmt::Debug for Fencing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Fencing {
    /// The next token for `resource`: strictly greater than every token
    /// handed out for it before, across all clients.
    pub fn next(&self, resource: &str) -> Result<FencingToken> {
        self.rt.block_on(self.inner.next(resource))
    }
}
