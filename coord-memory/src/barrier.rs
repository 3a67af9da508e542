//! Barriers: arrivals counted once per participant, one generation at a
//! time (the state machine is coord-core's `BarrierState`).

use super::*;

#[async_trait]
impl coord_core::Barrier for MemoryBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn arrive(
        &self,
        name: &str,
        parties: u32,
        participant: &str,
        arrival: &OwnerToken,
    ) -> Result<Arrival> {
        let arrival = {
            let mut shard = self.barriers.shard(name);
            // Generations come from the store's counter, so they keep
            // rising even if an idle barrier was swept and made again.
            let b = shard.entry(
                name,
                || BarrierState::new(self.next_token()),
                BarrierState::is_idle,
            );
            b.arrive(name, parties, participant, arrival, |_| self.next_token())?
                .0
        };
        if arrival.complete {
            self.barrier_wakeups.notify_all(name);
        }
        Ok(arrival)
    }

    async fn is_complete(&self, name: &str, generation: u64) -> Result<bool> {
        let shard = self.barriers.shard(name);
        // No entry: it was swept while idle, which a generation with a
        // waiter only becomes by completing.
        Ok(shard
            .map
            .get(name)
            .is_none_or(|b| b.is_complete(generation)))
    }

    async fn withdraw(&self, name: &str, generation: u64, participant: &str) -> Result<bool> {
        let mut shard = self.barriers.shard(name);
        // No entry: swept while idle, so the generation completed.
        Ok(shard
            .map
            .get_mut(name)
            .is_some_and(|b| b.withdraw(generation, participant).0))
    }

    async fn subscribe(&self, name: &str) -> Result<Waiter> {
        Ok(self.barrier_wakeups.subscribe(name))
    }
}
