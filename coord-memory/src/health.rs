//! The health probe: the store lives in this process, so it always
//! answers, with this crate's version.

use coord_core::{Probe, Result, ServerInfo, async_trait};

use crate::MemoryBackend;

#[async_trait]
impl Probe for MemoryBackend {
    async fn probe(&self) -> Result<ServerInfo> {
        Ok(ServerInfo::new(concat!(
            "coord-memory ",
            env!("CARGO_PKG_VERSION")
        )))
    }
}
