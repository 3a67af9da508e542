//! The command connection: to one server (a multiplexed, self-reconnecting
//! `ConnectionManager`), to the master Redis Sentinel names (the same, to
//! the address the sentinels give, asked again after a failure), or to a
//! Redis Cluster (`redis`'s async cluster client, built to send nothing
//! again: [`Conn::send`] follows `MOVED`/`ASK` and sends again only what a
//! node refused), replaced by a fresh one after a call times out.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_core::Result;
use coord_core::util::{Secret, bounded};
use redis::AsyncConnectionConfig;
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::{BACKEND, map_err};

/// A connection to one server or to a cluster; cheap to clone (both are
/// handles to a shared multiplexed connection).
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// How many times one call is sent again after a cluster node refused it
/// without running it (see [`Conn::send`]).
const REFUSALS: u32 = 4;

/// Where a cluster node told a refused request to go instead.
struct Redirect {
    /// The node it named.
    node: SingleNodeRoutingInfo,
    /// `ASK` (the slot is moving there: send `ASKING` first), else
    /// `MOVED` (the slot lives there now).
    ask: bool,
}

/// Whether `e` is a cluster node's refusal of a request it did not run:
/// `Some` with where to send it again (`None`: to where the slot map
/// says, after a pause), `None` when the request may have run.
///
/// Only replies that a node gives to a key's command, never to the
/// client library's own `CLUSTER SLOTS`, count: while it rebuilds its
/// slot map, the library answers every request in flight (written or
/// not, run or not) with the rebuild's error, which may be a connection
/// refusal, `ClusterConnectionNotFound`, or a node's `LOADING`,
/// `MASTERDOWN` or `CLUSTERDOWN`. Those are the caller's, as a
/// connection that dropped is.
fn refused(e: &redis::RedisError) -> Option<Option<Redirect>> {
    use redis::{ErrorKind, ServerErrorKind};
    let to = |ask| {
        let (addr, _slot) = e.redirect_node()?;
        let (host, port) = addr.rsplit_once(':')?;
        let node = SingleNodeRoutingInfo::ByAddress {
            host: host.to_string(),
            port: port.parse().ok()?,
        };
        Some(Redirect { node, ask })
    };
    match e.kind() {
        ErrorKind::Server(ServerErrorKind::Moved) => Some(to(false)),
        ErrorKind::Server(ServerErrorKind::Ask) => Some(to(true)),
        // A multi-key command while its slot moves; a write that reached
        // a master demoted to replica.
        ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ReadOnly) => Some(None),
        _ => None,
    }
}

impl Conn {
    /// Send `cmd` and return its answer. On a cluster, the client library
    /// sends nothing again by itself (it is built with no retries): a
    /// request whose connection dropped or whose answer did not come may
    /// have run, or may still be on its way, and a second copy would run
    /// it twice (a push landing twice). Sent again here, at most
    /// [`REFUSALS`] times, is only a request a node refused without
    /// running it (see [`refused`]): `MOVED` and `ASK` (to the node they
    /// name), `TRYAGAIN` and `READONLY` (after a pause, to where the
    /// refreshed slot map says). A reply of a routed request is an error
    /// when the node answered one, as for a request sent by slot.
    pub(crate) async fn send(&mut self, cmd: &Cmd) -> redis::RedisResult<Value> {
        let Conn::Cluster(c) = self else {
            return cmd.query_async(self).await;
        };
        let mut to: Option<Redirect> = None;
        let mut tries = 0;
        loop {
            let r = match &to {
                None => cmd.query_async(&mut *c).await,
                Some(Redirect { node, ask: false }) => c
                    .route_command(cmd.clone(), RoutingInfo::SingleNode(node.clone()))
                    .await
                    .and_then(Value::extract_error),
                Some(Redirect { node, ask: true }) => {
                    let mut pipe = redis::pipe();
                    pipe.cmd("ASKING").add_command(cmd.clone());
                    c.route_pipeline(pipe, 1, 1, node.clone())
                        .await
                        .and_then(|mut v| v.pop().unwrap_or(Value::Nil).extract_error())
                }
            };
            let e = match r {
                Err(e) if tries < REFUSALS => e,
                r => return r,
            };
            let Some(next) = refused(&e) else {
                return Err(e);
            };
            tries += 1;
            if next.is_none() {
                tokio::time::sleep(Duration::from_millis(25 << tries)).await;
            }
            to = next;
        }
    }
}

/// Where the master is, as Redis Sentinel says: the sentinels are asked
/// in turn (`SENTINEL get-master-addr-by-name`), and the address one names
/// is used only once the server there says it is a master (`ROLE`), as
/// the Sentinel client protocol asks.
pub(crate) struct SentinelMaster {
    pub(crate) sentinels: Vec<redis::Client>,
    pub(crate) name: String,
    /// The master's settings (credentials, database, TLS); its address is
    /// replaced by the one the sentinels name.
    pub(crate) template: redis::ConnectionInfo,
    /// Makes a client of one server from its settings (with the TLS
    /// certificates of the options).
    pub(crate) client:
        Box<dyn Fn(redis::ConnectionInfo) -> redis::RedisResult<redis::Client> + Send + Sync>,
    pub(crate) limit: Duration,
    pub(crate) password: Option<Secret>,
}

impl SentinelMaster {
    /// A client of the current master. Errors: `Unavailable` when no
    /// sentinel answers or names a server that is a master now.
    pub(crate) async fn discover(&self) -> Result<redis::Client> {
        let mut last = String::from("no sentinel answered");
        for sentinel in &self.sentinels {
            match self.ask(sentinel).await {
                Ok(client) => return Ok(client),
                Err(e) => last = e.to_string(),
            }
        }
        Err(coord_core::Error::Unavailable {
            backend: BACKEND,
            operation: "sentinel",
            message: format!(
                "no sentinel named a master for `{}` ({last}); check the sentinel \
                 addresses and the master name in the URL",
                self.name
            ),
            source: None,
        })
    }

    async fn ask(&self, sentinel: &redis::Client) -> Result<redis::Client> {
        let pw = self.password.as_ref();
        bounded(BACKEND, "sentinel", self.limit, async {
            let mut conn = sentinel
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| map_err("sentinel", &e, pw))?;
            let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&self.name)
                .query_async(&mut conn)
                .await
                .map_err(|e| map_err("sentinel", &e, pw))?;
            let Some((host, port)) = addr else {
                return Err(coord_core::Error::Unavailable {
                    backend: BACKEND,
                    operation: "sentinel",
                    message: format!("the sentinel watches no master named `{}`", self.name),
                    source: None,
                });
            };
            let addr = match self.template.addr() {
                redis::ConnectionAddr::TcpTls {
                    insecure,
                    tls_params,
                    ..
                } => redis::ConnectionAddr::TcpTls {
                    host,
                    port,
                    insecure: *insecure,
                    tls_params: tls_params.clone(),
                },
                _ => redis::ConnectionAddr::Tcp(host, port),
            };
            let client = (self.client)(self.template.clone().set_addr(addr))
                .map_err(|e| map_err("sentinel", &e, pw))?;
            let mut master = client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| map_err("sentinel", &e, pw))?;
            let role: Vec<redis::Value> = redis::cmd("ROLE")
                .query_async(&mut master)
                .await
                .map_err(|e| map_err("sentinel", &e, pw))?;
            match role.first() {
                Some(redis::Value::BulkString(r)) if r.as_slice() == b"master" => Ok(client),
                _ => Err(coord_core::Error::Unavailable {
                    backend: BACKEND,
                    operation: "sentinel",
                    message: "the server the sentinel named is not a master (yet)".into(),
                    source: None,
                }),
            }
        })
        .await
    }
}

/// Where the wake-up subscription may go.
pub(crate) enum Targets {
    /// Any of these servers (one, or a cluster's seeds: a `PUBLISH` on any
    /// cluster node reaches every node), tried in turn.
    Fixed(Vec<redis::Client>),
    /// The master the sentinels name now.
    Sentinel(Arc<SentinelMaster>),
}

impl Targets {
    /// The server to subscribe on at the `attempt`-th try.
    pub(crate) async fn client(&self, attempt: usize) -> Result<redis::Client> {
        match self {
            Targets::Fixed(clients) => Ok(clients[attempt % clients.len()].clone()),
            Targets::Sentinel(m) => m.discover().await,
        }
    }

    /// How many tries make one round over every server.
    pub(crate) fn len(&self) -> usize {
        match self {
            Targets::Fixed(clients) => clients.len(),
            Targets::Sentinel(_) => 1,
        }
    }
}

/// How to make a fresh connection.
pub(crate) enum Source {
    Single {
        client: redis::Client,
        config: ConnectionManagerConfig,
    },
    /// The master the sentinels name, asked again for every new connection.
    Sentinel {
        master: Arc<SentinelMaster>,
        config: ConnectionManagerConfig,
    },
    Cluster {
        client: ClusterClient,
        connect_timeout: Duration,
        password: Option<Secret>,
    },
}

impl Source {
    /// Open the first connection (bounded by `limit`).
    pub(crate) async fn open(&self, limit: Duration, pw: Option<&Secret>) -> Result<Conn> {
        Ok(self.open_on(limit, pw).await?.0)
    }

    /// [`open`](Self::open), with the one server the connection went to
    /// (`None` on a cluster): connect loads the scripts there.
    pub(crate) async fn open_on(
        &self,
        limit: Duration,
        pw: Option<&Secret>,
    ) -> Result<(Conn, Option<redis::Client>)> {
        bounded(BACKEND, "connect", limit, async {
            match self {
                Source::Single { client, config } => client
                    .get_connection_manager_with_config(config.clone())
                    .await
                    .map(|c| (Conn::Single(c), Some(client.clone()))),
                Source::Cluster { client, .. } => client
                    .get_async_connection()
                    .await
                    .map(|c| (Conn::Cluster(c), None)),
                Source::Sentinel { master, config } => {
                    let client = master.discover().await?;
                    client
                        .get_connection_manager_with_config(config.clone())
                        .await
                        .map(|c| (Conn::Single(c), Some(client)))
                }
            }
            .map_err(|e| map_err("connect", &e, pw))
        })
        .await
    }
}

/// A connection to `server` for connect's one-off script load, whose one
/// request (every script) may take far longer to answer than a call: its
/// response timeout is the connect limit, not the call timeout.
pub(crate) async fn script_loader(
    server: &redis::Client,
    limit: Duration,
    pw: Option<&Secret>,
) -> Result<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(limit))
        .set_response_timeout(Some(limit));
    bounded(BACKEND, "connect", limit, async {
        server
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| map_err("connect", &e, pw))
    })
    .await
}

/// The command connection, replaced by a fresh one after a call times out.
///
/// Replies on a multiplexed connection are matched to requests in order.
/// After a call gets no answer in time, that connection cannot be trusted:
/// its reply may have been lost (a proxy or middlebox dropped it, so every
/// later reply would be matched to the request before it), or the
/// connection may be silently dead (half-open: a NAT or firewall dropped
/// its state, and no error comes for many minutes). `redis-rs` reconnects
/// only on errors that close the connection, not on timeouts, so a client
/// would stay stuck on it for good; we start a new one instead (to one
/// server lazily: the next call connects; to a cluster or a sentinel-named master in the background,
/// calls using the old one meanwhile), and the old one closes when its
/// last in-flight call ends.
pub(crate) struct CommandConnection {
    source: Arc<Source>,
    /// (generation, connection): a call that timed out replaces the
    /// connection only if it is still the one the call used.
    current: Arc<Mutex<(u64, Conn)>>,
    /// A cluster connection is being made in the background.
    replacing: Arc<AtomicBool>,
    /// Asks the wake-up listener to PING its connection at once.
    pub(crate) check_listener: Arc<tokio::sync::Notify>,
}

impl CommandConnection {
    pub(crate) fn new(
        source: Source,
        conn: Conn,
        check_listener: Arc<tokio::sync::Notify>,
    ) -> CommandConnection {
        CommandConnection {
            source: Arc::new(source),
            current: Arc::new(Mutex::new((0, conn))),
            replacing: Arc::new(AtomicBool::new(false)),
            check_listener,
        }
    }

    /// Whether an error of a call means the master may have moved (a
    /// Sentinel deployment only): the server is gone or now a replica.
    pub(crate) fn master_moved(&self, e: &redis::RedisError) -> bool {
        matches!(*self.source, Source::Sentinel { .. })
            && (e.is_io_error()
                || e.is_connection_refusal()
                || e.is_connection_dropped()
                || e.code() == Some("READONLY"))
    }

    pub(crate) fn get(&self) -> (u64, Conn) {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn replace(&self, generation: u64) {
        match &*self.source {
            Source::Single { client, config } => {
                let mut cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
                if cur.0 != generation {
                    return;
                }
                match ConnectionManager::new_lazy_with_config(client.clone(), config.clone()) {
                    Ok(fresh) => *cur = (generation + 1, Conn::Single(fresh)),
                    Err(e) => {
                        tracing::debug!(error = %e, "could not replace the command connection")
                    }
                }
            }
            Source::Cluster { .. } | Source::Sentinel { .. } => {
                if self.current.lock().unwrap_or_else(|p| p.into_inner()).0 != generation
                    || self.replacing.swap(true, Ordering::AcqRel)
                {
                    return;
                }
                let (source, current, replacing) = (
                    self.source.clone(),
                    self.current.clone(),
                    self.replacing.clone(),
                );
                tokio::spawn(async move {
                    let (limit, password) = match &*source {
                        Source::Sentinel { master, .. } => {
                            // Discovery, then the connection: two limits.
                            (master.limit * 2, master.password.clone())
                        }
                        Source::Cluster {
                            connect_timeout,
                            password,
                            ..
                        } => (*connect_timeout, password.clone()),
                        // Replaced in place above; never spawned.
                        Source::Single { client, .. } => (
                            Duration::from_secs(1),
                            client
                                .get_connection_info()
                                .redis_settings()
                                .password()
                                .map(Secret::new),
                        ),
                    };
                    {
                        match source.open(limit, password.as_ref()).await {
                            Ok(fresh) => {
                                let mut cur = current.lock().unwrap_or_else(|p| p.into_inner());
                                if cur.0 == generation {
                                    *cur = (generation + 1, fresh);
                                }
                            }
                            Err(e) => tracing::debug!(
                                error = %e,
                                "could not replace the command connection"
                            ),
                        }
                    }
                    replacing.store(false, Ordering::Release);
                });
            }
        }
        // The wake-up connection may be dead the same way: check it now
        // rather than at its next periodic PING (waiters would be left on
        // the polling fallback, and lose every race to the woken ones).
        self.check_listener.notify_one();
    }
}
