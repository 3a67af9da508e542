//! The backend object: the connection and one part per primitive, and
//! the coord-core traits over them (one file per primitive under
//! `backend/`).

mod barrier;
mod claims;
mod health;
mod limiter;
mod list;
mod semaphore;
mod work_queue;

use std::sync::Arc;
use std::time::Duration;

use coord_core::{Capabilities, Coord, Deployment, FencingDurability, Result};
use tokio::sync::watch;

use crate::barrier::Barriers;
use crate::claim::Claims;
use crate::client::Etcd;
use crate::client::connect::connect;
use crate::client::keys::BACKEND;
use crate::limiter::Limiters;
use crate::options::EtcdOptions;
use crate::semaphore::Semaphores;
use crate::work_queue::WorkQueues;

/// The etcd backend: implements every coord-core trait
/// ([`Lock`](coord_core::Lock), [`Lease`](coord_core::Lease),
/// [`FencingSource`](coord_core::FencingSource),
/// [`Election`](coord_core::Election), [`Barrier`](coord_core::Barrier),
/// [`Limiter`](coord_core::Limiter), [`Semaphore`](coord_core::Semaphore),
/// [`Queue`](coord_core::Queue)).
///
/// Most users want [`connect`](crate::connect), which wraps it in a
/// [`Coord`]. Background tasks (keepalives of queued waiters, watches,
/// revocations retried after a failure) end when the last handle is
/// dropped; the server then expires the client's leases by itself.
pub struct EtcdBackend {
    pub(crate) etcd: Arc<Etcd>,
    pub(crate) caps: Capabilities,
    pub(crate) claims: Arc<Claims>,
    pub(crate) semaphores: Arc<Semaphores>,
    pub(crate) queues: WorkQueues,
    pub(crate) barriers: Arc<Barriers>,
    pub(crate) limiters: Arc<Limiters>,
    endpoints: Vec<String>,
    prefix: String,
    _shutdown: watch::Sender<()>,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("capabilities", &self.caps)
            .finish_non_exhaustive()
    }
}

impl EtcdBackend {
    /// Connect to the cluster named by `opts`: authenticate if a user is
    /// given, then grant (and revoke) one lease, which tells the server's
    /// minimum lease TTL (reported as [`Capabilities::min_ttl`]).
    ///
    /// Errors: [`Error::Unavailable`] when no endpoint answers within the
    /// timeouts, [`Error::Store`] for a refused login, [`Error::Config`] for
    /// unreadable TLS files. None of them contains the password.
    ///
    /// [`Error::Unavailable`]: coord_core::Error::Unavailable
    /// [`Error::Store`]: coord_core::Error::Store
    /// [`Error::Config`]: coord_core::Error::Config
    pub async fn connect(opts: EtcdOptions) -> Result<Arc<EtcdBackend>> {
        let (client, grant) = connect(&opts).await?;
        let min = grant.ttl().max(1) as u64;
        let mut caps = Capabilities::new(BACKEND);
        caps.min_ttl = Duration::from_secs(min);
        caps.ttl_granularity = Duration::from_secs(1);
        caps.fair = true;
        caps.fencing = FencingDurability::Durable;
        caps.server_clock = false;
        caps.notifications = true;
        // One node or a cluster: a grant is on a majority before it is
        // acknowledged, so a new leader has it.
        caps.deployment = Deployment::Raft;
        caps.exclusive_across_failover = true;
        // The leader's lessor looks for expired leases every ~500 ms and
        // revokes them through raft.
        caps.expiry_lag = Duration::from_millis(1500);
        let (tx, rx) = watch::channel(());
        let etcd = Arc::new(Etcd::new(client, &opts.prefix, opts.call_timeout, rx));
        etcd.revoke_later(grant.id());
        Ok(Arc::new(EtcdBackend {
            caps,
            claims: Arc::new(Claims::new(etcd.clone())),
            semaphores: Arc::new(Semaphores::new(etcd.clone())),
            queues: WorkQueues::new(etcd.clone()),
            barriers: Arc::new(Barriers { etcd: etcd.clone() }),
            limiters: Arc::new(Limiters::new(etcd.clone())),
            etcd,
            endpoints: opts.hosts.clone(),
            prefix: opts.prefix.clone(),
            _shutdown: tx,
        }))
    }

    /// A [`Coord`] handle over this backend (every primitive, FIFO
    /// semaphores and work queues included).
    pub fn coord(self: &Arc<Self>) -> Coord {
        Coord::from_backend(self.clone())
            .with_semaphores(self.clone())
            .with_lister(self.clone())
            .with_queues(self.clone())
    }

    /// What this backend promises.
    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// The etcd lease ids of this client's claims (held locks, leases and
    /// leaderships, and queued lock waiters): one lease per claim, for
    /// tests and operators (`etcdctl lease timetolive <id>`).
    pub fn claim_leases(&self) -> Vec<i64> {
        self.claims.leases()
    }
}
