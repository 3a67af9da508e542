//! The health probe: the maintenance `Status` call of the member this
//! client talks to, which reads no key.

use coord_core::{Probe, Result, ServerInfo, async_trait};

use crate::backend::EtcdBackend;

#[async_trait]
impl Probe for EtcdBackend {
    async fn probe(&self) -> Result<ServerInfo> {
        let status = self
            .etcd
            .call("health probe", |mut c| async move { c.status().await })
            .await?;
        Ok(ServerInfo::new(format!("etcd {}", status.version())))
    }
}
