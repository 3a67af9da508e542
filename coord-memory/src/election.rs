//! Elections: leadership as a claim whose term is a fencing token, and
//! its observers.

use super::*;
use coord_core::Step;

#[async_trait]
impl coord_core::Election for MemoryBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn try_campaign(
        &self,
        name: &str,
        candidate: &str,
        step: Step,
        ttl: Duration,
    ) -> Result<Attempt> {
        let owner = &step.owner;
        let now = Instant::now();
        let granted = {
            let mut shard = self.elections.shard(name);
            let slot = shard.entry(
                name,
                || None,
                |l| l.as_ref().is_none_or(|l| l.expires <= now),
            );
            match slot {
                Some(l) if l.expires > now && l.owner != *owner => {
                    return Ok(Attempt::Held {
                        expires_in: Some(l.expires - now),
                    });
                }
                Some(l) if l.expires > now => {
                    l.expires = now + ttl;
                    return Ok(Attempt::Granted(FencingToken(l.term)));
                }
                _ => {
                    let term = self.next_token();
                    *slot = Some(Leader {
                        owner: *owner,
                        candidate: candidate.to_string(),
                        term,
                        expires: now + ttl,
                    });
                    term
                }
            }
        };
        self.election_wakeups.notify_all(name);
        Ok(Attempt::Granted(FencingToken(granted)))
    }

    async fn renew(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        let owner = &step.owner;
        let now = Instant::now();
        let mut shard = self.elections.shard(name);
        match shard.map.get_mut(name) {
            Some(Some(l)) if l.expires > now && l.owner == *owner => {
                l.expires = now + ttl;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn resign(&self, name: &str, step: Step) -> Result<bool> {
        let owner = &step.owner;
        let now = Instant::now();
        let resigned = {
            let mut shard = self.elections.shard(name);
            match shard.map.get_mut(name) {
                Some(slot @ Some(_)) => {
                    let ours = slot
                        .as_ref()
                        .is_some_and(|l| l.expires > now && l.owner == *owner);
                    if ours {
                        *slot = None;
                    }
                    ours
                }
                _ => false,
            }
        };
        if resigned {
            self.election_wakeups.notify_all(name);
        }
        Ok(resigned)
    }

    async fn leader(&self, name: &str) -> Result<Option<LeaderInfo>> {
        let now = Instant::now();
        let shard = self.elections.shard(name);
        Ok(match shard.map.get(name) {
            Some(Some(l)) if l.expires > now => Some(LeaderInfo {
                candidate: l.candidate.clone(),
                term: FencingToken(l.term),
            }),
            _ => None,
        })
    }

    async fn inspect(&self, name: &str) -> Result<Option<LeaderRecord>> {
        let now = Instant::now();
        let shard = self.elections.shard(name);
        Ok(match shard.map.get(name) {
            Some(Some(l)) if l.expires > now => Some(LeaderRecord {
                candidate: l.candidate.clone(),
                holder: HolderRecord {
                    owner: l.owner,
                    token: FencingToken(l.term),
                    remaining: Some(l.expires - now),
                    metadata: None,
                    permits: 1,
                },
            }),
            _ => None,
        })
    }

    async fn subscribe(&self, name: &str) -> Result<Waiter> {
        Ok(self.election_wakeups.subscribe(name))
    }
}
