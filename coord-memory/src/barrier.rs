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
            // rising even if an idle barrier was swept and made again. Born
            // 0: only an idle state (nobody waits, nothing withdrawn) is
            // swept, so no arrival is ever lost with one.
            let b = shard.entry(
                name,
                || BarrierState {
                    born: 0,
                    ..BarrierState::new(self.next_token())
                },
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
        match shard.map.get(name) {
            None => Ok(true),
            Some(b) => b.is_complete(name, generation),
        }
    }

    async fn withdraw(
        &self,
        name: &str,
        generation: u64,
        participant: &str,
        arrival: &OwnerToken,
    ) -> Result<bool> {
        let mut shard = self.barriers.shard(name);
        if generation == coord_core::ANY_GENERATION {
            // Where it stands is unknown: the tombstone goes into the
            // state there is, made anew if gone.
            let b = shard.entry(
                name,
                || BarrierState {
                    born: 0,
                    ..BarrierState::new(self.next_token())
                },
                BarrierState::is_idle,
            );
            return Ok(b.withdraw(generation, participant, arrival).0);
        }
        // No entry: swept while idle, so the generation completed.
        Ok(shard
            .map
            .get_mut(name)
            .is_some_and(|b| b.withdraw(generation, participant, arrival).0))
    }

    async fn subscribe(&self, name: &str) -> Result<Waiter> {
        Ok(self.barrier_wakeups.subscribe(name))
    }
}
