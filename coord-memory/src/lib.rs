//! # coord-memory
//!
//! The in-process backend of [coord](https://docs.rs/coord): every
//! primitive on plain data behind short, sharded mutexes, with waiters woken
//! by in-process notifications. It is the embedded default (`memory://`,
//! nothing to install) and the reference model the networked backends are
//! compared against.
//!
//! - One process, one clock: expiry and limiter windows use tokio's
//!   monotonic clock, so tests can pause and advance time
//!   (`#[tokio::test(start_paused = true)]`).
//! - Fencing tokens come from one counter shared by every lock, lease,
//!   election and fencing resource of a store: strictly increasing per name,
//!   but only for the life of the process ([`FencingDurability::Process`]).
//! - Semaphores are FIFO: a request is granted only if it and every
//!   request queued ahead of it fit into the free permits together, so the
//!   head of the queue is never overtaken by smaller later requests, and a
//!   release wakes exactly the waiters it makes grantable.
//! - No lock is held across an `.await`; the uncontended acquire + release
//!   touches one shard mutex twice and wakes nobody.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> coord_core::Result<()> {
//! use std::time::Duration;
//! let coord = coord_memory::connect("memory://")?;
//! let locks = coord.locks()?;
//! let guard = locks.acquire("order:42", Duration::from_secs(30), Duration::ZERO).await?;
//! assert!(locks.try_acquire("order:42", Duration::from_secs(30)).await?.is_none());
//! guard.release().await?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use coord_core::barrier_state::BarrierState;
use coord_core::limit::LimitState;
use coord_core::wake::{Waiter, Wakeups};
use coord_core::{
    Algorithm, Arrival, Attempt, Capabilities, ClaimRecord, Coord, Decision, Deployment, Error,
    FencingDurability, FencingToken, HolderRecord, LeaderInfo, LeaderRecord, OwnerToken,
    PermitRequest, Quota, Result, async_trait,
};
use tokio::time::Instant;

mod barrier;
mod claims;
mod election;
mod health;
mod limiter;
mod list;
mod queue;
mod semaphore;

use semaphore::waiter_key;

const SHARDS: usize = 32;
const SWEEP_EVERY: u32 = 1024;

/// Open the in-memory store named by `url`: `memory://` is the process-wide
/// default store; `memory://NAME` a separate named one. Every call with the
/// same URL in one process shares the same store, so two "clients" of the
/// same URL see each other's locks, as two processes on one server would.
///
/// Errors: [`Error::Config`] for another scheme or a URL with a path,
/// query or credentials.
pub fn connect(url: &str) -> Result<Coord> {
    let rest = url.strip_prefix("memory://").ok_or_else(|| {
        Error::Config(format!(
            "`{url}` is not a memory:// URL; use memory:// or memory://NAME"
        ))
    })?;
    if rest.contains(['/', '?', '@', '#']) {
        return Err(Error::Config(format!(
            "`{url}`: a memory:// URL takes only an optional store name, e.g. memory://tests"
        )));
    }
    Ok(coord_of(store(rest)))
}

/// Every primitive of `backend`, semaphores included.
fn coord_of(backend: Arc<MemoryBackend>) -> Coord {
    Coord::from_backend(backend.clone())
        .with_semaphores(backend.clone())
        .with_lister(backend.clone())
        .with_queues(backend)
}

/// The process-wide store with this name (created on first use).
pub fn store(name: &str) -> Arc<MemoryBackend> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<MemoryBackend>>>> = OnceLock::new();
    let mut stores = STORES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    stores
        .entry(name.to_string())
        .or_insert_with(|| Arc::new(MemoryBackend::new()))
        .clone()
}

/// A shard-per-hash map from names to entries, with an occasional sweep of
/// dead entries so memory stays bounded by what is live.
struct Sharded<T> {
    seed: u64,
    shards: Box<[Mutex<Shard<T>>]>,
}

struct Shard<T> {
    map: HashMap<Box<str>, T>,
    inserts: u32,
}

impl<T> Sharded<T> {
    fn new() -> Self {
        Sharded {
            seed: RandomState::new().hash_one(0u8) | 1,
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        map: HashMap::new(),
                        inserts: 0,
                    })
                })
                .collect(),
        }
    }

    fn shard(&self, name: &str) -> MutexGuard<'_, Shard<T>> {
        // Shard choice needs spread, not flood resistance (each shard's map
        // keeps std's keyed SipHash): FNV-1a over the bytes, seeded per store.
        let mut h = self.seed;
        for b in name.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        let i = (h as usize) % SHARDS;
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).map.len())
            .sum()
    }
}

impl<T> Shard<T> {
    /// The entry for `name`, inserting `make()` if absent; every
    /// `SWEEP_EVERY` inserts, entries for which `dead` holds are dropped.
    fn entry(&mut self, name: &str, make: impl FnOnce() -> T, dead: impl Fn(&T) -> bool) -> &mut T {
        if self.map.contains_key(name) {
            return self.map.get_mut(name).expect("present");
        }
        self.inserts += 1;
        if self.inserts >= SWEEP_EVERY {
            self.inserts = 0;
            self.map.retain(|_, v| !dead(v));
        }
        self.map.entry(name.into()).or_insert_with(make)
    }
}

/// A claim (lock or lease): owner, fencing token, expiry.
struct Claim {
    owner: OwnerToken,
    token: u64,
    expires: Instant,
    meta: Option<Arc<[u8]>>,
}

impl Claim {
    fn live(&self, now: Instant) -> bool {
        self.expires > now
    }
}

/// How long a waiter's place in a semaphore's queue lasts without a new
/// attempt. A waiting acquire attempts again well within it (its
/// `Held { expires_in }` hint is at most [`QUEUE_REFRESH`]), so only an
/// abandoned place, whose cleanup could not run (its runtime went away),
/// lapses; it holds up the waiters behind it for at most this long.
///
/// ```
/// assert!(coord_memory::QUEUE_REFRESH < coord_memory::QUEUE_ENTRY_TTL);
/// ```
pub const QUEUE_ENTRY_TTL: Duration = Duration::from_secs(30);
/// The longest `expires_in` a queued semaphore waiter is told to sleep, so
/// it renews its place before [`QUEUE_ENTRY_TTL`] runs out.
///
/// ```
/// assert_eq!(coord_memory::QUEUE_REFRESH, std::time::Duration::from_secs(10));
/// ```
pub const QUEUE_REFRESH: Duration = Duration::from_secs(10);

/// One grant of a semaphore.
struct SemHolder {
    owner: OwnerToken,
    permits: u32,
    token: u64,
    expires: Instant,
    meta: Option<Arc<[u8]>>,
}

/// One waiter in a semaphore's queue.
struct SemWaiter {
    owner: OwnerToken,
    permits: u32,
    expires: Instant,
}

/// A semaphore: its total, its grants, its FIFO queue of waiters.
struct Sem {
    total: u32,
    holders: Vec<SemHolder>,
    queue: VecDeque<SemWaiter>,
}

impl Sem {
    fn prune(&mut self, now: Instant) {
        self.holders.retain(|h| h.expires > now);
        self.queue.retain(|w| w.expires > now);
    }

    fn idle(&self, now: Instant) -> bool {
        self.holders.iter().all(|h| h.expires <= now) && self.queue.iter().all(|w| w.expires <= now)
    }

    fn free(&self) -> u32 {
        coord_core::permits::free(self.total, self.holders.iter().map(|h| h.permits))
    }

    /// The queued owners that can be granted now
    /// ([`coord_core::permits::grantable`]).
    fn grantable(&self) -> Vec<OwnerToken> {
        let queue = self.queue.iter().map(|w| (w.owner, w.permits));
        coord_core::permits::grantable(self.free(), queue)
    }
}

struct Leader {
    owner: OwnerToken,
    candidate: String,
    term: u64,
    expires: Instant,
}

/// The in-memory backend. Implements every coord-core trait, semaphores
/// (FIFO) and work queues included.
pub struct MemoryBackend {
    caps: Capabilities,
    epoch: Instant,
    counter: AtomicU64,
    locks: Sharded<Claim>,
    leases: Sharded<Claim>,
    elections: Sharded<Option<Leader>>,
    barriers: Sharded<BarrierState>,
    limits: Sharded<LimitState>,
    semaphores: Sharded<Sem>,
    queues: Sharded<coord_core::queue_state::QueueState>,
    lock_wakeups: Wakeups,
    semaphore_wakeups: Wakeups,
    election_wakeups: Wakeups,
    barrier_wakeups: Wakeups,
    queue_wakeups: Wakeups,
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("fencing_counter", &self.counter.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBackend {
    /// A fresh, empty store (not shared with [`connect`]'s stores).
    pub fn new() -> Self {
        let mut caps = Capabilities::new("memory");
        caps.min_ttl = Duration::from_millis(1);
        caps.ttl_granularity = Duration::from_millis(1);
        caps.fair = false;
        caps.fencing = FencingDurability::Process;
        caps.server_clock = true;
        caps.notifications = true;
        caps.deployment = Deployment::Embedded;
        MemoryBackend {
            caps,
            epoch: Instant::now(),
            counter: AtomicU64::new(0),
            locks: Sharded::new(),
            leases: Sharded::new(),
            elections: Sharded::new(),
            barriers: Sharded::new(),
            limits: Sharded::new(),
            semaphores: Sharded::new(),
            queues: Sharded::new(),
            lock_wakeups: Wakeups::new(),
            semaphore_wakeups: Wakeups::new(),
            election_wakeups: Wakeups::new(),
            barrier_wakeups: Wakeups::new(),
            queue_wakeups: Wakeups::new(),
        }
    }

    /// How many entries (claims, leaderships, barriers, limiter states) the
    /// store keeps. Idle entries are swept as new names come in, so this
    /// stays bounded by what is live plus one sweep interval per shard.
    pub fn stored_entries(&self) -> usize {
        self.locks.len()
            + self.leases.len()
            + self.elections.len()
            + self.barriers.len()
            + self.limits.len()
            + self.semaphores.len()
            + self.queues.len()
    }

    /// A [`Coord`] handle over a fresh, private store.
    pub fn coord() -> Coord {
        coord_of(Arc::new(MemoryBackend::new()))
    }

    /// Wake the queued semaphore waiters of `name` that can be granted now.
    fn wake_grantable(&self, name: &str, owners: Vec<OwnerToken>) {
        for o in owners {
            self.semaphore_wakeups.notify_one(&waiter_key(name, &o));
        }
    }

    fn next_token(&self) -> u64 {
        self.counter.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn claim_attempt(
        &self,
        map: &Sharded<Claim>,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
        meta: Option<&[u8]>,
    ) -> Attempt {
        let now = Instant::now();
        let mut shard = map.shard(name);
        let fresh = || Claim {
            owner: *owner,
            token: 0,
            expires: now,
            meta: None,
        };
        let c = shard.entry(name, fresh, |c| !c.live(now));
        if c.live(now) && c.owner != *owner {
            return Attempt::Held {
                expires_in: Some(c.expires - now),
            };
        }
        if !(c.live(now) && c.owner == *owner) {
            c.owner = *owner;
            c.token = self.next_token();
            c.meta = meta.map(Arc::from);
        }
        c.expires = now + ttl;
        Attempt::Granted(FencingToken(c.token))
    }

    fn claim_inspect(map: &Sharded<Claim>, name: &str) -> ClaimRecord {
        let now = Instant::now();
        let shard = map.shard(name);
        let holders = shard
            .map
            .get(name)
            .filter(|c| c.live(now))
            .map(|c| HolderRecord {
                owner: c.owner,
                token: FencingToken(c.token),
                remaining: Some(c.expires - now),
                metadata: c.meta.as_ref().map(|m| m.to_vec()),
                permits: 1,
            })
            .into_iter()
            .collect();
        ClaimRecord {
            holders,
            waiters: None,
        }
    }

    fn claim_extend(map: &Sharded<Claim>, name: &str, owner: &OwnerToken, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut shard = map.shard(name);
        match shard.map.get_mut(name) {
            Some(c) if c.live(now) && c.owner == *owner => {
                c.expires = now + ttl;
                true
            }
            _ => false,
        }
    }

    fn claim_release(map: &Sharded<Claim>, name: &str, owner: Option<&OwnerToken>) -> bool {
        let now = Instant::now();
        let mut shard = map.shard(name);
        // Remove first (one lookup on the common path), put back if it was
        // not ours to remove.
        match shard.map.remove_entry(name) {
            Some((k, c)) => {
                let ours = c.live(now) && owner.is_none_or(|o| c.owner == *o);
                if !ours && c.live(now) {
                    shard.map.insert(k, c);
                }
                ours
            }
            None => false,
        }
    }
}
