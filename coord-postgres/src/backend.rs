//! The backend object: a pool, the SQL texts, the wake-up registry and the
//! listener. The coord-core traits are implemented in the submodules, one
//! per concern.

mod barrier;
mod call;
mod claims;
mod election;
pub(crate) mod errors;
mod health;
mod limiter;
mod list;
mod listen;
mod queue;
mod semaphore;
mod sweep;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use coord_core::util::bounded;
use coord_core::wake::{Waiter, Wakeups};
use coord_core::{Capabilities, Coord, Deployment, Error, FencingDurability, FencingToken, Result};
use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio::sync::Notify;
use tokio_postgres_rustls::MakeRustlsConnect;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::builder::{DEFAULT_POOL_SIZE, PostgresBuilder};
use crate::config::{DEFAULT_SCHEMA, MAX_SCHEMA_LEN, identifier, parse_url, tls_connector};
use crate::sql::{SCHEMA_VERSION, Sql};
pub use claims::CLAIM_LEFT_TTL;
pub(crate) use errors::map_pg;
use errors::{map_pool, with_target};
use listen::Listener;
pub use semaphore::{SEMAPHORE_LEFT_TTL, SEMAPHORE_QUEUE_REFRESH, SEMAPHORE_QUEUE_TTL};

pub(crate) const BACKEND: &str = "postgres";

fn micros_ceil(d: Duration) -> i64 {
    i64::try_from(d.as_nanos().div_ceil(1000)).unwrap_or(i64::MAX)
}

fn from_micros(us: i64) -> Duration {
    Duration::from_micros(us.max(0) as u64)
}

fn token(v: i64) -> FencingToken {
    FencingToken(v.max(0) as u64)
}

/// The PostgreSQL backend: implements [`Lock`](coord_core::Lock),
/// [`Lease`](coord_core::Lease), [`FencingSource`](coord_core::FencingSource),
/// [`Election`](coord_core::Election), [`Barrier`](coord_core::Barrier),
/// [`Limiter`](coord_core::Limiter), [`Semaphore`](coord_core::Semaphore)
/// (FIFO) and [`Queue`](coord_core::Queue) (work queues) on tables
/// of one schema. Build it with [`crate::builder`]`(url).connect_backend()`
/// or get a [`Coord`] directly with [`crate::connect`].
///
/// Dropping the last handle stops the listening task and closes the pool.
pub struct PostgresBackend {
    /// Statements are prepared once per pooled connection, and the
    /// settings of every statement are the session's (direct connections
    /// only): each call is one statement, no BEGIN / COMMIT.
    prepared: bool,
    /// This backend, for the background sweep it starts.
    me: Weak<PostgresBackend>,
    sweeper: sweep::Sweeper,
    pool: Pool,
    caps: Capabilities,
    schema: String,
    channel: String,
    sql: Sql,
    call_timeout: Duration,
    connect_timeout: Duration,
    /// `BEGIN` and the settings of every statement's transaction (when not
    /// `prepared`).
    begin: String,
    /// For cancel requests.
    tls: MakeRustlsConnect,
    wakeups: Wakeups,
    /// Tells the listener to check its connection now (a call timed out).
    check_listener: Arc<Notify>,
    _listener: Option<DropGuard>,
}

impl std::fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("schema", &self.schema)
            .field("notifications", &self.caps.notifications)
            .field("prepared_statements", &self.prepared)
            .field("call_timeout", &self.call_timeout)
            .finish_non_exhaustive()
    }
}

impl PostgresBackend {
    pub(crate) async fn open(b: PostgresBuilder) -> Result<Arc<PostgresBackend>> {
        let parsed = b.target.parse()?;
        let schema = b
            .schema
            .clone()
            .or(parsed.schema.clone())
            .unwrap_or_else(|| DEFAULT_SCHEMA.to_string());
        identifier("schema", &schema, MAX_SCHEMA_LEN)?;
        let listen = b.listen.or(parsed.listen).unwrap_or(true);
        let mut pg = parsed.pg.clone();
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(b.connect_timeout);
        }
        pg.keepalives(true).keepalives_idle(Duration::from_secs(30));
        let tls = tls_connector(parsed.tls, parsed.root_cert.as_ref())?;
        let manager = Manager::from_config(
            pg.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        // Session settings for every new connection, once statements are
        // known to go to one server session each (`prepared`).
        let session_settings = Arc::new(AtomicBool::new(false));
        let setup = call::session_text(b.call_timeout);
        let hook_on = session_settings.clone();
        let pool = Pool::builder(manager)
            .max_size(
                b.pool_size
                    .or(parsed.pool_size)
                    .unwrap_or(DEFAULT_POOL_SIZE),
            )
            .post_create(Hook::async_fn(move |client, _| {
                let (on, setup) = (hook_on.load(Ordering::Acquire), setup.clone());
                Box::pin(async move {
                    if on {
                        client
                            .batch_execute(&setup)
                            .await
                            .map_err(HookError::Backend)?;
                    }
                    Ok(())
                })
            }))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(b.call_timeout))
            .create_timeout(Some(b.connect_timeout))
            .build()
            .map_err(|e| Error::Config(format!("cannot build the connection pool: {e}")))?;
        let sql = Sql::new(&schema);
        let channel = format!("{schema}_wake");

        // First use: create the layout unless it is there already.
        ensure_schema(&pool, &sql, &schema, b.connect_timeout + b.call_timeout)
            .await
            .map_err(|e| with_target(e, &parsed.display))?;

        let wakeups = Wakeups::new();
        let check_listener = Arc::new(Notify::new());
        let mut notifications = false;
        // Whether the LISTEN connection proved it receives notifications.
        let mut probed = false;
        let mut guard = None;
        if listen {
            let (listen_pg, listen_tls) = match &b.listen_url {
                Some(u) => {
                    let p = parse_url(u)?;
                    let mut c = p.pg.clone();
                    if c.get_connect_timeout().is_none() {
                        c.connect_timeout(b.connect_timeout);
                    }
                    c.keepalives(true).keepalives_idle(Duration::from_secs(30));
                    (c, tls_connector(p.tls, p.root_cert.as_ref())?)
                }
                None => (pg.clone(), tls.clone()),
            };
            let cancel = CancellationToken::new();
            let listener = Listener {
                pg: listen_pg,
                tls: listen_tls,
                channel: channel.clone(),
                wakeups: wakeups.clone(),
                cancel: cancel.clone(),
                connect_timeout: b.connect_timeout,
                check_now: check_listener.clone(),
            };
            let (tx, rx) = tokio::sync::oneshot::channel();
            tokio::spawn(listener.start(pool.clone(), tx));
            match rx.await {
                Ok(Ok(true)) => {
                    notifications = true;
                    probed = true;
                    guard = Some(cancel.drop_guard());
                }
                // The listener keeps trying in the background (it wakes
                // every waiter once it is in); until then waiters poll.
                Ok(Err(e)) if e.is_retryable() => {
                    tracing::warn!(
                        error = %e,
                        "coord-postgres: cannot LISTEN yet; retrying in the background, \
                         waiters poll until then"
                    );
                    notifications = true;
                    guard = Some(cancel.drop_guard());
                }
                Ok(Ok(false)) => tracing::warn!(
                    "coord-postgres: the LISTEN connection receives no notifications \
                     (PgBouncer in transaction mode?); waiters will poll. Give a direct \
                     URL with listen_url to get wake-ups"
                ),
                Ok(Err(e)) => tracing::warn!(
                    error = %e,
                    "coord-postgres: cannot LISTEN; waiters will poll"
                ),
                Err(_) => {}
            }
        }

        let mut caps = Capabilities::new(BACKEND);
        caps.min_ttl = Duration::from_millis(1);
        caps.ttl_granularity = Duration::from_millis(1);
        caps.fair = false;
        caps.fencing = FencingDurability::Durable;
        caps.server_clock = true;
        caps.notifications = notifications;
        // Several hosts: a primary and its standbys, followed through a
        // failover (see docs/postgres.md, "Failover"). Streaming replication
        // acknowledges a grant before a standby has it unless it is
        // synchronous and only a synchronous standby is promoted, which
        // coord cannot check: not promised.
        caps.deployment = if parsed.pg.get_hosts().len() > 1 {
            Deployment::PrimaryStandby
        } else {
            Deployment::Single
        };
        caps.exclusive_across_failover = false;
        // Named statements only where nothing in between can route the next
        // call to another server connection (see `prepared_statements`).
        let prepared = b.prepared.unwrap_or(probed && b.listen_url.is_none());
        if prepared {
            session_settings.store(true, Ordering::Release);
            // The connections opened so far lack the session settings.
            pool.retain(|_, _| false);
        }
        Ok(Arc::new_cyclic(|me| PostgresBackend {
            prepared,
            me: me.clone(),
            sweeper: sweep::Sweeper::new(&b),
            pool,
            caps,
            schema,
            channel,
            sql,
            call_timeout: b.call_timeout,
            connect_timeout: b.connect_timeout,
            begin: call::begin_text(b.call_timeout),
            tls,
            wakeups,
            check_listener,
            _listener: guard,
        }))
    }

    /// A [`Coord`] over this backend (every primitive, semaphores and work
    /// queues included).
    pub fn coord(self: &Arc<Self>) -> Coord {
        Coord::from_backend(self.clone())
            .with_semaphores(self.clone())
            .with_lister(self.clone())
            .with_queues(self.clone())
    }

    /// The schema holding coord's tables.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The NOTIFY channel of this schema (`<schema>_wake`).
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// The statement pool, for your own queries (for example with
    /// [`FencedTable`](crate::FencedTable)). Statements through it must not
    /// rely on session state if you run behind PgBouncer, and must not
    /// change `default_transaction_isolation` (coord's steps refuse to run
    /// at another level than read committed; see docs/postgres.md,
    /// "Transaction isolation"). Its connections carry coord's session
    /// settings (docs/postgres.md), among them `enable_seqscan = off` and
    /// `plan_cache_mode = force_generic_plan`: a query of yours that should
    /// read a whole table can `SET LOCAL enable_seqscan = on` in its
    /// transaction.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// What this backend promises.
    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// Whether statements are prepared once per pooled connection (see
    /// [`PostgresBuilder::prepared_statements`](crate::PostgresBuilder::prepared_statements)).
    pub fn prepared_statements(&self) -> bool {
        self.prepared
    }

    fn key(kind: &str, name: &str) -> String {
        format!("{kind}:{name}")
    }

    fn waiter(&self, kind: &str, name: &str) -> Waiter {
        if self.caps.notifications {
            self.wakeups.subscribe(&Self::key(kind, name))
        } else {
            Waiter::never()
        }
    }
}

/// Create the schema, tables and functions on first use. A quick version
/// check first, so a client without CREATE rights works on a prepared
/// database; the DDL itself runs in one implicit transaction holding a
/// transaction-scoped advisory lock, so concurrent first users serialize
/// instead of failing on the `CREATE ... IF NOT EXISTS` race.
///
/// One layout version: a schema holding another (an older or a newer
/// client's) is refused with [`Error::Config`] saying what to do, and
/// nothing is changed in it.
async fn ensure_schema(pool: &Pool, sql: &Sql, schema: &str, limit: Duration) -> Result<()> {
    const OP: &str = "connect";
    bounded(BACKEND, OP, limit, async {
        let client = pool.get().await.map_err(|e| map_pool(OP, e))?;
        let mut attempts = 0;
        loop {
            match client.query_typed(&sql.check_version, &[]).await {
                Ok(rows) => {
                    let v: Option<i32> = rows.first().and_then(|r| r.try_get(0).ok());
                    match v {
                        Some(SCHEMA_VERSION) => return Ok(()),
                        Some(other) => return Err(other_layout(schema, &other.to_string())),
                        None => {}
                    }
                }
                Err(e) if e.as_db_error().is_some() => {}
                Err(e) => return Err(map_pg(OP, e)),
            }
            // The server gives up when we do (each statement of the batch,
            // the advisory lock wait included, is bounded). Read committed
            // whatever the session's default: the batch writes `meta` after
            // waiting for the advisory lock, and an older snapshot would not
            // see the row a concurrent first user wrote meanwhile (a
            // serialization failure). Set before any statement takes a
            // snapshot.
            let ms = limit.as_millis().clamp(1, i32::MAX as u128);
            attempts += 1;
            match client
                .batch_execute(&format!(
                    "SET LOCAL statement_timeout = {ms};\n\
                     SET LOCAL lock_timeout = 0;\n\
                     SET TRANSACTION ISOLATION LEVEL READ COMMITTED;\n{}",
                    sql.ddl
                ))
                .await
            {
                Ok(()) => return Ok(()),
                // Another first user created the current schema while we
                // waited for the lock: nothing to do.
                Err(e) if schema_current(&e) => return Ok(()),
                // Another client's layout is there (created meanwhile).
                Err(e) if schema_other(&e).is_some() => {
                    let v = schema_other(&e).unwrap_or_default();
                    return Err(other_layout(schema, &v));
                }
                // Waiting for the advisory lock does not refresh the
                // server session's catalog caches: a session that looked
                // the schema up (and cached its absence) before another
                // first user created it, as a PgBouncer server connection
                // that served another client's version check may have,
                // can miss what was created and fail on creating it again.
                // Its next transaction sees it: check again.
                Err(e) if attempts < 3 && duplicate(&e) => {}
                // Clients already past their setup use the tables while a
                // late first user's DDL (run after its version check raced
                // the schema's creation) locks them: the server may break
                // such a cycle by aborting the DDL (seen in CI: two `coord`
                // processes connecting at once to a fresh database). The
                // schema is there by then: check again.
                Err(e) if attempts < 3 && deadlock(&e) => {}
                Err(e) => return Err(map_pg(OP, e)),
            }
        }
    })
    .await
}

/// The layout's DDL stopped because the schema is current (see
/// [`crate::sql::SCHEMA_CURRENT`]).
fn schema_current(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| db.code().code() == crate::sql::SCHEMA_CURRENT)
}

/// The layout version another client's schema holds, if the layout's
/// DDL stopped on it (see [`crate::sql::SCHEMA_OTHER`]).
fn schema_other(e: &tokio_postgres::Error) -> Option<String> {
    e.as_db_error()
        .filter(|db| db.code().code() == crate::sql::SCHEMA_OTHER)
        .map(|db| db.message().to_string())
}

/// The error for a schema that holds layout `version`, not this client's.
fn other_layout(schema: &str, version: &str) -> Error {
    Error::Config(format!(
        "the schema \"{schema}\" holds coord's PostgreSQL layout {version}; this client \
         uses layout {SCHEMA_VERSION}, and layouts are not migrated before the first \
         release: give this client another schema (?schema=), or drop that one (DROP \
         SCHEMA \"{schema}\" CASCADE: coord's locks, queues and tokens in it are lost)"
    ))
}

/// The server aborted the transaction to break a deadlock (`40P01`).
fn deadlock(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| db.code().code() == "40P01")
}

/// An error of creating what exists: a unique violation (on the catalogs)
/// or a duplicate schema, table, object or function.
fn duplicate(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        matches!(
            db.code().code(),
            "23505" | "42P06" | "42P07" | "42710" | "42723"
        )
    })
}

/// What an extend statement (`claim_extend`, `semaphore_extend`) answered:
/// no row when the owner holds nothing there, else whether it was a late
/// copy overtaken by a later step of its owner (refused, nothing changed:
/// [`coord_core::late::superseded`]) and whether it extended.
fn extend_answer(operation: &'static str, rows: &[tokio_postgres::Row]) -> Result<bool> {
    let Some(row) = rows.first() else {
        return Ok(false);
    };
    let get = |i: usize| -> Result<bool> { row.try_get(i).map_err(|e| map_pg(operation, e)) };
    if get(0)? {
        return Err(coord_core::late::superseded(BACKEND, operation));
    }
    get(1)
}
