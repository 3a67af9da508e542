//! The sweep: deleting the state of idle names (`src/sql/sweep.sql`), run
//! in the background by a client after its writes, at most once per
//! [`PostgresBuilder::sweep_every`], and on demand with
//! [`PostgresBackend::sweep`].

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use coord_core::Result;
use tokio_postgres::types::Type;

use super::errors::{map_pg, unexpected};
use super::{PostgresBackend, micros_ceil};
use crate::builder::PostgresBuilder;

/// Rows per table deleted by one sweep statement.
const BATCH: i32 = 1000;
/// Statements per background sweep (so at most 10,000 rows per table).
const BACKGROUND_BATCHES: usize = 10;
/// Pooled connections unused this long are closed when the sweep runs.
const IDLE_CONNECTION: Duration = Duration::from_secs(60);

pub(super) struct Sweeper {
    every: Option<Duration>,
    grace_us: i64,
    abandon_us: i64,
    /// When the last background sweep started.
    last: Mutex<Option<Instant>>,
    running: AtomicBool,
}

impl Sweeper {
    pub(super) fn new(b: &PostgresBuilder) -> Sweeper {
        Sweeper {
            every: b.sweep_every,
            grace_us: micros_ceil(b.idle_grace),
            abandon_us: micros_ceil(b.barrier_abandon_after),
            last: Mutex::new(None),
            running: AtomicBool::new(false),
        }
    }

    /// Whether a background sweep is due now; if so, it is marked started.
    fn due(&self) -> bool {
        let Some(every) = self.every else {
            return false;
        };
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < every)
            || self.running.swap(true, Ordering::AcqRel)
        {
            return false;
        }
        *last = Some(now);
        true
    }
}

impl PostgresBackend {
    /// After a write: start a background sweep if one is due. Costs a
    /// mutex and a clock read otherwise.
    pub(super) fn after_write(&self) {
        if !self.sweeper.due() {
            return;
        }
        let Some(me) = self.me.upgrade() else {
            self.sweeper.running.store(false, Ordering::Release);
            return;
        };
        tokio::spawn(async move {
            me.pool
                .retain(|_, metrics| metrics.last_used() < IDLE_CONNECTION);
            if let Err(e) = me.sweep_batches(BACKGROUND_BATCHES).await {
                tracing::debug!(error = %e, "coord-postgres: background sweep failed");
            }
            me.sweeper.running.store(false, Ordering::Release);
        });
    }

    /// Delete the state of every name idle past its TTL or window plus the
    /// [grace](PostgresBuilder::idle_grace), and of barriers idle past the
    /// grace (no member) or [abandoned](PostgresBuilder::barrier_abandon_after),
    /// in statements of up to 1,000 rows per table, until one finds fewer.
    /// Returns the rows deleted. Safe beside any traffic: rows in use are
    /// skipped, and fencing tokens, election terms and barrier generations
    /// come from the sequence, so a name used again never repeats one.
    ///
    /// Clients run it by themselves in the background (see
    /// [`PostgresBuilder::sweep_every`]); call it to sweep on your own
    /// schedule.
    pub async fn sweep(&self) -> Result<u64> {
        self.sweep_batches(usize::MAX).await
    }

    async fn sweep_batches(&self, most: usize) -> Result<u64> {
        const OP: &str = "sweep";
        let mut total = 0;
        for _ in 0..most {
            let rows = self
                .query(
                    OP,
                    &self.sql.sweep,
                    &[
                        (&self.sweeper.grace_us, Type::INT8),
                        (&self.sweeper.abandon_us, Type::INT8),
                        (&BATCH, Type::INT4),
                    ],
                )
                .await?;
            let row = rows.first().ok_or_else(|| unexpected(OP))?;
            let n: i64 = row.try_get(0).map_err(|e| map_pg(OP, e))?;
            total += n.max(0) as u64;
            if n < i64::from(BATCH) {
                break;
            }
        }
        Ok(total)
    }
}
