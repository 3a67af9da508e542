//! Rate limiters.

use coord_core::{Capabilities, Decision, Quota, Result, async_trait};

use crate::EtcdBackend;

#[async_trait]
impl coord_core::Limiter for EtcdBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn check(&self, key: &str, quota: &Quota, cost: u64) -> Result<Decision> {
        self.limiters.limiter_check(key, quota, cost).await
    }
}
