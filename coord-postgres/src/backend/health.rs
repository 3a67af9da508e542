//! The health probe: the server's version, one statement that reads no
//! coord table (through PgBouncer, a server behind it answers).

use coord_core::{Error, Probe, Result, ServerInfo, async_trait};

use super::errors::map_pg;
use super::{BACKEND, PostgresBackend};

#[async_trait]
impl Probe for PostgresBackend {
    async fn probe(&self) -> Result<ServerInfo> {
        const OP: &str = "health probe";
        let rows = self
            .query(OP, "SELECT current_setting('server_version')", &[])
            .await?;
        let version: String = rows
            .first()
            .ok_or_else(|| Error::Store {
                backend: BACKEND,
                operation: OP,
                message: "the server answered no row to SELECT current_setting('server_version')"
                    .into(),
                source: None,
            })?
            .try_get(0)
            .map_err(|e| map_pg(OP, e))?;
        Ok(ServerInfo::new(format!("PostgreSQL {version}")))
    }
}
