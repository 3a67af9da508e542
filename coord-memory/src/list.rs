//! Listing names (`coord ls`): every shard's map, under its lock, keeps
//! only what is live now.

use coord_core::{Listed, Lister, Result, async_trait};
use tokio::time::Instant;

use crate::{MemoryBackend, Sharded};

impl<T> Sharded<T> {
    /// Up to `limit` names starting with `prefix` whose entry is `live`.
    pub(crate) fn names(
        &self,
        prefix: &str,
        limit: usize,
        live: impl Fn(&T) -> bool,
    ) -> Vec<String> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            for (name, v) in &shard.map {
                if out.len() >= limit {
                    return out;
                }
                if name.starts_with(prefix) && live(v) {
                    out.push(name.to_string());
                }
            }
        }
        out
    }
}

#[async_trait]
impl Lister for MemoryBackend {
    async fn names(&self, kind: Listed, prefix: &str, limit: usize) -> Result<Vec<String>> {
        let now = Instant::now();
        Ok(match kind {
            Listed::Lock => self.locks.names(prefix, limit, |c| c.live(now)),
            Listed::Lease => self.leases.names(prefix, limit, |c| c.live(now)),
            Listed::Election => {
                let live = |l: &Option<crate::Leader>| l.as_ref().is_some_and(|l| l.expires > now);
                self.elections.names(prefix, limit, live)
            }
            Listed::Semaphore | Listed::RwLock => {
                self.semaphores.names(prefix, limit, |s| !s.idle(now))
            }
            Listed::Queue => self.queues.names(prefix, limit, |q| q.messages() > 0),
            _ => {
                return Err(kind.unlisted("memory"));
            }
        })
    }
}
