//! The backend: one multiplexed, self-reconnecting connection for commands,
//! one dedicated pub/sub connection for wake-ups, and the scripts.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use coord_core::util::{Kind, Secret, bounded};
use coord_core::wake::Wakeups;
use coord_core::{Capabilities, Deployment, Error, FencingDurability, Result};
use redis::aio::ConnectionManagerConfig;
use redis::{ConnectionAddr, RedisError, Value};
use tokio_util::sync::{CancellationToken, DropGuard};

pub(crate) use self::connection::Targets;
use self::connection::{CommandConnection, SentinelMaster, Source};
use crate::keys::{Keys, Layout};
use crate::options::RedisOptions;
use crate::scripts::Scripts;

pub(crate) const BACKEND: &str = "redis";

/// The Redis backend: implements every coord primitive
/// ([`Lock`](coord_core::Lock), [`Lease`](coord_core::Lease),
/// [`FencingSource`](coord_core::FencingSource),
/// [`Election`](coord_core::Election), [`Barrier`](coord_core::Barrier),
/// [`Limiter`](coord_core::Limiter), [`Semaphore`](coord_core::Semaphore),
/// [`Queue`](coord_core::Queue)).
///
/// Holds one multiplexed command connection that reconnects by itself
/// (`redis::aio::ConnectionManager`) and one dedicated subscriber
/// connection, served by a background task that ends when the backend is
/// dropped. `Debug` shows the endpoint, never the password.
///
/// Most users want [`connect`](crate::connect) or
/// [`RedisOptions::connect`], which wrap it in a
/// [`Coord`](coord_core::Coord).
pub struct RedisBackend {
    conn: CommandConnection,
    keys: Keys,
    channel: String,
    timeout: Duration,
    /// [`RedisOptions::idle_grace`] in ms, as a script argument.
    idle_grace_ms: String,
    caps: Capabilities,
    wakeups: Wakeups,
    /// As a Redlock master only: the owners with a step that went
    /// unanswered by this master, by claim key (`coord_core::late`). The
    /// caller's book knows the quorum call, which may be answered while
    /// this master's part of it is not: its release and extends here
    /// must mark all the same.
    master_book: coord_core::late::Unanswered,
    scripts: Scripts,
    password: Option<Secret>,
    endpoint: String,
    _listener: DropGuard,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("endpoint", &self.endpoint)
            .field("prefix", &self.keys.prefix)
            .field("layout", &self.keys.layout)
            .field("timeout", &self.timeout)
            .field("password", &self.password)
            .finish_non_exhaustive()
    }
}

/// What this backend promises: 1 ms TTLs on the server's clock, pub/sub
/// wake-ups, and fencing tokens that are
/// [`FencingDurability::ClockSeeded`]: every token (lock, lease and permit grants,
/// election terms, [`FencingSource::next`](coord_core::FencingSource::next))
/// is issued in one script as max(last token stored for the name + 1,
/// server time in µs), compared exactly. The last token is kept only while
/// the name is in use (a claim's value and the rest of its TTL after a
/// release, or until the server clock has passed a token that is ahead
/// of it, at most a day; an election's hash; a fencing source's counter for the idle
/// grace). So tokens keep rising across a restart without persistence, a
/// restore of an older snapshot, a lost AOF tail, a failover to a replica
/// that missed writes, and after the name's state expired, under two
/// assumptions: the clock of the server that issues (each server after a
/// failover) never goes back below the time of the newest token issued
/// before, and fewer than one token per µs is issued for one name on
/// average (else tokens run ahead of the clock, and a lost counter can
/// repeat the tokens issued ahead).
///
/// Not [`exclusive_across_failover`](Capabilities::exclusive_across_failover):
/// Redis replicates asynchronously, so a replica promoted after its
/// primary died may never have seen a grant; fence every write.
pub fn capabilities() -> Capabilities {
    let mut caps = Capabilities::new(BACKEND);
    caps.min_ttl = Duration::from_millis(1);
    caps.ttl_granularity = Duration::from_millis(1);
    caps.fair = false;
    caps.fencing = FencingDurability::ClockSeeded;
    caps.server_clock = true;
    caps.notifications = true;
    caps
}

/// What this backend promises on a Redis Cluster (`redis+cluster://`):
/// [`capabilities`], with deployment `"cluster"`. Each name's state lives
/// on the master of its hash slot, and its tokens come from that master's
/// clock (after a failover, the promoted replica's). For tokens to keep
/// rising across a failover, the promoted replica's clock must not be
/// behind the dead master's by more than the failover took (at least
/// `cluster-node-timeout`, seconds; NTP keeps clocks within
/// milliseconds). Asynchronous replication: see [`capabilities`].
pub fn cluster_capabilities() -> Capabilities {
    let mut caps = capabilities();
    caps.deployment = Deployment::Cluster;
    caps
}

/// What this backend promises behind Redis Sentinel (`redis+sentinel://`):
/// [`capabilities`], with deployment `"sentinel"`. After a failover the
/// promoted replica issues tokens from its own clock, which must not be
/// behind the dead master's by more than the failover took (seconds);
/// asynchronous replication: see [`capabilities`].
pub fn sentinel_capabilities() -> Capabilities {
    let mut caps = capabilities();
    caps.deployment = Deployment::Sentinel;
    caps
}

impl RedisBackend {
    /// Connect: parse the URL, open the command connection, load every
    /// script once (`SCRIPT LOAD`), and subscribe the wake-up channel on a
    /// dedicated connection before returning.
    ///
    /// Errors: [`Error::Config`] for a malformed URL or URL option,
    /// [`Error::Unavailable`] when the server cannot be reached in time,
    /// [`Error::Store`] saying "authentication failed" for a wrong user or
    /// password. No error contains the password.
    pub async fn connect(opts: RedisOptions) -> Result<RedisBackend> {
        Self::connect_sharing(opts, Wakeups::new()).await
    }

    /// [`Self::connect`], delivering wake-ups to `wakeups` (a registry
    /// shared by several backends: Redlock's masters).
    pub(crate) async fn connect_sharing(
        opts: RedisOptions,
        wakeups: Wakeups,
    ) -> Result<RedisBackend> {
        if let Some(e) = &opts.url_error {
            return Err(Error::Config(e.clone()));
        }
        let seeds: Vec<&str> = match &opts.cluster {
            Some(seeds) => seeds.iter().map(|s| s.expose()).collect(),
            None => vec![opts.url.expose()],
        };
        let infos = seeds
            .iter()
            .map(|u| connection_info(u, &opts))
            .collect::<Result<Vec<_>>>()?;
        let info = infos[0].clone();
        let password = info.redis_settings().password().map(Secret::new);
        let endpoint = match &opts.cluster {
            Some(_) => format!("{} (Redis Cluster, {} seeds)", endpoint(&info), infos.len()),
            None => endpoint(&info),
        };
        let tls = matches!(info.addr(), ConnectionAddr::TcpTls { .. });
        if tls {
            // rustls needs a process-wide crypto provider; install ring's
            // unless the application already chose one. (rustls 0.23.48
            // deprecates ring's provider for its lack of post-quantum key
            // exchange; ring builds without a C toolchain's extras, which
            // aws-lc-rs needs. An application wanting post-quantum key
            // exchange installs aws-lc-rs's provider first.)
            #[allow(deprecated)]
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let custom_tls = opts.tls_root.is_some() || opts.tls_client.is_some();
        if custom_tls && !tls {
            return Err(Error::Config(
                "TLS certificates were given for a plain `redis://` URL; \
                 use `rediss://` (or `rediss+cluster://`) to connect with TLS"
                    .into(),
            ));
        }
        let config_error = |e: RedisError| match map_err("connect", &e, password.as_ref()) {
            Error::Store { message, .. } => Error::Config(message),
            other => other,
        };
        // One client per seed for the wake-up subscription: on a cluster,
        // `PUBLISH` reaches every node, so any one will do, and the
        // listener moves to the next when its node goes away.
        let subscribers = infos
            .iter()
            .map(|i| single_client(i.clone(), &opts, custom_tls).map_err(config_error))
            .collect::<Result<Vec<_>>>()?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(opts.connect_timeout))
            .set_response_timeout(Some(opts.timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let mut targets = None;
        let source = if let Some((sentinel_urls, name)) = &opts.sentinel {
            let sentinels = sentinel_urls
                .iter()
                .map(|u| {
                    let info = connection_info(u, &RedisOptions::new(u))?;
                    single_client(info, &opts, custom_tls).map_err(config_error)
                })
                .collect::<Result<Vec<_>>>()?;
            let (o, tls_client) = (opts.clone(), custom_tls);
            let master = Arc::new(SentinelMaster {
                sentinels,
                name: name.clone(),
                template: info.clone(),
                client: Box::new(move |i| single_client(i, &o, tls_client)),
                limit: opts.connect_timeout,
                password: password.clone(),
            });
            targets = Some(Targets::Sentinel(master.clone()));
            Source::Sentinel { master, config }
        } else if opts.cluster.is_some() {
            if empty_hash_tag(&opts.prefix) {
                return Err(Error::Config(
                    "the key prefix has an empty hash tag (its first `{` is followed at \
                     once by `}`), so Redis Cluster would hash each key whole and one \
                     primitive's keys would sit in different slots (CROSSSLOT); drop the \
                     braces, or put something between them"
                        .into(),
                ));
            }
            if opts.layout == Layout::Php {
                return Err(Error::Config(
                    "Layout::Php is for a single Redis server: its keys share no hash tag, \
                     so one lock's keys may sit on different cluster nodes. Use the default \
                     Layout::Coord on a Redis Cluster"
                        .into(),
                ));
            }
            // Per node, well under the limit of the whole connect: the
            // cluster client waits for every seed, so one that hangs (a
            // frozen or blackholed node) must not use up the whole limit,
            // or no client could connect, nor rebuild its connection away
            // from a frozen master, while that node hangs.
            let per_node = (opts.connect_timeout / 4).max(Duration::from_millis(50));
            let mut builder = redis::cluster::ClusterClientBuilder::new(infos.clone())
                .connection_timeout(per_node)
                .response_timeout(opts.timeout)
                // Nothing sent again by the client library: a request
                // whose connection dropped may have run (`Conn::send`).
                .retries(0);
            if custom_tls {
                builder = builder.certs(certificates(&opts));
            }
            Source::Cluster {
                client: builder.build().map_err(config_error)?,
                connect_timeout: opts.connect_timeout,
                password: password.clone(),
            }
        } else {
            Source::Single {
                client: subscribers[0].clone(),
                config,
            }
        };
        let (mut conn, server) = source
            .open_on(opts.connect_timeout, password.as_ref())
            .await?;

        // Register every script once: in one round trip on one server, on a
        // connection of its own that waits up to the connect limit for the
        // answer (a call's timeout may be far shorter than loading every
        // script takes); on a cluster one `SCRIPT LOAD` each, which the
        // client sends to every master (it has no connection to replicas:
        // a promoted one answers `NOSCRIPT` once per script, and `eval`
        // sends its source).
        let scripts = Scripts::new();
        let pw = password.clone();
        let started = std::time::Instant::now();
        let loader = match &server {
            Some(server) => {
                Some(connection::script_loader(server, opts.connect_timeout, pw.as_ref()).await?)
            }
            None => None,
        };
        let left = opts.connect_timeout.saturating_sub(started.elapsed());
        bounded(BACKEND, "connect", left, async {
            let Some(mut loader) = loader else {
                for src in &scripts.sources {
                    redis::cmd("SCRIPT")
                        .arg("LOAD")
                        .arg(src)
                        .query_async::<Value>(&mut conn)
                        .await
                        .map_err(|e| map_err("script load", &e, pw.as_ref()))?;
                }
                return Ok(());
            };
            let mut pipe = redis::pipe();
            for src in &scripts.sources {
                pipe.cmd("SCRIPT").arg("LOAD").arg(src);
            }
            pipe.query_async::<Vec<String>>(&mut loader)
                .await
                .map(drop)
                .map_err(|e| map_err("script load", &e, pw.as_ref()))
        })
        .await?;

        let keys = Keys {
            prefix: opts.prefix.clone(),
            layout: opts.layout,
        };
        let channel = keys.channel();
        let cancel = CancellationToken::new();
        let check_listener = Arc::new(tokio::sync::Notify::new());
        let targets = targets.unwrap_or(Targets::Fixed(subscribers));
        let pubsub =
            listener::subscribe_any(&targets, &channel, opts.connect_timeout, password.as_ref())
                .await?;
        tokio::spawn(listener::run(
            targets,
            channel.clone(),
            wakeups.clone(),
            cancel.clone(),
            pubsub,
            opts.connect_timeout,
            password.clone(),
            check_listener.clone(),
        ));

        Ok(RedisBackend {
            conn: CommandConnection::new(source, conn, check_listener),
            keys,
            channel,
            timeout: opts.timeout,
            idle_grace_ms: ms(opts.idle_grace).to_string(),
            caps: if opts.cluster.is_some() {
                cluster_capabilities()
            } else if opts.sentinel.is_some() {
                sentinel_capabilities()
            } else {
                capabilities()
            },
            wakeups,
            master_book: Default::default(),
            scripts,
            password,
            endpoint,
            _listener: cancel.drop_guard(),
        })
    }

    /// Wrap this backend in a [`Coord`](coord_core::Coord) handle, with
    /// every primitive, semaphores and work queues included.
    pub fn into_coord(self) -> coord_core::Coord {
        let backend = Arc::new(self);
        coord_core::Coord::from_backend(backend.clone())
            .with_semaphores(backend.clone())
            .with_lister(backend.clone())
            .with_queues(backend)
    }

    /// The key layout in use.
    pub fn layout(&self) -> Layout {
        self.keys.layout
    }

    /// The key prefix in use.
    pub fn prefix(&self) -> &str {
        &self.keys.prefix
    }

    /// The local wake-up registry fed by the subscriber connection.
    pub fn wakeups(&self) -> &Wakeups {
        &self.wakeups
    }

    /// Run one script, bounded by the call timeout: `EVALSHA`, and where
    /// the server has not cached the script (`NOSCRIPT`: a restarted
    /// server, a promoted replica, a `SCRIPT FLUSH`), `EVAL` with its
    /// source, which caches it there. Both go where the script's keys
    /// live; `redis`' own fallback (`SCRIPT LOAD`, then `EVALSHA` again)
    /// sends the load to every node of a cluster and waits for them all,
    /// so one hung node, unrelated to the keys, would fail every script
    /// call on a node that lost its cache.
    pub(crate) async fn eval(
        &self,
        operation: &'static str,
        script: &redis::Script,
        keys: &[&str],
        args: &[&[u8]],
    ) -> Result<Value> {
        let call = |verb: &str, body: &str| {
            let mut cmd = redis::cmd(verb);
            cmd.arg(body).arg(keys.len());
            for k in keys {
                cmd.arg(*k);
            }
            for a in args {
                cmd.arg(*a);
            }
            cmd
        };
        let hash = script.get_hash();
        let evalsha = call("EVALSHA", hash);
        let (generation, mut conn) = self.conn.get();
        self.bounded(operation, generation, async move {
            match conn.send(&evalsha).await {
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    // Built only now: the source is kilobytes.
                    match self.scripts.source_of(hash) {
                        Some(source) => conn.send(&call("EVAL", source)).await,
                        None => Err(e),
                    }
                }
                r => r,
            }
        })
        .await
    }

    /// Run one plain command, bounded by the call timeout.
    pub(crate) async fn cmd(&self, operation: &'static str, cmd: redis::Cmd) -> Result<Value> {
        let (generation, mut conn) = self.conn.get();
        self.bounded(operation, generation, async move { conn.send(&cmd).await })
            .await
    }

    /// Run a call on the connection of `generation` within the call
    /// timeout; if it gets no answer in time, replace that connection (see
    /// [`CommandConnection`]).
    async fn bounded<T>(
        &self,
        operation: &'static str,
        generation: u64,
        fut: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                if e.is_timeout() || self.conn.master_moved(&e) {
                    self.conn.replace(generation);
                }
                Err(map_err(operation, &e, self.password.as_ref()))
            }
            Err(_) => {
                self.conn.replace(generation);
                Err(Error::Unavailable {
                    backend: BACKEND,
                    operation,
                    message: format!(
                        "no answer within {:?}; reconnecting (the request may or may not have been applied)",
                        self.timeout
                    ),
                    source: None,
                })
            }
        }
    }

    pub(crate) fn wake_args(&self, kind: Kind, name: &str) -> (String, String) {
        (self.channel.clone(), Keys::wake(kind, name))
    }
}

mod barrier;
mod claims;
mod connection;
mod election;
mod errors;
mod health;
mod limiter;
mod list;
pub(crate) mod listener;
mod master;

pub(crate) use errors::map_err;
pub(crate) use master::{ClaimKind, Op};
pub(crate) use reply::{
    array, attempt, attempt_again, bytes, flag, int, malformed, ms, step_answer, unexpected, us,
};
use settings::{certificates, connection_info, empty_hash_tag, endpoint, single_client};
mod queue;
mod reply;
mod semaphore;
mod settings;
