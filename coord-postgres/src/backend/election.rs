//! Leader election on the claims table (`kind = 'election'`).

use std::time::Duration;

use coord_core::inspect::{HolderRecord, LeaderRecord};
use coord_core::wake::Waiter;
use coord_core::{Attempt, Capabilities, Election, LeaderInfo, Result, Step, async_trait};
use tokio_postgres::types::Type;

use super::claims::{KIND_ELECTION, owner_token};
use super::errors::map_pg;
use super::{PostgresBackend, from_micros, token};

#[async_trait]
impl Election for PostgresBackend {
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
        self.claim_acquire(
            "election campaign",
            (KIND_ELECTION, true),
            name,
            step,
            Some(candidate),
            ttl,
            None,
        )
        .await
    }

    async fn renew(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        self.claim_extend("election renew", KIND_ELECTION, name, step, ttl)
            .await
    }

    async fn resign(&self, name: &str, step: Step) -> Result<bool> {
        self.claim_release("election resign", KIND_ELECTION, name, step, true)
            .await
    }

    async fn leader(&self, name: &str) -> Result<Option<LeaderInfo>> {
        let name = name.to_string();
        let rows = self
            .query("election leader", &self.sql.leader, &[(&name, Type::TEXT)])
            .await?;
        match rows.first() {
            None => Ok(None),
            Some(r) => {
                let candidate: Option<String> =
                    r.try_get(0).map_err(|e| map_pg("election leader", e))?;
                let term: i64 = r.try_get(1).map_err(|e| map_pg("election leader", e))?;
                Ok(Some(LeaderInfo {
                    candidate: candidate.unwrap_or_default(),
                    term: token(term),
                }))
            }
        }
    }

    async fn inspect(&self, name: &str) -> Result<Option<LeaderRecord>> {
        let op = "election inspect";
        let name = name.to_string();
        let rows = self
            .query(op, &self.sql.leader_inspect, &[(&name, Type::TEXT)])
            .await?;
        let Some(r) = rows.first() else {
            return Ok(None);
        };
        let candidate: Option<String> = r.try_get(0).map_err(|e| map_pg(op, e))?;
        let owner: Vec<u8> = r.try_get(1).map_err(|e| map_pg(op, e))?;
        let term: i64 = r.try_get(2).map_err(|e| map_pg(op, e))?;
        let us: i64 = r.try_get(3).map_err(|e| map_pg(op, e))?;
        Ok(Some(LeaderRecord {
            candidate: candidate.unwrap_or_default(),
            holder: HolderRecord {
                owner: owner_token(op, &owner)?,
                token: token(term),
                remaining: Some(from_micros(us)),
                metadata: None,
                permits: 1,
            },
        }))
    }

    async fn subscribe(&self, name: &str) -> Result<Waiter> {
        Ok(self.waiter(KIND_ELECTION, name))
    }
}
