//! Listing names (`coord ls`): one bounded `SELECT` per kind, live
//! grants only (see the statements in `sql.rs`).

use coord_core::{Listed, Lister, Result, async_trait};
use tokio_postgres::types::Type;

use super::claims::{KIND_ELECTION, KIND_LEASE, KIND_LOCK};
use super::errors::map_pg;
use super::{BACKEND, PostgresBackend};

#[async_trait]
impl Lister for PostgresBackend {
    async fn names(&self, kind: Listed, prefix: &str, limit: usize) -> Result<Vec<String>> {
        const OP: &str = "list";
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let prefix = prefix.to_string();
        let claim = match kind {
            Listed::Lock => Some(KIND_LOCK),
            Listed::Lease => Some(KIND_LEASE),
            Listed::Election => Some(KIND_ELECTION),
            _ => None,
        };
        let (rows, _) = match (kind, claim) {
            (_, Some(k)) => {
                let k = k.to_string();
                let params = [
                    (&k as _, Type::TEXT),
                    (&prefix as _, Type::TEXT),
                    (&limit as _, Type::INT8),
                ];
                self.query_then(OP, &self.sql.list_claims, &params, None)
                    .await?
            }
            (Listed::Semaphore | Listed::RwLock, _) => {
                let params = [(&prefix as _, Type::TEXT), (&limit as _, Type::INT8)];
                self.query_then(OP, &self.sql.list_semaphores, &params, None)
                    .await?
            }
            (Listed::Queue, _) => {
                let params = [(&prefix as _, Type::TEXT), (&limit as _, Type::INT8)];
                self.query_then(OP, &self.sql.list_queues, &params, None)
                    .await?
            }
            _ => {
                return Err(kind.unlisted(BACKEND));
            }
        };
        rows.iter()
            .map(|r| r.try_get::<_, String>(0).map_err(|e| map_pg(OP, e)))
            .collect()
    }
}
