//! The options of a connection: [`PostgresBuilder`].

use std::fmt;
use std::time::Duration;

use coord_core::Result;
use coord_core::util::{Secret, redact_url_passwords};

use crate::config::{ParsedUrl, parse_url};

/// Where a builder connects to.
#[derive(Clone)]
pub(crate) enum Target {
    /// A URL, parsed (and checked) at connect.
    Url(Secret),
    /// Settings taken from elsewhere (a sqlx `PgConnectOptions`), already
    /// checked.
    #[cfg(feature = "sqlx")]
    Parsed(Box<ParsedUrl>),
}

impl Target {
    pub(crate) fn parse(&self) -> Result<ParsedUrl> {
        match self {
            Target::Url(url) => parse_url(url),
            #[cfg(feature = "sqlx")]
            Target::Parsed(p) => Ok((**p).clone()),
        }
    }

    /// A printable form, without the password.
    fn display(&self) -> String {
        match self {
            Target::Url(url) => crate::config::display_url(url.expose()),
            #[cfg(feature = "sqlx")]
            Target::Parsed(p) => p.display.clone(),
        }
    }
}

/// Options of a PostgreSQL connection; build with [`crate::builder`].
///
/// `Debug` shows the URL with its password replaced by `<redacted>`.
#[derive(Clone)]
#[must_use]
pub struct PostgresBuilder {
    pub(crate) target: Target,
    pub(crate) listen_url: Option<Secret>,
    pub(crate) schema: Option<String>,
    pub(crate) call_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) pool_size: Option<usize>,
    pub(crate) listen: Option<bool>,
    pub(crate) prepared: Option<bool>,
    pub(crate) idle_grace: Duration,
    pub(crate) barrier_abandon_after: Duration,
    pub(crate) sweep_every: Option<Duration>,
}

/// The default of [`PostgresBuilder::pool_size`].
pub const DEFAULT_POOL_SIZE: usize = 32;
/// The default of [`PostgresBuilder::idle_grace`].
pub const DEFAULT_IDLE_GRACE: Duration = Duration::from_secs(60);
/// The default of [`PostgresBuilder::barrier_abandon_after`].
pub const DEFAULT_BARRIER_ABANDON: Duration = Duration::from_secs(24 * 3600);
/// The default of [`PostgresBuilder::sweep_every`].
pub const DEFAULT_SWEEP_EVERY: Duration = Duration::from_secs(10);

impl fmt::Debug for PostgresBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBuilder")
            .field("url", &self.target.display())
            .field(
                "listen_url",
                &self
                    .listen_url
                    .as_ref()
                    .map(|u| redact_url_passwords(u.expose())),
            )
            .field("schema", &self.schema)
            .field("call_timeout", &self.call_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("pool_size", &self.pool_size)
            .field("listen", &self.listen)
            .field("prepared_statements", &self.prepared)
            .field("idle_grace", &self.idle_grace)
            .field("barrier_abandon_after", &self.barrier_abandon_after)
            .field("sweep_every", &self.sweep_every)
            .finish()
    }
}

impl PostgresBuilder {
    /// Options of the URL's query override the defaults (and setters
    /// called afterwards override them); a malformed URL fails at connect.
    pub(crate) fn new(url: &str) -> Self {
        Self::for_target(Target::Url(Secret::new(url)))
    }

    /// [`new`](Self::new) for any target.
    pub(crate) fn for_target(target: Target) -> Self {
        let b = Self::defaults(target);
        match b.target.parse() {
            Ok(p) => PostgresBuilder {
                call_timeout: p.call_timeout.unwrap_or(b.call_timeout),
                idle_grace: p.idle_grace.unwrap_or(b.idle_grace),
                sweep_every: p.sweep_every.unwrap_or(b.sweep_every),
                barrier_abandon_after: p.barrier_abandon_after.unwrap_or(b.barrier_abandon_after),
                prepared: p.prepared.or(b.prepared),
                listen_url: p.listen_url.clone().or(b.listen_url.clone()),
                ..b
            },
            Err(_) => b,
        }
    }

    fn defaults(target: Target) -> Self {
        PostgresBuilder {
            target,
            listen_url: None,
            schema: None,
            call_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            pool_size: None,
            listen: None,
            prepared: None,
            idle_grace: DEFAULT_IDLE_GRACE,
            barrier_abandon_after: DEFAULT_BARRIER_ABANDON,
            sweep_every: Some(DEFAULT_SWEEP_EVERY),
        }
    }

    /// The schema holding coord's tables (default `coord`, or the URL's
    /// `coord_schema` parameter). It plays the role of the key prefix of
    /// other backends: two applications with different schemas never see
    /// each other's locks. ASCII letters, digits and `_`, at most 48 bytes;
    /// checked by `connect`.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// The time limit of every call, including waiting for a pooled
    /// connection (default 5 s). When it fires the call fails with
    /// [`Error::Unavailable`](coord_core::Error::Unavailable).
    pub fn call_timeout(mut self, limit: Duration) -> Self {
        self.call_timeout = limit;
        self
    }

    /// The time limit for opening one connection (default 5 s).
    pub fn connect_timeout(mut self, limit: Duration) -> Self {
        self.connect_timeout = limit;
        self
    }

    /// The most pooled connections for statements (default 32, or the
    /// URL's `coord_pool_size`; the listening connection is extra).
    /// Connections are opened on demand, as concurrent calls need them,
    /// and one left unused for a minute is closed (checked when the sweep
    /// runs), so an idle client holds few. When every connection is busy,
    /// calls wait for one in arrival order (FIFO) within their call
    /// timeout. Concurrent durable commits are flushed together by the
    /// server (group commit), so throughput under load grows with the
    /// connections in use: size it to the concurrent calls you expect, and
    /// keep `clients x pool_size` within the server's `max_connections`
    /// (or PgBouncer's `max_client_conn`).
    ///
    /// Closing idle connections rides on the background sweep: with
    /// [`sweep_every`](Self::sweep_every) `None`, opened connections stay
    /// open until the client is dropped. Behind PgBouncer this pool holds
    /// connections to PgBouncer, not to the server: the server-side
    /// concurrency is PgBouncer's `default_pool_size` (per database and
    /// user, shared by every client), and calls beyond it wait in
    /// PgBouncer's queue (bounded by its `query_wait_timeout`) instead of
    /// this one, still within the call timeout.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = Some(size.max(1));
        self
    }

    /// Whether to open the LISTEN connection that wakes waiters (default
    /// true, or the URL's `coord_listen`). Without it, or when the
    /// connection cannot receive notifications (PgBouncer in transaction
    /// mode), `Capabilities::notifications` is false and waiters poll.
    pub fn listen(mut self, on: bool) -> Self {
        self.listen = Some(on);
        self
    }

    /// A separate URL for the LISTEN connection: a direct connection to
    /// the server when statements go through PgBouncer in transaction
    /// pooling mode, where LISTEN cannot work. The URL's `listen_url` (or
    /// `coord_listen_url`) option, percent-encoded, sets the same; this
    /// call overrides it.
    pub fn listen_url(mut self, url: &str) -> Self {
        self.listen_url = Some(Secret::new(url));
        self
    }

    /// Whether statements are prepared once per pooled connection (named
    /// server-side statements) instead of parsed and planned on every call.
    /// Faster, but named statements do not survive PgBouncer's transaction
    /// pooling. Default: on when the connection is evidently direct (the
    /// LISTEN self-check received its notification and no separate
    /// `listen_url` was given), off otherwise.
    pub fn prepared_statements(mut self, on: bool) -> Self {
        self.prepared = Some(on);
        self
    }

    /// How long past its TTL or window (and a barrier past its last
    /// change) an idle name's state is kept before the sweep deletes it
    /// (default 60 s). It covers the database clock stepping back, and a
    /// barrier waiter that has not yet seen its generation complete: keep
    /// it above the poll interval plus the call timeout.
    pub fn idle_grace(mut self, grace: Duration) -> Self {
        self.idle_grace = grace;
        self
    }

    /// How long a barrier generation may go without any arrival or
    /// withdrawal before the sweep takes it for abandoned (its waiters
    /// died without withdrawing) and deletes it (default 24 h). A waiter
    /// still waiting on it then ends with
    /// [`Error::ArrivalLost`](coord_core::Error::ArrivalLost); it never
    /// passes.
    pub fn barrier_abandon_after(mut self, after: Duration) -> Self {
        self.barrier_abandon_after = after;
        self
    }

    /// How often, at most, this client runs the sweep in the background
    /// after one of its writes (default every 10 s, up to 10,000 rows per
    /// table each time). `None`: never by itself; call
    /// [`PostgresBackend::sweep`](crate::PostgresBackend::sweep) from your
    /// own schedule instead.
    pub fn sweep_every(mut self, every: Option<Duration>) -> Self {
        self.sweep_every = every;
        self
    }
}
