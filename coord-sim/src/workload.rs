//! The seeded workload: several clients, each its own [`Coord`] over the
//! shared store, each running several tasks of random operations on a few
//! lock names and one semaphore, with cancellations at random points.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::faults::history::{FencedResource, Grant};
use conformance::faults::permits::PermitGrant;
use conformance::faults::queue::{Effects, QueueDelivery};
use coord_core::{
    Coord, Guard, Leases, LockOptions, Locks, PermitOptions, Queues, RW_PERMITS, RwLocks,
    Semaphores,
};
use tokio::time::Instant;

use crate::world::World;

/// The claims the workload uses: two locks and a lease (the last).
pub const CLAIM_NAMES: [&str; 3] = ["lock-a", "lock-b", "lease-c"];
/// The index of the lease in [`CLAIM_NAMES`].
pub const LEASE: usize = 2;
/// The semaphore the workload uses.
pub const SEM_NAME: &str = "sem";
/// The semaphore's `permits_total`.
pub const SEM_TOTAL: u32 = 3;
/// The read-write lock the workload uses.
pub const RW_NAME: &str = "rw";
/// The TTLs operations draw from.
pub const TTLS: [u64; 4] = [150, 400, 1000, 2000];

/// The shape of one run.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// How many clients (each its own `Coord` and fault draws).
    pub clients: usize,
    /// How many tasks each client runs at once.
    pub tasks: usize,
    /// How long the faulty phase lasts (simulated).
    pub duration: Duration,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            clients: 3,
            tasks: 2,
            duration: Duration::from_secs(20),
        }
    }
}

/// What the workload recorded.
#[derive(Default)]
pub struct Recorded {
    /// Lock and lease grants, per name (index into [`CLAIM_NAMES`]).
    pub grants: [Vec<Grant>; 3],
    /// Semaphore grants.
    pub permits: Vec<PermitGrant>,
    /// Read-write lock grants (a reader weighs 1, a writer all of
    /// [`RW_PERMITS`]).
    pub rw: Vec<PermitGrant>,
    /// Queue deliveries.
    pub deliveries: Vec<QueueDelivery>,
    /// The messages whose push was answered.
    pub pushed: HashSet<u64>,
    /// Acks and nacks sent after their delivery's visibility lapsed that
    /// the store accepted (each a violation).
    pub stale_accepted: Vec<String>,
}

/// Everything one task needs.
#[derive(Clone)]
pub struct Task {
    /// The task's id in histories (client * 10 + task).
    pub id: usize,
    /// The world.
    pub world: Arc<World>,
    /// The client's locks.
    pub locks: Locks,
    /// The client's leases.
    pub leases: Leases,
    /// The client's semaphores.
    pub sems: Semaphores,
    /// The client's read-write locks.
    pub rw: RwLocks,
    /// The client's work queues.
    pub queues: Queues,
    /// The per-message fenced registers queue deliveries apply to.
    pub effects: Arc<Effects>,
    /// The fenced resources, per claim name.
    pub resources: Arc<[FencedResource; 3]>,
    /// Where grants are recorded.
    pub recorded: Arc<Mutex<Recorded>>,
    /// When the faulty phase ends: no new operation starts after it.
    pub end: Instant,
}

/// The facades of client `coord` the workload uses.
pub fn facades(coord: &Coord) -> (Locks, Leases, Semaphores, RwLocks, Queues) {
    (
        coord.locks().expect("sim store has locks"),
        coord.leases().expect("sim store has leases"),
        coord.semaphores().expect("sim store has semaphores"),
        coord.rw_locks().expect("sim store has FIFO semaphores"),
        coord.queues().expect("sim store has queues"),
    )
}

impl Task {
    /// Run random operations until the faulty phase ends.
    pub async fn run(self) {
        while Instant::now() < self.end {
            match self.world.range(0, 13) {
                0..=5 => self.lock_op().await,
                6..=8 => self.sem_op().await,
                9..=10 => self.rw_op().await,
                11..=12 => self.queue_op().await,
                _ => tokio::time::sleep(self.world.millis(1, 300)).await,
            }
        }
    }

    pub(crate) fn log(&self, s: String) {
        self.world.log(format!("t{} {s}", self.id));
    }

    async fn lock_op(&self) {
        let w = &self.world;
        let i = w.range(0, 2) as usize;
        let name = CLAIM_NAMES[i];
        let ttl = Duration::from_millis(w.pick(&TTLS));
        let wait = w.pick(&[0, 0, 200, 1000, 3000]);
        let watchdog = w.chance(0.3);
        let cancel = w.chance(0.25).then(|| w.millis(1, 1500));
        let opts = LockOptions::new(ttl)
            .wait(Duration::from_millis(wait))
            .watchdog(watchdog);
        self.log(format!(
            "acquire {name} ttl={}ms wait={wait}ms watchdog={watchdog} cancel={cancel:?}",
            ttl.as_millis()
        ));
        let asked = Instant::now();
        // A lease is granted in one attempt (no wait), its watchdog
        // started on the guard.
        let acquire = async {
            if i != LEASE {
                return self.locks.acquire_with(name, opts).await.map(Some);
            }
            let granted = self.leases.grant(name, ttl).await?;
            Ok(granted.map(|g| if watchdog { g.with_watchdog() } else { g }))
        };
        let r = match cancel {
            Some(c) => match tokio::time::timeout(c, acquire).await {
                Ok(r) => r,
                Err(_) => {
                    self.log(format!("acquire {name} cancelled"));
                    return;
                }
            },
            None => acquire.await,
        };
        let guard = match r {
            Ok(Some(g)) => g,
            Ok(None) => {
                self.log(format!("acquire {name} held"));
                return;
            }
            Err(e) => {
                self.log(format!("acquire {name} failed: {}", kind(&e)));
                return;
            }
        };
        let granted = Instant::now();
        let token = guard.fencing_token().get();
        self.log(format!("granted {name} token={token}"));
        let valid_until = self.hold(&guard, i, token).await;
        self.recorded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .grants[i]
            .push(Grant {
                client: self.id,
                token,
                asked,
                granted,
                valid_until,
            });
        self.finish(guard, name).await;
    }

    /// Work under `guard`: a few fenced read-modify-writes, with pauses,
    /// extends and validity checks. Returns when the task stopped relying
    /// on it (capped by the guard's local validity deadline).
    async fn hold(&self, guard: &Guard, i: usize, token: u64) -> Instant {
        let w = &self.world;
        let res = &self.resources[i];
        for _ in 0..w.range(1, 3) {
            tokio::time::sleep(w.millis(0, guard.ttl().as_millis() as u64 / 2)).await;
            if !guard.is_valid() {
                self.log(format!("guard token={token} no longer valid"));
                break;
            }
            let Some(v) = res.read(self.id, token) else {
                self.log(format!("read under {token} refused"));
                break;
            };
            if w.chance(0.2) {
                let ttl = Duration::from_millis(w.pick(&TTLS));
                let c = w.millis(1, 600);
                let r = tokio::time::timeout(c, guard.extend(ttl)).await;
                self.log(format!(
                    "extend token={token} ttl={}ms -> {}",
                    ttl.as_millis(),
                    match &r {
                        Ok(Ok(())) => "ok".to_string(),
                        Ok(Err(e)) => kind(e),
                        Err(_) => "cancelled".to_string(),
                    }
                ));
            }
            if w.chance(0.05) {
                // A pause between the check and the write (a GC pause):
                // fencing must refuse the write if the guard ran out.
                tokio::time::sleep(guard.ttl() + w.millis(0, 500)).await;
            }
            let ok = res.write(self.id, token, v, v + 1);
            self.log(format!("write {} under {token}: {ok}", v + 1));
        }
        Instant::now().min(guard.valid_until())
    }

    /// End a guard: release (maybe cancelled), or drop it.
    async fn finish(&self, guard: Guard, what: &str) {
        let w = &self.world;
        match w.range(0, 3) {
            0 => {
                self.log(format!("drop {what}"));
                drop(guard);
            }
            1 => {
                let r = tokio::time::timeout(w.millis(1, 400), guard.release()).await;
                self.log(format!(
                    "release {what} (may be cancelled): {}",
                    outcome(&r)
                ));
            }
            _ => {
                let r = guard.release().await;
                self.log(format!("release {what}: {}", outcome::<()>(&Ok(r))));
            }
        }
    }

    async fn sem_op(&self) {
        let w = &self.world;
        let n = w.range(1, 2) as u32;
        let ttl = Duration::from_millis(w.pick(&TTLS));
        let wait = w.pick(&[0, 300, 1500, 4000]);
        let cancel = w.chance(0.25).then(|| w.millis(1, 2000));
        let opts = PermitOptions::new(SEM_TOTAL, ttl)
            .permits(n)
            .wait(Duration::from_millis(wait))
            .watchdog(w.chance(0.3));
        self.log(format!(
            "sem acquire n={n} ttl={}ms wait={wait}ms cancel={cancel:?}",
            ttl.as_millis()
        ));
        let asked = Instant::now();
        let r = match cancel {
            Some(c) => {
                match tokio::time::timeout(c, self.sems.acquire_with(SEM_NAME, opts)).await {
                    Ok(r) => r,
                    Err(_) => {
                        self.log("sem acquire cancelled".into());
                        return;
                    }
                }
            }
            None => self.sems.acquire_with(SEM_NAME, opts).await,
        };
        let permit = match r {
            Ok(p) => p,
            Err(e) => {
                self.log(format!("sem acquire failed: {}", kind(&e)));
                return;
            }
        };
        let granted = Instant::now();
        let token = permit.fencing_token().get();
        self.log(format!("sem granted n={n} token={token}"));
        tokio::time::sleep(w.millis(0, ttl.as_millis() as u64)).await;
        if w.chance(0.2) {
            let r = tokio::time::timeout(w.millis(1, 600), permit.extend(ttl)).await;
            self.log(format!("sem extend token={token}: {}", outcome(&r)));
            tokio::time::sleep(w.millis(0, ttl.as_millis() as u64)).await;
        }
        let valid_until = Instant::now().min(permit.valid_until());
        self.recorded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .permits
            .push(PermitGrant {
                client: self.id,
                token,
                weight: n,
                asked,
                granted,
                valid_until,
            });
        self.finish(permit.into_guard(), SEM_NAME).await;
    }
}

impl Task {
    async fn rw_op(&self) {
        let w = &self.world;
        let write = w.chance(0.4);
        let ttl = Duration::from_millis(w.pick(&TTLS));
        let wait = Duration::from_millis(w.pick(&[0, 300, 1500, 4000]));
        let cancel = w.chance(0.25).then(|| w.millis(1, 2000));
        let mode = if write { "write" } else { "read" };
        self.log(format!(
            "rw {mode} ttl={}ms wait={}ms cancel={cancel:?}",
            ttl.as_millis(),
            wait.as_millis()
        ));
        let asked = Instant::now();
        let op = async {
            if write {
                self.rw.write(RW_NAME, ttl, wait).await
            } else {
                self.rw.read(RW_NAME, ttl, wait).await
            }
        };
        let r = match cancel {
            Some(c) => match tokio::time::timeout(c, op).await {
                Ok(r) => r,
                Err(_) => {
                    self.log(format!("rw {mode} cancelled"));
                    return;
                }
            },
            None => op.await,
        };
        let guard = match r {
            Ok(g) => g,
            Err(e) => {
                self.log(format!("rw {mode} failed: {}", kind(&e)));
                return;
            }
        };
        let granted = Instant::now();
        let token = guard.fencing_token().get();
        self.log(format!("rw {mode} granted token={token}"));
        tokio::time::sleep(w.millis(0, ttl.as_millis() as u64)).await;
        let valid_until = Instant::now().min(guard.valid_until());
        let weight = if write { RW_PERMITS } else { 1 };
        self.recorded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .rw
            .push(PermitGrant {
                client: self.id,
                token,
                weight,
                asked,
                granted,
                valid_until,
            });
        self.finish(guard.into_guard(), RW_NAME).await;
    }
}

/// A short name for an error's kind, for the trace.
pub fn kind(e: &coord_core::Error) -> String {
    let s = format!("{e:?}");
    s.split([' ', '{', '(']).next().unwrap_or("?").to_string()
}

fn outcome<E>(r: &Result<coord_core::Result<()>, E>) -> String {
    match r {
        Ok(Ok(())) => "ok".into(),
        Ok(Err(e)) => kind(e),
        Err(_) => "cancelled".into(),
    }
}
