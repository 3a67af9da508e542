//! The `sqlx` feature: fenced writes inside your own sqlx transaction (or
//! on any [`PgExecutor`]), and a backend whose connection settings come
//! from a sqlx [`PgPool`] or [`PgConnectOptions`].

use std::fmt;
use std::path::{Path, PathBuf};

use coord_core::{Error, FencingToken, Result};
use sqlx::postgres::{PgArguments, PgConnectOptions, PgExecutor, PgPool, PgSslMode};
use sqlx::{Arguments, ConnectOptions, Encode, Postgres, Row, Type};

use crate::backend::BACKEND;
use crate::backend::errors::{chain_message, map_sqlstate};
use crate::builder::{PostgresBuilder, Target};
use crate::config::{ParsedUrl, TlsMode};
use crate::fenced::{FencedTable, FencedWrite};

impl FencedTable {
    /// A fenced update of the row with `key`, to run on a sqlx executor:
    /// the same statement, semantics and outcomes as
    /// [`update`](Self::update) (applied iff `token` >= the row's stored
    /// token, check and write in one statement). Add the columns with
    /// [`SqlxFencedWrite::set`], run it with [`SqlxFencedWrite::execute`].
    ///
    /// `key` is bound like any sqlx parameter
    /// ([`Query::bind`](sqlx::query::Query::bind)): any value that is
    /// `Encode + Type<Postgres>`.
    ///
    /// ```no_run
    /// # async fn demo(pool: coord_postgres::sqlx::PgPool, token: coord_core::FencingToken) -> Result<(), Box<dyn std::error::Error>> {
    /// use coord_postgres::{FencedTable, FencedWrite};
    /// let table = FencedTable::new("inventory", "product_id", "fencing_token")?;
    /// let mut tx = pool.begin().await?;
    /// // ... your own statements in the same transaction ...
    /// let outcome = table
    ///     .sqlx_update("sku-1", token)
    ///     .set("stock", 41_i64)
    ///     .set("note", Some("restocked"))
    ///     .execute(&mut *tx)
    ///     .await?;
    /// match outcome {
    ///     FencedWrite::Applied => tx.commit().await?,
    ///     // A newer holder wrote first (our lock expired), or no such row:
    ///     // undo the rest of the transaction too.
    ///     FencedWrite::Stale | FencedWrite::Missing => tx.rollback().await?,
    /// }
    /// # Ok(()) }
    /// ```
    pub fn sqlx_update<'k, K>(&self, key: K, token: FencingToken) -> SqlxFencedWrite<'_>
    where
        K: 'k + Encode<'k, Postgres> + Type<Postgres>,
    {
        SqlxFencedWrite::new(self, Kind::Update, key, token)
    }

    /// A fenced upsert of the row with `key`, to run on a sqlx executor:
    /// the same statement, semantics and outcomes as
    /// [`upsert`](Self::upsert) (inserted, or updated iff `token` >= the
    /// row's stored token; never [`FencedWrite::Missing`]). Used like
    /// [`sqlx_update`](Self::sqlx_update).
    pub fn sqlx_upsert<'k, K>(&self, key: K, token: FencingToken) -> SqlxFencedWrite<'_>
    where
        K: 'k + Encode<'k, Postgres> + Type<Postgres>,
    {
        SqlxFencedWrite::new(self, Kind::Upsert, key, token)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Update,
    Upsert,
}

/// A fenced write being put together for sqlx: made by
/// [`FencedTable::sqlx_update`] or [`FencedTable::sqlx_upsert`], given its
/// columns with [`set`](Self::set), run with [`execute`](Self::execute).
///
/// Values are encoded by sqlx as they are set (so they may be borrowed
/// for the duration of the call only) and sent with their sqlx types; the
/// statement text is [`FencedTable`]'s, shared with the tokio-postgres
/// path.
#[must_use = "a fenced write does nothing until it is `execute`d"]
pub struct SqlxFencedWrite<'t> {
    table: &'t FencedTable,
    kind: Kind,
    columns: Vec<String>,
    /// `$1` the key, `$2` the token, `$3..` the columns in order.
    args: PgArguments,
    /// The first value that could not be encoded (or a token out of
    /// range); returned by `execute` before any I/O.
    error: Option<Error>,
}

impl fmt::Debug for SqlxFencedWrite<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlxFencedWrite")
            .field("table", &self.table)
            .field("kind", &self.kind)
            .field("columns", &self.columns)
            .finish_non_exhaustive()
    }
}

impl<'t> SqlxFencedWrite<'t> {
    fn new<'k, K>(table: &'t FencedTable, kind: Kind, key: K, token: FencingToken) -> Self
    where
        K: 'k + Encode<'k, Postgres> + Type<Postgres>,
    {
        let mut w = SqlxFencedWrite {
            table,
            kind,
            columns: Vec::new(),
            args: PgArguments::default(),
            error: None,
        };
        w.bind("the key", key);
        match FencedTable::token(token) {
            Ok(t) => w.bind("the token", t),
            Err(e) => w.error = Some(e),
        }
        w
    }

    fn bind<'v, T>(&mut self, what: &str, value: T)
    where
        T: 'v + Encode<'v, Postgres> + Type<Postgres>,
    {
        if self.error.is_some() {
            return;
        }
        if let Err(e) = <PgArguments as Arguments<'v>>::add(&mut self.args, value) {
            self.error = Some(Error::invalid(
                "value",
                format!("cannot encode {what}: {e}"),
            ));
        }
    }

    /// Also set `column` to `value` (any value sqlx can bind: `Encode +
    /// Type<Postgres>`, `Option` for NULL). The column name is checked
    /// like [`FencedTable`]'s (ASCII letters, digits, `_`; not the key or
    /// token column) when the write is executed.
    pub fn set<'v, T>(mut self, column: &str, value: T) -> Self
    where
        T: 'v + Encode<'v, Postgres> + Type<Postgres>,
    {
        self.columns.push(column.to_owned());
        self.bind(&format!("the value of `{column}`"), value);
        self
    }

    /// Run the write as one statement on `executor`: `&mut *tx` for a
    /// [`sqlx::Transaction`] (the write then commits or rolls back with
    /// it), `&mut PgConnection`, or `&PgPool` (its own transaction).
    ///
    /// Errors: [`Error::InvalidArgument`] (a bad column name, a value that
    /// cannot be encoded, a token above `i64::MAX`) before anything is
    /// sent; [`Error::Unavailable`] when the connection fails or the
    /// server reports a retryable condition (serialization failure,
    /// deadlock, shutdown; SQLSTATE in the message); [`Error::Store`] for
    /// other server errors (no such table or column, a type mismatch).
    /// Inside a transaction, any error leaves it for you to roll back.
    pub async fn execute<'e, E>(self, executor: E) -> Result<FencedWrite>
    where
        E: PgExecutor<'e>,
    {
        let SqlxFencedWrite {
            table,
            kind,
            columns,
            args,
            error,
        } = self;
        if let Some(e) = error {
            return Err(e);
        }
        let names: Vec<&str> = columns.iter().map(String::as_str).collect();
        match kind {
            Kind::Update => {
                let sql = table.update_sql(&names)?;
                let op = "fenced update";
                let row = sqlx::query_with(&sql, args)
                    .fetch_one(executor)
                    .await
                    .map_err(|e| map_sqlx(op, e))?;
                let applied: bool = row.try_get(0).map_err(|e| map_sqlx(op, e))?;
                let exists: bool = row.try_get(1).map_err(|e| map_sqlx(op, e))?;
                Ok(FencedTable::update_outcome(applied, exists))
            }
            Kind::Upsert => {
                let sql = table.upsert_sql(&names)?;
                let row = sqlx::query_with(&sql, args)
                    .fetch_optional(executor)
                    .await
                    .map_err(|e| map_sqlx("fenced upsert", e))?;
                Ok(FencedTable::upsert_outcome(row.is_some()))
            }
        }
    }
}

/// Map a sqlx error like a tokio-postgres one: server errors by SQLSTATE,
/// lost connections and pool timeouts are [`Error::Unavailable`].
fn map_sqlx(operation: &'static str, e: sqlx::Error) -> Error {
    let shown = chain_message(&e);
    let mapped = match &e {
        sqlx::Error::Database(db) => match db.code() {
            Some(code) => map_sqlstate(operation, &code, db.message()),
            None => Error::Store {
                backend: BACKEND,
                operation,
                message: shown.clone(),
                source: None,
            },
        },
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Error::Unavailable {
            backend: BACKEND,
            operation,
            message: shown.clone(),
            source: None,
        },
        _ => Error::Store {
            backend: BACKEND,
            operation,
            message: shown.clone(),
            source: None,
        },
    };
    mapped.with_source(coord_core::StoreSource::new(e, shown))
}

/// Start configuring a backend on the database of a sqlx pool: the
/// pool's current [`connect_options`](sqlx::Pool::connect_options), as
/// [`from_sqlx_options`] takes them.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// let pool = coord_postgres::sqlx::PgPool::connect("postgres://app:secret@db.internal/app").await?;
/// let coord = coord_postgres::from_sqlx_pool(&pool)?
///     .schema("coord_billing")
///     .pool_size(4)
///     .connect()
///     .await?;
/// let guard = coord
///     .locks()?
///     .acquire("invoice-7", Duration::from_secs(30), Duration::from_secs(5))
///     .await?;
/// let mut tx = pool.begin().await?;
/// // ... fenced writes with guard.fencing_token(), see FencedTable::sqlx_update ...
/// tx.commit().await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub fn from_sqlx_pool(pool: &PgPool) -> Result<PostgresBuilder> {
    from_sqlx_options(&pool.connect_options())
}

/// Start configuring a backend with the connection settings of sqlx
/// `options`. Nothing is connected yet: call
/// [`connect`](PostgresBuilder::connect) (other builder options may be
/// set first).
///
/// **Carried over**: host or unix-socket directory, port, user, password,
/// database, `sslmode`, `sslrootcert` (a file), `application_name`
/// (default `coord`) and `options` (`-c name=value` run-time settings).
///
/// **Not shared**: the connections. coord opens its own (a pool of up to
/// [`PostgresBuilder::pool_size`] connections, default 32, and one LISTEN
/// connection), so count them against `max_connections` besides the sqlx
/// pool's. The sqlx pool's size, timeouts, hooks (`after_connect`),
/// statement cache and logging do not apply to coord's connections;
/// coord's call and connect timeouts are the builder's. The settings are
/// a snapshot: later changes to the sqlx options do not reach coord.
///
/// Certificates are checked by coord as libpq does, which is stricter
/// than sqlx in two cases: `sslmode=require` with a `sslrootcert`
/// verifies the chain (as `verify-ca`), and `verify-ca` / `verify-full`
/// without a `sslrootcert` read `~/.postgresql/root.crt` instead of a
/// built-in trust store. `sslmode=allow` connects without TLS, as in sqlx.
///
/// Errors, before any I/O: [`Error::Config`] naming the setting that
/// cannot be carried over: a client certificate or key (`sslcert`,
/// `sslkey`: coord presents none), a `sslrootcert` given inline as PEM
/// text rather than a file, or a setting this version does not know.
pub fn from_sqlx_options(options: &PgConnectOptions) -> Result<PostgresBuilder> {
    Ok(PostgresBuilder::for_target(Target::Parsed(Box::new(
        settings(options)?,
    ))))
}

/// The connection settings of `o`, or the reason one cannot be carried
/// over.
fn settings(o: &PgConnectOptions) -> Result<ParsedUrl> {
    // sqlx has getters for most settings, but not for the password and
    // the certificates: those are read from its own URL form. Host and
    // user come from the getters (sqlx writes them into that URL
    // unescaped), so placeholders stand in for them there.
    let url = o.clone().host("localhost").username("coord").to_url_lossy();
    let mut root_cert = None;
    for (k, v) in url.query_pairs() {
        match &*k {
            // Read from the getter below.
            "sslmode" => {}
            // sqlx's own client-side cache of prepared statements; coord
            // decides its own (PostgresBuilder::prepared_statements).
            "statement-cache-capacity" => {}
            "sslrootcert" => match v.strip_prefix("file: ") {
                Some(path) => root_cert = Some(PathBuf::from(path)),
                None => {
                    return Err(Error::Config(
                        "the sqlx connect options give sslrootcert inline (PEM text); \
                         coord-postgres reads CA certificates from a file only: give \
                         PgConnectOptions::ssl_root_cert a path"
                            .into(),
                    ));
                }
            },
            "sslcert" | "sslkey" => {
                return Err(Error::Config(format!(
                    "the sqlx connect options set {k} (a TLS client certificate); \
                     coord-postgres presents no client certificates, so this setting \
                     cannot be carried over"
                )));
            }
            other => {
                return Err(Error::Config(format!(
                    "the sqlx connect options carry `{other}`, which coord-postgres \
                     does not know how to carry over"
                )));
            }
        }
    }
    let tls = match o.get_ssl_mode() {
        PgSslMode::Disable | PgSslMode::Allow => TlsMode::Disable,
        PgSslMode::Prefer => TlsMode::Prefer,
        PgSslMode::Require => TlsMode::Require,
        PgSslMode::VerifyCa => TlsMode::VerifyCa,
        PgSslMode::VerifyFull => TlsMode::VerifyFull,
    };
    let mut pg = tokio_postgres::Config::new();
    let host = match o.get_socket() {
        Some(dir) => {
            socket_dir(&mut pg, dir)?;
            dir.display().to_string()
        }
        None => {
            // sqlx keeps the brackets of an IPv6 address from its URL.
            let h = o.get_host();
            let h = h
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(h);
            pg.host(h);
            h.to_string()
        }
    };
    pg.port(o.get_port()).user(o.get_username());
    if let Some(password) = url.password() {
        pg.password(percent_decode(password));
    }
    if let Some(db) = o.get_database() {
        pg.dbname(db);
    }
    if let Some(options) = o.get_options() {
        pg.options(options);
    }
    pg.application_name(o.get_application_name().unwrap_or("coord"));
    let display = format!(
        "postgres://{}@{host}:{}/{} (from sqlx connect options)",
        o.get_username(),
        o.get_port(),
        o.get_database().unwrap_or(""),
    );
    Ok(ParsedUrl::settings(pg, tls, root_cert, display))
}

#[cfg(unix)]
fn socket_dir(pg: &mut tokio_postgres::Config, dir: &Path) -> Result<()> {
    pg.host_path(dir);
    Ok(())
}

#[cfg(not(unix))]
fn socket_dir(_: &mut tokio_postgres::Config, dir: &Path) -> Result<()> {
    Err(Error::Config(format!(
        "the sqlx connect options give a unix socket (`{}`), which this platform has not",
        dir.display()
    )))
}

/// `%XX` escapes to bytes (sqlx escapes every non-alphanumeric byte of the
/// password in its URL form).
fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests;
