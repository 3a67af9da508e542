//! coord's side of every row, the same for every store: it only needs a
//! URL or a connected [`Coord`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use coord::{Algorithm, Coord, Error, Guard, Locks, Quota};

use crate::measure::{self, Handoff, Stats, Window};

/// Lock TTL everywhere: far longer than any row, so nothing expires.
pub const TTL: Duration = Duration::from_secs(30);
/// How long one wait for a contended lock lasts before it is retried.
pub const WAIT: Duration = Duration::from_secs(1);
/// Waiting tasks at each release in the handoff rows.
pub const WAITERS: usize = 8;
/// How long a handoff holder keeps the lock, so the others are queued.
pub const HOLD: Duration = Duration::from_millis(1);
/// The task counts of the throughput rows.
pub const TASKS: [usize; 2] = [1, 32];

/// The store's round trip with `op` (one trivial request): back to back,
/// and each after [`HOLD`] with nothing in flight (as a handoff starts;
/// see [`measure::after_idle`]).
pub async fn rtt_pair<O: measure::Op + Clone>(op: O, win: Window) -> (Stats, Stats) {
    let busy = measure::throughput(vec![op.clone()], win).await;
    let idle = measure::after_idle(op, win, HOLD).await;
    (busy, idle)
}

/// A name no earlier run of this program used (state left by a crashed
/// run cannot get in the way).
pub fn fresh(what: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "bench-{}-{what}-{}",
        std::process::id(),
        N.fetch_add(1, Relaxed)
    )
}

/// A quota so large that every check of a run is allowed: GCRA at 10^8
/// per minute. (Quotas whose limit × window in µs passes 2^53 take the
/// limiter's exact digit-array arithmetic, which costs the server more;
/// this one, like any usual quota, stays in exact double arithmetic.)
pub fn huge_quota() -> Quota {
    Quota::new(100_000_000, Duration::from_secs(60), Algorithm::Gcra)
}

/// Uncontended lock cycles (`try_acquire` + `release`) through one
/// client, each of `tasks` tasks on its own lock name.
pub async fn cycle(coord: &Coord, tasks: usize, win: Window) -> Stats {
    let ops = (0..tasks)
        .map(|_| {
            let locks = coord.locks().expect("locks");
            let name: Arc<str> = fresh("cycle").into();
            move || {
                let (locks, name) = (locks.clone(), name.clone());
                async move {
                    let g = locks
                        .try_acquire(&name, TTL)
                        .await
                        .expect("try_acquire")
                        .expect("uncontended lock is free");
                    g.release().await.expect("release");
                }
            }
        })
        .collect();
    measure::throughput(ops, win).await
}

/// Limiter checks (GCRA, always allowed) through one client, each of
/// `tasks` tasks on its own key.
pub async fn check(coord: &Coord, tasks: usize, win: Window) -> Stats {
    let ops = (0..tasks)
        .map(|_| {
            let limiter = coord.limiter().expect("limiter");
            let key: Arc<str> = fresh("check").into();
            move || {
                let (limiter, key) = (limiter.clone(), key.clone());
                async move {
                    let d = limiter.check(&key, huge_quota()).await.expect("check");
                    assert!(d.allowed, "the huge quota admits everything");
                }
            }
        })
        .collect();
    measure::throughput(ops, win).await
}

/// A handoff waiter going through coord's `Locks::acquire`.
pub struct CoordWaiter {
    /// The locks of this waiter's client.
    locks: Locks,
    /// The contended name.
    name: Arc<str>,
}

impl Handoff for CoordWaiter {
    type Held = Guard;

    async fn acquire(&mut self) -> Option<Guard> {
        match self.locks.acquire(&self.name, TTL, WAIT).await {
            Ok(g) => Some(g),
            Err(Error::Timeout { .. }) => None,
            Err(e) => panic!("acquire: {e}"),
        }
    }

    async fn release(&mut self, held: Guard) {
        held.release().await.expect("release");
    }
}

/// Handoff with every waiter on its own client (`connect(url)` each).
pub async fn handoff_separate(url: &str, win: Window) -> Stats {
    let name: Arc<str> = fresh("handoff").into();
    let mut waiters = Vec::new();
    for _ in 0..=WAITERS {
        let coord = coord::connect(url).await.expect("connect");
        let locks = coord.locks().expect("locks");
        waiters.push(CoordWaiter {
            locks,
            name: name.clone(),
        });
    }
    measure::handoff(waiters, win, HOLD).await
}

/// Handoff with every waiter on one shared client.
pub async fn handoff_shared(coord: &Coord, win: Window) -> Stats {
    let name: Arc<str> = fresh("handoff").into();
    let waiters = (0..=WAITERS)
        .map(|_| CoordWaiter {
            locks: coord.locks().expect("locks"),
            name: name.clone(),
        })
        .collect();
    measure::handoff(waiters, win, HOLD).await
}

/// The task counts of the work queue rows on one queue (`queue`); the
/// `queue_many` row runs the larger count spread over as many queues.
pub const QUEUE_TASKS: [usize; 2] = [1, 16];
/// Visibility of the queue rows' deliveries: far longer than any row.
pub const VISIBILITY: Duration = Duration::from_secs(30);

/// The queue rows: (op, tasks, queues): `queue` with each count of
/// [`QUEUE_TASKS`] on one queue, `queue_many` with the largest on as many
/// queues.
pub fn queue_rows() -> [(&'static str, usize, usize); 3] {
    let many = QUEUE_TASKS[1];
    [
        ("queue", QUEUE_TASKS[0], 1),
        ("queue", many, 1),
        ("queue_many", many, many),
    ]
}

/// The queue names of a queue row: `queues` fresh names; task `i` works
/// on name `i % queues`.
pub fn queue_names(queues: usize) -> Vec<Arc<str>> {
    (0..queues).map(|_| fresh("queue").into()).collect()
}

/// Work queue cycles through one client: each of `tasks` tasks pushes a
/// message, pops one (its own or another task's) and acks it, on the
/// queue names of [`queue_names`]. A pop always finds a message: every
/// task pushes before it pops. The queues are purged after the row.
pub async fn queue(coord: &Coord, tasks: usize, queues: usize, win: Window) -> Stats {
    let q = coord.queues().expect("queues");
    let names = queue_names(queues);
    let ops = (0..tasks)
        .map(|i| {
            let (q, name) = (q.clone(), names[i % queues].clone());
            move || {
                let (q, name) = (q.clone(), name.clone());
                async move {
                    q.push(&name, b"m").await.expect("push");
                    let d = q.pop(&name, VISIBILITY, WAIT).await.expect("pop");
                    d.expect("a pushed message is there")
                        .ack()
                        .await
                        .expect("ack");
                }
            }
        })
        .collect();
    let stats = measure::throughput(ops, win).await;
    for name in &names {
        q.purge(name).await.expect("purge");
    }
    stats
}
