//! Rate limiters: coord-core's algorithms on a state per key.

use super::*;

fn algorithm_tag(a: Algorithm) -> &'static str {
    match a {
        Algorithm::SlidingLog => "log:",
        Algorithm::SlidingWindow => "sw:",
        Algorithm::FixedWindow => "fw:",
        Algorithm::Gcra => "gcra:",
        _ => "other:",
    }
}

#[async_trait]
impl coord_core::Limiter for MemoryBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn check(&self, key: &str, quota: &Quota, cost: u64) -> Result<Decision> {
        let now = Instant::now().duration_since(self.epoch).as_nanos();
        let mut full = String::with_capacity(key.len() + 5);
        full.push_str(algorithm_tag(quota.algorithm));
        full.push_str(key);
        let mut shard = self.limits.shard(&full);
        // Each state keeps the quota it was computed under, so the sweep
        // judges it by its own window and a changed quota starts afresh.
        let state = shard.entry(&full, || LimitState::new(quota), |s| s.is_idle(now));
        Ok(state.check(now, quota, cost))
    }
}
