//! Rate limiters: one statement per check. On a connection with prepared
//! statements a GCRA check is `Sql::limiter_gcra`, which admits the common
//! case itself and hands every other to `limiter_check` in the same
//! statement; otherwise, and for the other algorithms, one call of
//! `limiter_check` (src/sql/limiter.sql).

use std::time::Duration;

use coord_core::{Algorithm, Capabilities, Decision, Error, Limiter, Quota, Result, async_trait};
use tokio_postgres::types::Type;

use super::errors::{map_pg, unexpected};
use super::{BACKEND, PostgresBackend, from_micros, micros_ceil};

#[async_trait]
impl Limiter for PostgresBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn check(&self, key: &str, quota: &Quota, cost: u64) -> Result<Decision> {
        const OP: &str = "limiter check";
        let algorithm = match quota.algorithm {
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::Gcra => "gcra",
            _ => {
                return Err(Error::Unsupported {
                    backend: BACKEND,
                    primitive: "this rate limiting algorithm",
                    reason: "",
                });
            }
        }
        .to_string();
        let key = key.to_string();
        let limit = i64::try_from(quota.limit).unwrap_or(i64::MAX);
        let window = micros_ceil(quota.window).max(1);
        let cost = i64::try_from(cost).unwrap_or(i64::MAX);
        let rows = if self.prepared && quota.algorithm == Algorithm::Gcra {
            self.query(
                OP,
                &self.sql.limiter_gcra,
                &[
                    (&key, Type::TEXT),
                    (&limit, Type::INT8),
                    (&window, Type::INT8),
                    (&cost, Type::INT8),
                ],
            )
            .await?
        } else {
            self.query(
                OP,
                &self.sql.limiter_check,
                &[
                    (&algorithm, Type::TEXT),
                    (&key, Type::TEXT),
                    (&limit, Type::INT8),
                    (&window, Type::INT8),
                    (&cost, Type::INT8),
                ],
            )
            .await?
        };
        let row = rows.first().ok_or_else(|| unexpected(OP))?;
        let allowed: bool = row.try_get(0).map_err(|e| map_pg(OP, e))?;
        if allowed {
            self.after_write();
        }
        let remaining: i64 = row.try_get(1).map_err(|e| map_pg(OP, e))?;
        let retry_after: i64 = row.try_get(2).map_err(|e| map_pg(OP, e))?;
        let reset_after: i64 = row.try_get(3).map_err(|e| map_pg(OP, e))?;
        Ok(Decision {
            allowed,
            remaining: remaining.max(0) as u64,
            retry_after: if allowed {
                Duration::ZERO
            } else {
                from_micros(retry_after).max(Duration::from_micros(1))
            },
            reset_after: from_micros(reset_after),
        })
    }
}
