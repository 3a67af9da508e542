//! Redlock: locks, leases and fencing tokens on a quorum of independent
//! Redis masters (`redlock://h1:6379,h2:6379,h3:6379`), after the
//! algorithm published with Redis ("Distributed Locks with Redis").
//!
//! # The algorithm
//!
//! N independent masters (no replication between them, at least 3; an odd
//! number is best), quorum q = N/2 + 1.
//!
//! - **Acquire**: the claim's script (the same one as on one server, with
//!   its clock-seeded token) runs on every master at once, each call
//!   bounded by the client's call timeout. The attempt is granted when q
//!   masters granted it and the time it took is below the TTL minus the
//!   drift margin (1 % + 2 ms, [`coord_core::drift`]); the guard's validity
//!   is the TTL minus the time from before the request to the grant, minus
//!   that margin, as for every store. Then a second step raises the claim's
//!   token on the granting masters to the highest token of the quorum
//!   (`RAISE`), and the grant stands once q of them did. A master that
//!   granted after the attempt was decided gets the same token as soon as
//!   it answers, so all masters holding the claim agree on its token. An attempt that
//!   does not get there is undone on every master that granted it before
//!   it returns; a split vote (some grants, not q) is retried after a
//!   random delay.
//! - **Release, extend (the watchdog), revoke, renew**: on every master at
//!   once; an extend holds when q masters extended, and a release says
//!   the claim was held when q masters released it (an owner's claim
//!   left on fewer masters, a slow one's straggler, is released there
//!   too, but was no longer a lock: another owner can hold the rest).
//! - **Waiting**: every master's wake-up channel feeds one registry, so a
//!   release on any master wakes the waiters of this client.
//!
//! # What is guaranteed, and what is not
//!
//! - **Mutual exclusion** holds while fewer than q masters fail or lose
//!   their data within one TTL, and while the clocks of client and masters
//!   run at nearly the same rate (the drift margin). A master restarted
//!   without persistence forgets the claims it granted: run the masters
//!   with `appendonly yes` and `appendfsync always`, or keep a restarted
//!   master out for one TTL (the published algorithm's "delayed restart").
//! - **Fencing tokens are best effort**
//!   ([`FencingDurability::BestEffort`]): a grant's token is the highest
//!   token of its quorum, raised on those masters before the grant is
//!   returned, so any two grants that exclude each other share a master
//!   that saw the earlier token, and the later token is higher, as long as
//!   that master kept its data and the clocks of any two masters differ by
//!   less than the TTL. A fault outside those assumptions (a majority
//!   restarted without persistence, a clock stepped back) can repeat a
//!   token. [`FencingSource::next`](coord_core::FencingSource::next) is
//!   the token of a short claim on the resource (three round trips), so
//!   tokens for one resource are issued one at a time. Clients waiting for
//!   that claim are woken by its release and spread their next attempts
//!   over about one attempt's time (or they would split the masters'
//!   votes); a client that just released it while others asked waits a
//!   random share of that time before it asks again, so that it does not
//!   take its run of tokens before them.
//!   For fencing a resource can rely on whatever happens, use etcd or
//!   PostgreSQL.
//! - **Retries by the same owner** get the grant's token again: a retry
//!   whose granting masters include a quorum holding one token answers
//!   that token, and sets the others to it (a master that missed the
//!   first attempt, down, skipped as slow or not yet connected, grants
//!   the retry with a later token of its own). A master's answer says
//!   whether it held the owner's grant already; when such answers in the
//!   first quorum disagree on the token, the retry waits for the rest of
//!   the masters (each bounded by the call timeout) before it decides. A
//!   new grant is decided on its first quorum. Only when fewer than a
//!   quorum of the masters counted hold the grant's token (one of them
//!   lost the claim, or was too slow for this decision too) does the
//!   retry get the highest token it saw (and every master is set to it),
//!   so tokens still rise, and never fall. Through another client as well: the conformance
//!   case `lock_same_owner_through_another_client_gets_no_other_token`
//!   allows this higher token on stores with best-effort fencing only.
//! - **Not offered** (see [`capabilities`]): elections, barriers, rate
//!   limiters, semaphores, read-write locks, work queues. Each needs one
//!   order of events that every client sees (a count, a queue, a history
//!   of leaders), which independent masters cannot give without a
//!   consensus protocol. Use them on one Redis, a Cluster, Sentinel, etcd
//!   or PostgreSQL.
//!
//! # Masters that are down
//!
//! `connect` returns once q masters are connected; the others go on
//! connecting in the background, and a master that is down is connected
//! again when a call needs it (at most once a second); until then it
//! counts as a failed vote. A master that does not answer costs a step at
//! most its call timeout, and only when the masters that did answer could
//! not decide it alone; after that it is skipped (a failed vote at once)
//! for a second before calls try it again. Each master must be a master
//! (`ROLE`) and a different server (`run_id`) from the others.

mod claims;
mod health;
mod list;
mod master;
mod tally;
mod traits;

use master::{Master, State};

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coord_core::wake::Wakeups;
use coord_core::{Capabilities, Deployment, Error, FencingDurability, Result};
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;

use crate::backend::{BACKEND, RedisBackend};
use crate::keys::Layout;
use crate::options::RedisOptions;

/// How long a master that failed to connect is left alone before a call
/// that needs it tries again.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);

/// How long a master whose call ran into the call timeout is skipped
/// (counted as a failed vote at once) before calls try it again.
const SLOW_FOR: Duration = Duration::from_secs(1);

/// The smallest TTL: a grant is valid for its TTL minus the time the
/// quorum took (two round trips to every master) minus the drift margin,
/// so a TTL of a few milliseconds would leave nothing on a loaded network.
pub const MIN_TTL: Duration = Duration::from_millis(100);

/// Why each primitive Redlock cannot offer is missing, and what to use.
const UNSUPPORTED: &[(&str, &str)] = &[
    (
        "elections",
        "observers must see one history of leaders, which independent masters cannot \
         agree on without consensus; use etcd, PostgreSQL or one Redis (a Cluster or \
         Sentinel) for elections",
    ),
    (
        "barriers",
        "a barrier counts arrivals, and counts on independent masters can disagree; use \
         one Redis (a Cluster or Sentinel), etcd or PostgreSQL",
    ),
    (
        "rate limiters",
        "requests counted on independent masters either exceed the limit or waste it; \
         use one Redis (a Cluster or Sentinel), etcd or PostgreSQL",
    ),
    (
        "semaphores",
        "a permit count and a FIFO queue need one order of requests, which independent \
         masters do not give; use one Redis (a Cluster or Sentinel), etcd or PostgreSQL",
    ),
    (
        "read-write locks",
        "they are built on FIFO semaphores, which Redlock does not offer; use one Redis \
         (a Cluster or Sentinel), etcd or PostgreSQL",
    ),
    (
        "queues",
        "a message must be stored once and delivered in one order; use one Redis (a \
         Cluster or Sentinel), etcd or PostgreSQL",
    ),
];

/// What the Redlock backend promises: TTLs of at least [`MIN_TTL`] in
/// 1 ms steps on the masters' clocks,
/// wake-ups from every master, deployment `"redlock"`, fencing tokens
/// [`FencingDurability::BestEffort`] (see the [module docs](self)), not
/// [`exclusive_across_failover`](Capabilities::exclusive_across_failover)
/// (a master that restarts without its data forgets its grants), and
/// [`Capabilities::unsupported`] naming every primitive it does not
/// offer, with the reason.
pub fn capabilities() -> Capabilities {
    let mut caps = crate::capabilities();
    caps.deployment = Deployment::Redlock;
    caps.min_ttl = MIN_TTL;
    caps.fencing = FencingDurability::BestEffort;
    caps.unsupported = UNSUPPORTED;
    caps
}

/// The Redlock backend: [`Lock`](coord_core::Lock),
/// [`Lease`](coord_core::Lease) and
/// [`FencingSource`](coord_core::FencingSource) on a quorum of
/// independent masters, each reached through its own [`RedisBackend`]
/// (its own reconnecting connection and subscriber). `Debug` shows the
/// masters' endpoints, never the password.
///
/// Most users want [`crate::connect`] with a `redlock://` URL.
pub struct RedlockBackend {
    masters: Vec<Arc<Master>>,
    quorum: usize,
    caps: Capabilities,
    wakeups: Wakeups,
    timeout: Duration,
    /// Claims released by their owner lately, until when to remember it,
    /// and whether a release already reported success: a master that
    /// grants one of them afterwards (a late answer to an attempt that was
    /// dropped or given up) releases it at once, and a second release by
    /// the owner reports `false` (the first may have returned before every
    /// master had answered).
    released: Arc<Mutex<HashMap<Released, (Instant, bool)>>>,
    /// Each owner's attempts on a claim, one at a time with their late
    /// answers (see `quorum_acquire`).
    gates: Mutex<HashMap<Released, std::sync::Weak<tokio::sync::RwLock<()>>>>,
    /// Fencing sources this client issued a token of lately: when it
    /// released the issuing claim, and how long issuing took (see
    /// `FencingSource::next`).
    issued: Mutex<HashMap<String, (Instant, Duration)>>,
}

/// A released claim: its kind, name and owner.
pub(crate) type Released = (crate::backend::ClaimKind, String, coord_core::OwnerToken);

impl fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let masters: Vec<&str> = self.masters.iter().map(|m| m.endpoint.as_str()).collect();
        f.debug_struct("RedlockBackend")
            .field("masters", &masters)
            .field("quorum", &self.quorum)
            .finish_non_exhaustive()
    }
}

/// Each master's answer to one step, by master; `None`: not asked, or
/// not answered when the step was decided.
pub(crate) type Answers<T> = Vec<Option<Result<T>>>;

impl RedlockBackend {
    /// Connect to every master at once (each with the options of `opts`),
    /// and return once a quorum of them is connected; the others are
    /// connected again when needed (see the [module docs](self)).
    ///
    /// Errors: [`Error::Config`] for a URL that is not `redlock://` with at
    /// least three masters, for `Layout::Php`, for a master that is a
    /// replica, and for one server reached through two entries of the URL
    /// (checked by its `run_id`); [`Error::Store`] saying "authentication
    /// failed" for a wrong user or password, as with one server (never
    /// retried); [`Error::Unavailable`] when fewer than a quorum of masters
    /// answer within the connect timeout. A master that answers after the
    /// quorum did is checked the same way when it gets there, and kept out
    /// (logged) if it fails.
    pub async fn connect(opts: RedisOptions) -> Result<RedlockBackend> {
        if let Some(e) = &opts.url_error {
            return Err(Error::Config(e.clone()));
        }
        let Some(urls) = opts.redlock.clone() else {
            return Err(Error::Config(
                "not a Redlock URL: write redlock://host1:6379,host2:6379,host3:6379".into(),
            ));
        };
        if opts.layout == Layout::Php {
            return Err(Error::Config(
                "Layout::Php is for a single Redis server (the PHP's keys); use the \
                 default Layout::Coord with Redlock"
                    .into(),
            ));
        }
        let wakeups = Wakeups::new();
        let servers = Arc::new(Mutex::new(HashMap::new()));
        let masters: Vec<Arc<Master>> = urls
            .iter()
            .enumerate()
            .map(|(index, u)| {
                let mut o = opts.clone();
                o.url = u.clone();
                o.redlock = None;
                Arc::new(Master {
                    index,
                    endpoint: coord_core::util::redact_url_passwords(u.expose()),
                    opts: o,
                    wakeups: wakeups.clone(),
                    servers: servers.clone(),
                    state: Mutex::new(State {
                        backend: None,
                        connecting: true,
                        retry_at: Instant::now(),
                        slow_until: None,
                        excluded: None,
                    }),
                })
            })
            .collect();
        let quorum = masters.len() / 2 + 1;
        // Each master connects in a task of its own; return once a quorum
        // is connected (the others go on in the background, bounded by
        // the connect timeout, and keep their backend when they get there).
        let mut pending: FuturesUnordered<_> = masters
            .iter()
            .map(|m| {
                tokio::spawn({
                    let m = m.clone();
                    async move { m.connect().await }
                })
            })
            .collect();
        let mut connected = 0;
        let mut last = None;
        let started = Instant::now();
        while connected < quorum {
            match pending.next().await {
                Some(Ok(Ok(()))) => connected += 1,
                Some(Ok(Err(e))) if e.is_retryable() => last = Some(e),
                Some(Ok(Err(e))) => return Err(e),
                Some(Err(e)) => {
                    last = Some(Error::Store {
                        backend: BACKEND,
                        operation: "connect",
                        message: format!("a Redlock connect failed: {e}"),
                        source: None,
                    })
                }
                None => break,
            }
        }
        if connected >= quorum {
            // Give the masters still out as long again as the quorum took
            // (10 to 500 ms), so that on a healthy deployment every master
            // is connected before the first grant.
            let more = started
                .elapsed()
                .clamp(Duration::from_millis(10), Duration::from_millis(500));
            let until = tokio::time::Instant::now() + more;
            while let Ok(Some(r)) = tokio::time::timeout_at(until, pending.next()).await {
                match r {
                    Ok(Err(e)) if !e.is_retryable() => return Err(e),
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "a Redlock master is not connected yet")
                    }
                    _ => {}
                }
            }
        }
        if connected < quorum {
            return Err(Error::Unavailable {
                backend: BACKEND,
                operation: "connect",
                message: format!(
                    "only {connected} of {} Redlock masters answered; a quorum of {quorum} \
                     is needed{}",
                    masters.len(),
                    last.map(|e| format!(" (last error: {e})"))
                        .unwrap_or_default()
                ),
                source: None,
            });
        }
        Ok(RedlockBackend {
            masters,
            quorum,
            caps: capabilities(),
            wakeups,
            timeout: opts.timeout,
            released: Default::default(),
            gates: Default::default(),
            issued: Default::default(),
        })
    }

    /// Wrap this backend in a [`Coord`](coord_core::Coord) handle with
    /// locks, leases and fencing tokens (the other primitives are
    /// [`Error::Unsupported`] with the reason, see [`capabilities`]).
    pub fn into_coord(self) -> coord_core::Coord {
        let b = Arc::new(self);
        let caps = b.caps.clone();
        coord_core::Coord::builder(caps)
            .lock(b.clone())
            .lease(b.clone())
            .fencing(b.clone())
            .probe(b.clone())
            .lister(b)
            .build()
    }

    /// How many masters must agree.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// How many masters there are.
    pub fn masters(&self) -> usize {
        self.masters.len()
    }

    /// Run `call(index, master)` on the masters (those marked in `only`, or all) at once,
    /// each in a task of its own (bounded by the call timeout), until
    /// `decided` says the answers so far settle the step or every master
    /// asked has answered; with `linger`, the masters still out then get
    /// as long again as that took (1 to 50 ms). Calls still running then
    /// finish in the background. A master that is not connected answers
    /// [`Error::Unavailable`] at once.
    pub(crate) async fn fan<T, F>(
        &self,
        operation: &'static str,
        only: Option<&[bool]>,
        linger: bool,
        call: F,
        decided: impl Fn(&Answers<T>) -> bool,
    ) -> Answers<T>
    where
        T: Send + 'static,
        F: Fn(usize, Arc<RedisBackend>) -> BoxFuture<'static, Result<T>>,
    {
        self.fan_if(operation, only, linger, false, call, decided)
            .await
    }

    /// [`fan`](Self::fan), also asking a master skipped for its slowness
    /// when `even_slow` (see `Master::get_even_slow`).
    pub(crate) async fn fan_if<T, F>(
        &self,
        operation: &'static str,
        only: Option<&[bool]>,
        linger: bool,
        even_slow: bool,
        call: F,
        decided: impl Fn(&Answers<T>) -> bool,
    ) -> Answers<T>
    where
        T: Send + 'static,
        F: Fn(usize, Arc<RedisBackend>) -> BoxFuture<'static, Result<T>>,
    {
        let mut answers: Answers<T> = self.masters.iter().map(|_| None).collect();
        let mut pending = FuturesUnordered::new();
        for (i, m) in self.masters.iter().enumerate() {
            if only.is_some_and(|o| !o[i]) {
                continue;
            }
            let got = if even_slow {
                m.get_even_slow(operation)
            } else {
                m.get(operation)
            };
            match got {
                Ok(b) => {
                    let (fut, m, limit) = (call(i, b), m.clone(), self.timeout.mul_f32(0.8));
                    let task = tokio::spawn(async move {
                        let started = Instant::now();
                        let r = fut.await;
                        if r.is_err() && started.elapsed() >= limit {
                            m.mark_slow();
                        }
                        r
                    });
                    pending.push(async move { (i, task.await) });
                }
                Err(e) => answers[i] = Some(Err(e)),
            }
        }
        let failed = |e: tokio::task::JoinError| {
            Err(Error::Store {
                backend: BACKEND,
                operation,
                message: format!("a Redlock call failed: {e}"),
                source: None,
            })
        };
        let start = Instant::now();
        while !decided(&answers) {
            let Some((i, r)) = pending.next().await else {
                return answers;
            };
            answers[i] = Some(r.unwrap_or_else(failed));
        }
        if linger {
            // Give the masters still out as long again as the decision
            // took (1 to 50 ms), so that on a healthy deployment every
            // master takes part in the step.
            let more = start
                .elapsed()
                .clamp(Duration::from_millis(1), Duration::from_millis(50));
            let until = tokio::time::Instant::now() + more;
            while let Ok(Some((i, r))) = tokio::time::timeout_at(until, pending.next()).await {
                answers[i] = Some(r.unwrap_or_else(failed));
            }
        }
        answers
    }

    /// The error of a step that fewer than a quorum of masters answered.
    pub(crate) fn no_quorum<T>(&self, operation: &'static str, answers: &Answers<T>) -> Error {
        let ok = answers.iter().filter(|a| matches!(a, Some(Ok(_)))).count();
        // What each master that did not answer said, so that one outage
        // is told apart from several.
        let failed: Vec<String> = answers
            .iter()
            .zip(&self.masters)
            .filter_map(|(a, m)| match a {
                Some(Err(e)) => Some(format!("{}: {e}", m.endpoint)),
                None => Some(format!("{}: no answer yet", m.endpoint)),
                Some(Ok(_)) => None,
            })
            .collect();
        Error::Unavailable {
            backend: BACKEND,
            operation,
            message: format!(
                "only {ok} of {} Redlock masters answered; a quorum of {} is needed ({})",
                self.masters.len(),
                self.quorum,
                failed.join("; ")
            ),
            source: None,
        }
    }
}
