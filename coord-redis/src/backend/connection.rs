//! The command connection: to one server (a multiplexed, self-reconnecting
//! `ConnectionManager`) or to a Redis Cluster (`redis`'s async cluster
//! client, which follows `MOVED`/`ASK` redirections and failovers by
//! itself), replaced by a fresh one after a call times out.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_core::Result;
use coord_core::util::{Secret, bounded};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
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

/// How to make a fresh connection.
pub(crate) enum Source {
    Single {
        client: redis::Client,
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
        bounded(BACKEND, "connect", limit, async {
            match self {
                Source::Single { client, config } => client
                    .get_connection_manager_with_config(config.clone())
                    .await
                    .map(Conn::Single),
                Source::Cluster { client, .. } => {
                    client.get_async_connection().await.map(Conn::Cluster)
                }
            }
            .map_err(|e| map_err("connect", &e, pw))
        })
        .await
    }
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
/// server lazily: the next call connects; to a cluster in the background,
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
            Source::Cluster { .. } => {
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
                    if let Source::Cluster {
                        connect_timeout,
                        password,
                        ..
                    } = &*source
                    {
                        match source.open(*connect_timeout, password.as_ref()).await {
                            Ok(fresh) => {
                                let mut cur = current.lock().unwrap_or_else(|p| p.into_inner());
                                if cur.0 == generation {
                                    *cur = (generation + 1, fresh);
                                }
                            }
                            Err(e) => tracing::debug!(
                                error = %e,
                                "could not replace the cluster command connection"
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
