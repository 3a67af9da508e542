//! Barriers: `barrier_arrive` and `barrier_withdraw` (src/sql/barrier.sql).

use coord_core::wake::Waiter;
use coord_core::{Arrival, Barrier, Capabilities, Error, OwnerToken, Result, async_trait};
use tokio_postgres::types::Type;

use super::PostgresBackend;
use super::errors::{map_pg, unexpected};

#[async_trait]
impl Barrier for PostgresBackend {
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
        const OP: &str = "barrier arrive";
        let n = name.to_string();
        let p = participant.to_string();
        let id = arrival.to_hex();
        let parties_i = i32::try_from(parties)
            .map_err(|_| Error::invalid("parties", "at most 2147483647 parties are supported"))?;
        let rows = self
            .query(
                OP,
                &self.sql.barrier_arrive,
                &[
                    (&n, Type::TEXT),
                    (&parties_i, Type::INT4),
                    (&p, Type::TEXT),
                    (&self.channel, Type::TEXT),
                    (&id, Type::TEXT),
                ],
            )
            .await?;
        let row = rows.first().ok_or_else(|| unexpected(OP))?;
        let generation: i64 = row.try_get(0).map_err(|e| map_pg(OP, e))?;
        let complete: bool = row.try_get(1).map_err(|e| map_pg(OP, e))?;
        let started_with: i32 = row.try_get(2).map_err(|e| map_pg(OP, e))?;
        self.after_write();
        if generation == -2 {
            return Err(Error::arrival_withdrawn(name));
        }
        if started_with != parties_i {
            return Err(Error::invalid(
                "parties",
                format!(
                    "barrier `{name}` is in use with {started_with} parties; it cannot be used with {parties} at the same time"
                ),
            ));
        }
        Ok(Arrival {
            generation: generation.max(0) as u64,
            complete,
        })
    }

    async fn is_complete(&self, name: &str, generation: u64) -> Result<bool> {
        const OP: &str = "barrier check";
        let n = name.to_string();
        let g = generation as i64;
        let rows = self
            .query(
                OP,
                &self.sql.barrier_is_complete,
                &[(&n, Type::TEXT), (&g, Type::INT8)],
            )
            .await?;
        // No row: the sweep deleted it (abandoned, or idle past the
        // grace), and the arrival with it. A generation below the row's
        // birth belongs to a row deleted so and made again.
        let Some(r) = rows.first() else {
            return Err(Error::arrival_state_lost(name, generation));
        };
        let lost: bool = r.try_get(1).map_err(|e| map_pg(OP, e))?;
        if lost {
            return Err(Error::arrival_state_lost(name, generation));
        }
        r.try_get(0).map_err(|e| map_pg(OP, e))
    }

    async fn withdraw(
        &self,
        name: &str,
        generation: u64,
        participant: &str,
        arrival: &OwnerToken,
    ) -> Result<bool> {
        const OP: &str = "barrier withdraw";
        let n = name.to_string();
        let g = generation as i64;
        let p = participant.to_string();
        let id = arrival.to_hex();
        let rows = self
            .query(
                OP,
                &self.sql.barrier_withdraw,
                &[
                    (&n, Type::TEXT),
                    (&g, Type::INT8),
                    (&p, Type::TEXT),
                    (&id, Type::TEXT),
                ],
            )
            .await?;
        let row = rows.first().ok_or_else(|| unexpected(OP))?;
        row.try_get(0).map_err(|e| map_pg(OP, e))
    }

    async fn subscribe(&self, name: &str) -> Result<Waiter> {
        Ok(self.waiter("barrier", name))
    }
}
