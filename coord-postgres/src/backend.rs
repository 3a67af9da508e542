//! The backend object: a pool, the SQL texts, the wake-up registry and the
//! listener, implementing every coord-core trait.

use std::sync::Arc;
use std::time::Duration;

use coord_core::util::{bounded, redact_url_passwords};
use coord_core::wake::{Waiter, Wakeups};
use coord_core::{
    Algorithm, Arrival, Attempt, Barrier, Capabilities, Coord, Decision, Election, Error,
    FencingDurability, FencingSource, FencingToken, LeaderInfo, Lease, Limiter, Lock, OwnerToken,
    Quota, Result, async_trait,
};
use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::config::{
    DEFAULT_SCHEMA, MAX_SCHEMA_LEN, PostgresBuilder, identifier, parse_url, tls_connector,
};
use crate::listen::Listener;
use crate::sql::{SCHEMA_VERSION, Sql};

pub(crate) const BACKEND: &str = "postgres";

const KIND_LOCK: &str = "lock";
const KIND_LEASE: &str = "lease";
const KIND_ELECTION: &str = "election";

/// Map a tokio-postgres error: lost or refused connections are
/// [`Error::Unavailable`] (retryable), answers from the server are
/// [`Error::Store`] with the SQLSTATE. Passwords are removed from the text.
pub(crate) fn map_pg(operation: &'static str, e: tokio_postgres::Error) -> Error {
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        let message = redact_url_passwords(&format!("{} (SQLSTATE {code})", db.message()));
        // 08: connection exceptions; 57P: shutdown / cannot connect now;
        // 53300: too many connections; 40001/40P01: serialization/deadlock.
        if code.starts_with("08")
            || code.starts_with("57P")
            || code == "53300"
            || code == "40001"
            || code == "40P01"
        {
            return Error::Unavailable {
                backend: BACKEND,
                operation,
                message,
            };
        }
        return Error::Store {
            backend: BACKEND,
            operation,
            message,
        };
    }
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        let text = s.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = s.source();
    }
    let message = redact_url_passwords(&message);
    // A refused certificate, or a server without TLS when TLS is required,
    // fails the same way next time: configuration, not an outage.
    if message.contains("certificate") || message.contains("does not support TLS") {
        return Error::Store {
            backend: BACKEND,
            operation,
            message,
        };
    }
    Error::Unavailable {
        backend: BACKEND,
        operation,
        message,
    }
}

fn map_pool(operation: &'static str, e: PoolError) -> Error {
    match e {
        PoolError::Backend(e) => map_pg(operation, e),
        PoolError::Timeout(t) => Error::Unavailable {
            backend: BACKEND,
            operation,
            message: format!("no pooled connection in time ({t:?})"),
        },
        PoolError::Closed => Error::Unavailable {
            backend: BACKEND,
            operation,
            message: "the connection pool is closed".into(),
        },
        other => Error::Store {
            backend: BACKEND,
            operation,
            message: redact_url_passwords(&other.to_string()),
        },
    }
}

fn micros_ceil(d: Duration) -> i64 {
    i64::try_from(d.as_nanos().div_ceil(1000)).unwrap_or(i64::MAX)
}

fn from_micros(us: i64) -> Duration {
    Duration::from_micros(us.max(0) as u64)
}

fn token(v: i64) -> FencingToken {
    FencingToken(v.max(0) as u64)
}

/// The PostgreSQL backend: implements [`Lock`], [`Lease`],
/// [`FencingSource`], [`Election`], [`Barrier`] and [`Limiter`] on tables
/// of one schema. Build it with [`crate::builder`]`(url).connect_backend()`
/// or get a [`Coord`] directly with [`crate::connect`].
///
/// Dropping the last handle stops the listening task and closes the pool.
pub struct PostgresBackend {
    /// Statements are prepared once per pooled connection (direct
    /// connections only).
    prepared: bool,
    pool: Pool,
    caps: Capabilities,
    schema: String,
    channel: String,
    sql: Sql,
    call_timeout: Duration,
    wakeups: Wakeups,
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
        let parsed = parse_url(&b.url)?;
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
        let pool = Pool::builder(manager)
            .max_size(b.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(b.call_timeout))
            .create_timeout(Some(b.connect_timeout))
            .build()
            .map_err(|e| Error::Config(format!("cannot build the connection pool: {e}")))?;
        let sql = Sql::new(&schema);
        let channel = format!("{schema}_wake");

        // First use: create the layout unless it is there already.
        ensure_schema(&pool, &sql, b.connect_timeout + b.call_timeout)
            .await
            .map_err(|e| with_target(e, &parsed.display))?;

        let wakeups = Wakeups::new();
        let mut notifications = false;
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
            };
            let (tx, rx) = tokio::sync::oneshot::channel();
            tokio::spawn(listener.start(pool.clone(), tx));
            match rx.await {
                Ok(Ok(true)) => {
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
        // Named statements only where nothing in between can route the next
        // call to another server connection (see `prepared_statements`).
        let prepared = b
            .prepared
            .unwrap_or(notifications && b.listen_url.is_none());
        Ok(Arc::new(PostgresBackend {
            prepared,
            pool,
            caps,
            schema,
            channel,
            sql,
            call_timeout: b.call_timeout,
            wakeups,
            _listener: guard,
        }))
    }

    /// A [`Coord`] over this backend (every primitive).
    pub fn coord(self: &Arc<Self>) -> Coord {
        Coord::from_backend(self.clone())
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
    /// rely on session state if you run behind PgBouncer.
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

    async fn query(
        &self,
        operation: &'static str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>> {
        bounded(BACKEND, operation, self.call_timeout, async {
            let client = self.pool.get().await.map_err(|e| map_pool(operation, e))?;
            if self.prepared {
                let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
                let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
                let stmt = client
                    .prepare_typed_cached(sql, &types)
                    .await
                    .map_err(|e| map_pg(operation, e))?;
                client
                    .query(&stmt, &values)
                    .await
                    .map_err(|e| map_pg(operation, e))
            } else {
                client
                    .query_typed(sql, params)
                    .await
                    .map_err(|e| map_pg(operation, e))
            }
        })
        .await
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

    /// One attempt on a claim. `notify`: send a NOTIFY when this starts a
    /// new grant (elections: observers learn of the new term).
    async fn claim_acquire(
        &self,
        operation: &'static str,
        (kind, notify): (&'static str, bool),
        name: &str,
        owner: &OwnerToken,
        candidate: Option<&str>,
        ttl: Duration,
    ) -> Result<Attempt> {
        let owner: &[u8] = owner.as_bytes();
        let ttl = micros_ceil(ttl);
        let kind = kind.to_string();
        let name = name.to_string();
        let candidate = candidate.map(str::to_string);
        let rows = self
            .query(
                operation,
                &self.sql.claim_acquire,
                &[
                    (&kind, Type::TEXT),
                    (&name, Type::TEXT),
                    (&owner, Type::BYTEA),
                    (&candidate, Type::TEXT),
                    (&ttl, Type::INT8),
                    (&self.channel, Type::TEXT),
                    (&notify, Type::BOOL),
                ],
            )
            .await?;
        let row = rows.first().ok_or_else(|| unexpected(operation))?;
        let granted: Option<i64> = row.try_get(0).map_err(|e| map_pg(operation, e))?;
        if let Some(f) = granted {
            return Ok(Attempt::Granted(token(f)));
        }
        let held: Option<i64> = row.try_get(1).map_err(|e| map_pg(operation, e))?;
        // `held` is the holder's remaining time as of this statement's
        // snapshot. When the row looked free (or expired) there, another
        // client took it concurrently: retry at once, and the next attempt
        // sees that holder and its exact remaining time.
        Ok(Attempt::Held {
            expires_in: Some(
                held.map(from_micros)
                    .unwrap_or(Duration::ZERO)
                    .max(Duration::from_millis(1)),
            ),
        })
    }

    async fn claim_release(
        &self,
        operation: &'static str,
        kind: &'static str,
        name: &str,
        owner: &OwnerToken,
        notify: bool,
    ) -> Result<bool> {
        let owner: &[u8] = owner.as_bytes();
        let kind = kind.to_string();
        let name = name.to_string();
        let rows = self
            .query(
                operation,
                &self.sql.claim_release,
                &[
                    (&kind, Type::TEXT),
                    (&name, Type::TEXT),
                    (&owner, Type::BYTEA),
                    (&self.channel, Type::TEXT),
                    (&notify, Type::BOOL),
                ],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    async fn claim_extend(
        &self,
        operation: &'static str,
        kind: &'static str,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<bool> {
        let owner: &[u8] = owner.as_bytes();
        let ttl = micros_ceil(ttl);
        let kind = kind.to_string();
        let name = name.to_string();
        let rows = self
            .query(
                operation,
                &self.sql.claim_extend,
                &[
                    (&kind, Type::TEXT),
                    (&name, Type::TEXT),
                    (&owner, Type::BYTEA),
                    (&ttl, Type::INT8),
                ],
            )
            .await?;
        Ok(!rows.is_empty())
    }
}

fn unexpected(operation: &'static str) -> Error {
    Error::Store {
        backend: BACKEND,
        operation,
        message: "the statement returned no row".into(),
    }
}

fn with_target(e: Error, display: &str) -> Error {
    match e {
        Error::Unavailable {
            backend,
            operation,
            message,
        } => Error::Unavailable {
            backend,
            operation,
            message: format!("{message} (connecting to {display})"),
        },
        Error::Store {
            backend,
            operation,
            message,
        } => Error::Store {
            backend,
            operation,
            message: format!("{message} (connecting to {display})"),
        },
        other => other,
    }
}

/// Create the schema, tables and functions on first use. A quick version
/// check first, so a client without CREATE rights works on a prepared
/// database; the DDL itself runs in one implicit transaction holding a
/// transaction-scoped advisory lock, so concurrent first users serialize
/// instead of failing on the `CREATE ... IF NOT EXISTS` race.
async fn ensure_schema(pool: &Pool, sql: &Sql, limit: Duration) -> Result<()> {
    const OP: &str = "connect";
    bounded(BACKEND, OP, limit, async {
        let client = pool.get().await.map_err(|e| map_pool(OP, e))?;
        match client.query_typed(&sql.check_version, &[]).await {
            Ok(rows) => {
                let v: Option<i32> = rows.first().and_then(|r| r.try_get(0).ok());
                if v.is_some_and(|v| v >= SCHEMA_VERSION) {
                    return Ok(());
                }
            }
            Err(e) if e.as_db_error().is_some() => {}
            Err(e) => return Err(map_pg(OP, e)),
        }
        client
            .batch_execute(&sql.ddl)
            .await
            .map_err(|e| map_pg(OP, e))
    })
    .await
}

#[async_trait]
impl Lock for PostgresBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn try_acquire(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<Attempt> {
        self.claim_acquire("lock acquire", (KIND_LOCK, false), name, owner, None, ttl)
            .await
    }

    async fn release(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        self.claim_release("lock release", KIND_LOCK, name, owner, true)
            .await
    }

    async fn extend(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        self.claim_extend("lock extend", KIND_LOCK, name, owner, ttl)
            .await
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        let kind = KIND_LOCK.to_string();
        let name = name.to_string();
        let notify = true;
        let rows = self
            .query(
                "lock force release",
                &self.sql.claim_force_release,
                &[
                    (&kind, Type::TEXT),
                    (&name, Type::TEXT),
                    (&self.channel, Type::TEXT),
                    (&notify, Type::BOOL),
                ],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    async fn subscribe(&self, name: &str) -> Result<Waiter> {
        Ok(self.waiter(KIND_LOCK, name))
    }
}

#[async_trait]
impl Lease for PostgresBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn grant(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<Attempt> {
        self.claim_acquire("lease grant", (KIND_LEASE, false), name, owner, None, ttl)
            .await
    }

    async fn renew(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        self.claim_extend("lease renew", KIND_LEASE, name, owner, ttl)
            .await
    }

    async fn revoke(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        self.claim_release("lease revoke", KIND_LEASE, name, owner, false)
            .await
    }

    async fn remaining(&self, name: &str) -> Result<Option<Duration>> {
        let kind = KIND_LEASE.to_string();
        let name = name.to_string();
        let rows = self
            .query(
                "lease remaining",
                &self.sql.claim_remaining,
                &[(&kind, Type::TEXT), (&name, Type::TEXT)],
            )
            .await?;
        match rows.first() {
            None => Ok(None),
            Some(r) => {
                let us: i64 = r.try_get(0).map_err(|e| map_pg("lease remaining", e))?;
                Ok(Some(from_micros(us)))
            }
        }
    }
}

#[async_trait]
impl FencingSource for PostgresBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn next(&self, _resource: &str) -> Result<FencingToken> {
        // One durable counter per schema serves every resource: strictly
        // increasing per resource because it is strictly increasing overall.
        let rows = self
            .query("fencing next", &self.sql.fencing_next, &[])
            .await?;
        let row = rows.first().ok_or_else(|| unexpected("fencing next"))?;
        let v: i64 = row.try_get(0).map_err(|e| map_pg("fencing next", e))?;
        Ok(token(v))
    }
}

#[async_trait]
impl Election for PostgresBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn try_campaign(
        &self,
        name: &str,
        candidate: &str,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Attempt> {
        self.claim_acquire(
            "election campaign",
            (KIND_ELECTION, true),
            name,
            owner,
            Some(candidate),
            ttl,
        )
        .await
    }

    async fn renew(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        self.claim_extend("election renew", KIND_ELECTION, name, owner, ttl)
            .await
    }

    async fn resign(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        self.claim_release("election resign", KIND_ELECTION, name, owner, true)
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

    async fn subscribe(&self, name: &str) -> Result<Waiter> {
        Ok(self.waiter(KIND_ELECTION, name))
    }
}

#[async_trait]
impl Barrier for PostgresBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn arrive(&self, name: &str, parties: u32, participant: &str) -> Result<Arrival> {
        const OP: &str = "barrier arrive";
        let n = name.to_string();
        let p = participant.to_string();
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
                ],
            )
            .await?;
        let row = rows.first().ok_or_else(|| unexpected(OP))?;
        let generation: i64 = row.try_get(0).map_err(|e| map_pg(OP, e))?;
        let complete: bool = row.try_get(1).map_err(|e| map_pg(OP, e))?;
        let started_with: i32 = row.try_get(2).map_err(|e| map_pg(OP, e))?;
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
        match rows.first() {
            None => Ok(false),
            Some(r) => r.try_get(0).map_err(|e| map_pg(OP, e)),
        }
    }

    async fn withdraw(&self, name: &str, generation: u64, participant: &str) -> Result<bool> {
        const OP: &str = "barrier withdraw";
        let n = name.to_string();
        let g = generation as i64;
        let p = participant.to_string();
        let rows = self
            .query(
                OP,
                &self.sql.barrier_withdraw,
                &[(&n, Type::TEXT), (&g, Type::INT8), (&p, Type::TEXT)],
            )
            .await?;
        let row = rows.first().ok_or_else(|| unexpected(OP))?;
        row.try_get(0).map_err(|e| map_pg(OP, e))
    }

    async fn subscribe(&self, name: &str) -> Result<Waiter> {
        Ok(self.waiter("barrier", name))
    }
}

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
                });
            }
        }
        .to_string();
        let key = key.to_string();
        let limit = i64::try_from(quota.limit).unwrap_or(i64::MAX);
        let window = micros_ceil(quota.window).max(1);
        let cost = i64::try_from(cost).unwrap_or(i64::MAX);
        let rows = self
            .query(
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
            .await?;
        let row = rows.first().ok_or_else(|| unexpected(OP))?;
        let allowed: bool = row.try_get(0).map_err(|e| map_pg(OP, e))?;
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
