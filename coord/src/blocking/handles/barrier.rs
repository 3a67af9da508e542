//! [`Barriers`]: a blocking wait at a barrier.

use std::time::Duration;

use crate::Result;
use crate::blocking::Rt;

/// Barriers on one store: the blocking form of [`crate::Barriers`]. Cheap
/// to clone. Get one with [`Coord::barriers`](crate::blocking::Coord::barriers).
#[derive(Clone)]
pub struct Barriers {
    pub(super) inner: coord_core::Barriers,
    pub(super) rt: Rt,
}

impl std::fmt::Debug for Barriers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Barriers {
    /// Arrive at `name` as `participant` and wait until `parties`
    /// participants of this generation have arrived. Returns the generation
    /// that completed. Errors: [`Error::Timeout`](crate::Error::Timeout) after `timeout` (the
    /// participant has been withdrawn); see [`crate::Barriers::wait`].
    pub fn wait(
        &self,
        name: &str,
        parties: u32,
        participant: &str,
        timeout: Duration,
    ) -> Result<u64> {
        self.rt
            .block_on(self.inner.wait(name, parties, participant, timeout))
    }
}
