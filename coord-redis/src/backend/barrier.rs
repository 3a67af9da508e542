//! Reusable barriers.

use coord_core::util::Kind;
use coord_core::wake::Waiter;
use coord_core::{Arrival, Capabilities, Error, OwnerToken, Result, async_trait};

use super::{RedisBackend, array, flag, int, unexpected};
use crate::keys::Keys;

#[async_trait]
impl coord_core::Barrier for RedisBackend {
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
        let keys = self.keys.barrier(name);
        let parties_s = parties.to_string();
        let (channel, payload) = self.wake_args(Kind::Barrier, name);
        let id = arrival.to_hex();
        let v = self
            .eval(
                "barrier arrive",
                &self.scripts.arrive,
                &[&keys[0], &keys[1], &keys[2], &keys[3]],
                &[
                    parties_s.as_bytes(),
                    participant.as_bytes(),
                    channel.as_bytes(),
                    payload.as_bytes(),
                    id.as_bytes(),
                    self.idle_grace_ms.as_bytes(),
                ],
            )
            .await?;
        let a = array("barrier arrive", &v, 2)?;
        if a[0] == -2 {
            return Err(Error::arrival_withdrawn(name));
        }
        if a[0] < 0 {
            return Err(Error::invalid(
                "parties",
                format!(
                    "barrier `{name}` is in use with {} parties; {parties} were given. \
                     Every participant of a generation must use the same party count",
                    a[1]
                ),
            ));
        }
        Ok(Arrival {
            generation: a[0] as u64,
            complete: a[1] != 0,
        })
    }

    async fn is_complete(&self, name: &str, generation: u64) -> Result<bool> {
        let keys = self.keys.barrier(name);
        let gen_s = generation.to_string();
        let v = self
            .eval(
                "barrier check",
                &self.scripts.is_complete,
                &[&keys[0], &keys[1], &keys[2], &keys[3]],
                &[gen_s.as_bytes(), self.idle_grace_ms.as_bytes()],
            )
            .await?;
        match int(&v) {
            Some(1) => Ok(true),
            Some(0) => Ok(false),
            Some(-1) => Err(Error::ArrivalLost {
                name: name.to_string(),
                reason: format!(
                    "the state holding generation {generation} is gone: it expired \
                     (nobody reached Redis for longer than the idle grace, \
                     RedisOptions::idle_grace) or was lost with the server's data"
                ),
            }),
            _ => Err(unexpected("barrier check", &v)),
        }
    }

    async fn withdraw(
        &self,
        name: &str,
        generation: u64,
        participant: &str,
        arrival: &OwnerToken,
    ) -> Result<bool> {
        let keys = self.keys.barrier(name);
        let generation = generation.to_string();
        let id = arrival.to_hex();
        let v = self
            .eval(
                "barrier withdraw",
                &self.scripts.withdraw,
                &[&keys[0], &keys[1], &keys[2], &keys[3]],
                &[
                    generation.as_bytes(),
                    participant.as_bytes(),
                    id.as_bytes(),
                    self.idle_grace_ms.as_bytes(),
                ],
            )
            .await?;
        flag("barrier withdraw", &v)
    }

    async fn subscribe(&self, name: &str) -> Result<Waiter> {
        Ok(self.wakeups.subscribe(&Keys::wake(Kind::Barrier, name)))
    }
}
