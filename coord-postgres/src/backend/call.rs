//! Running one statement: inside a transaction that sets the server-side
//! `statement_timeout` to the call timeout and makes the commit durable,
//! bounded on the client, and cancelled on the server when the client
//! gives up.

use std::time::{Duration, Instant};

use coord_core::util::bounded;
use coord_core::{Error, Result};
use deadpool_postgres::Object;
use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use super::errors::{map_pg, map_pool, read_only_server};
use super::{BACKEND, PostgresBackend};

/// The text sent before every statement, in the same round trip.
///
/// - `ISOLATION LEVEL READ COMMITTED`: every step decides on rows read
///   after it took the name's lock, which only READ COMMITTED shows (each
///   statement of the step's function takes a fresh snapshot); at
///   REPEATABLE READ or SERIALIZABLE the snapshot predates the lock, and a
///   step that waited for it would decide on rows the previous holder has
///   since changed. Pinned here, per transaction, whatever the server's,
///   database's or role's `default_transaction_isolation`, so it holds
///   through PgBouncer in transaction mode as well (where no session
///   setting survives between transactions). Not a startup parameter
///   (`options=-c default_transaction_isolation=...`): PgBouncer refuses
///   unknown startup parameters, or drops them silently when its
///   `ignore_startup_parameters` lists them.
/// - `statement_timeout`: the server gives up when the client does, even
///   if the cancel request cannot reach it.
/// - `lock_timeout = 0`: a step waits for a name's lock as long as its
///   call may take; a database's or role's `lock_timeout` would otherwise
///   turn ordinary contention into an error long before the call timeout.
/// - `synchronous_commit`: grants (locks, leases, terms, barrier arrivals,
///   fencing tokens) are durable whatever the server's or the role's
///   default; `off` and `local` are raised to `on`, stronger settings
///   (`remote_write`, `remote_apply`) are kept. The limiter function lowers
///   it again, for its own transaction only.
/// - `enable_seqscan = off`: every statement of coord has an index that
///   fits it, and a plan is kept for the connection's life (see
///   [`session_text`]): one made while a table was empty (a queue that had
///   drained, then vacuumed) would otherwise read the whole table on every
///   call once it holds a backlog or dead rows. Where no index fits, the
///   sequential scan is still used.
pub(super) fn begin_text(call_timeout: Duration) -> String {
    let ms = call_timeout.as_millis().clamp(1, i32::MAX as u128);
    format!(
        "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL statement_timeout = {ms}; \
         SET LOCAL lock_timeout = 0; SET LOCAL enable_seqscan = off; \
         SELECT set_config('synchronous_commit', \
           CASE WHEN current_setting('synchronous_commit') IN ('off', 'local') THEN 'on' \
                ELSE current_setting('synchronous_commit') END, true)"
    )
}

/// The session settings of a connection in `prepared` mode, sent once
/// when it is opened: the same as [`begin_text`], for the session
/// (`default_transaction_isolation` for the isolation level: each
/// statement is its own implicit transaction), and
/// `plan_cache_mode = force_generic_plan`: every statement is a primary-key
/// lookup whatever its parameters, so it is planned once per connection,
/// not on every call (the planner would otherwise keep re-planning the
/// CTEs as custom plans); so `enable_seqscan = off` matters most here.
pub(super) fn session_text(call_timeout: Duration) -> String {
    let ms = call_timeout.as_millis().clamp(1, i32::MAX as u128);
    format!(
        "SET default_transaction_isolation = 'read committed'; \
         SET statement_timeout = {ms}; SET lock_timeout = 0; \
         SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off; \
         SELECT set_config('synchronous_commit', \
           CASE WHEN current_setting('synchronous_commit') IN ('off', 'local') THEN 'on' \
                ELSE current_setting('synchronous_commit') END, false)"
    )
}

/// Typed parameters of one statement.
pub(super) type Params<'a> = &'a [(&'a (dyn ToSql + Sync), Type)];

impl PostgresBackend {
    /// Run `sql` with `params` as one transaction, within the call
    /// timeout: on a `prepared` (direct) connection the statement alone,
    /// prepared once per connection, whose session carries the settings;
    /// otherwise BEGIN with the settings above, the statement and COMMIT,
    /// pipelined in one round trip. On a client timeout the connection is discarded and
    /// its statement cancelled on the server (in the background, bounded by
    /// the connect timeout), so nothing of the call keeps running there.
    pub(super) async fn query(
        &self,
        operation: &'static str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>> {
        Ok(self.query_then(operation, sql, params, None).await?.0)
    }

    /// A pooled connection, within the call timeout. The pool's `get` runs
    /// in a task of its own, for up to twice the call timeout: a connection
    /// being made when the call times out goes on to the pool, for the next
    /// call. Dropped with the call, on a link or server where connecting
    /// takes longer than the call timeout every call would start a connect
    /// of its own and none would ever be answered. (A connect slower than
    /// that bound is given up, so one stuck on a path that has since healed
    /// does not hold a place of the pool for long.)
    async fn connection(&self, operation: &'static str) -> Result<Object> {
        let (pool, limit) = (self.pool.clone(), 2 * self.call_timeout);
        let get = tokio::spawn(async move { tokio::time::timeout(limit, pool.get()).await });
        bounded(BACKEND, operation, self.call_timeout, async {
            match get.await {
                Ok(Ok(got)) => got.map_err(|e| map_pool(operation, e)),
                Ok(Err(_)) => Err(Error::Unavailable {
                    backend: BACKEND,
                    operation,
                    message: format!("no pooled connection within {limit:?}"),
                    source: None,
                }),
                Err(e) => Err(Error::Unavailable {
                    backend: BACKEND,
                    operation,
                    message: format!("getting a pooled connection failed: {e}"),
                    source: None,
                }),
            }
        })
        .await
    }

    /// Like [`query`](Self::query), followed in the same round trip by
    /// `then`, a second statement in a transaction of its own with the
    /// same settings (so its commit is durable). Semaphore grants commit
    /// asynchronously, so the name's lock is not held across the WAL
    /// flush; `then` makes the grant durable before the reply is used.
    /// Returns the rows of both statements (none for `then` when it is
    /// `None`); an error of either fails the call.
    pub(super) async fn query_then(
        &self,
        operation: &'static str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
        then: Option<(&str, Params<'_>)>,
    ) -> Result<(Vec<Row>, Vec<Row>)> {
        let started = Instant::now();
        let client = self.connection(operation).await.inspect_err(|e| {
            if e.is_retryable() {
                // No connection in time: the path to the server may be
                // dead for the listening connection too.
                self.check_listener.notify_one();
            }
        })?;
        let left = self.call_timeout.saturating_sub(started.elapsed());
        let run = async {
            if self.prepared {
                // One statement, its own transaction; the settings are the
                // session's (see `session_text`).
                let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
                let statement = client.prepare_typed_cached(sql, &types).await?;
                let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
                let Some((then_sql, then_params)) = then else {
                    return Ok((client.query(&statement, &values).await?, Vec::new()));
                };
                let types: Vec<Type> = then_params.iter().map(|(_, t)| t.clone()).collect();
                let then_statement = client.prepare_typed_cached(then_sql, &types).await?;
                let then_values: Vec<&(dyn ToSql + Sync)> =
                    then_params.iter().map(|(v, _)| *v).collect();
                let (rows, after) = futures::join!(
                    client.query(&statement, &values),
                    client.query(&then_statement, &then_values)
                );
                return Ok((rows?, after?));
            }
            if let Some((then_sql, then_params)) = then {
                let (begin, rows, commit, begin2, after, commit2) = futures::join!(
                    client.batch_execute(&self.begin),
                    client.query_typed(sql, params),
                    client.batch_execute("COMMIT"),
                    client.batch_execute(&self.begin),
                    client.query_typed(then_sql, then_params),
                    client.batch_execute("COMMIT")
                );
                begin?;
                let rows = rows?;
                commit?;
                begin2?;
                let after = after?;
                commit2?;
                return Ok((rows, after));
            }
            // Polled in this order, so sent back to back. After an error
            // in the statement, COMMIT ends the failed transaction as a
            // rollback.
            let (begin, rows, commit) = futures::join!(
                client.batch_execute(&self.begin),
                client.query_typed(sql, params),
                client.batch_execute("COMMIT")
            );
            begin?;
            let rows = rows?;
            commit?;
            Ok::<_, tokio_postgres::Error>((rows, Vec::new()))
        };
        match tokio::time::timeout(left, run).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => {
                if read_only_server(&e) {
                    // A standby, or a primary fenced read-only in a
                    // failover: never hand this connection out again (a
                    // new one goes to the writable server), and have the
                    // listening connection checked, which may be there too.
                    drop(Object::take(client));
                    self.check_listener.notify_one();
                }
                Err(map_pg(operation, e))
            }
            Err(_) => {
                // Its state is unknown: never hand this connection out again.
                let cancel = client.cancel_token();
                drop(Object::take(client));
                // The path to the server may be dead (half-open) for the
                // listening connection too: have it checked now.
                self.check_listener.notify_one();
                let tls = self.tls.clone();
                let limit = self.connect_timeout;
                tokio::spawn(async move {
                    match tokio::time::timeout(limit, cancel.cancel_query(tls)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "coord-postgres: cancel request failed")
                        }
                        Err(_) => tracing::debug!("coord-postgres: cancel request timed out"),
                    }
                });
                Err(Error::Unavailable {
                    backend: BACKEND,
                    operation,
                    message: format!(
                        "no answer within {:?}; the statement was cancelled on the server",
                        self.call_timeout
                    ),
                    source: None,
                })
            }
        }
    }
}
