//! # coord-sim
//!
//! A seeded deterministic simulator for coord. It runs coord-core's real
//! client code (the [`Coord`] facade: locks, semaphores, read-write locks,
//! work queues, their guards,
//! watchdogs, wait loops and cleanups) on a single-threaded tokio runtime
//! with paused time, over the in-memory store behind a seeded fault layer
//! ([`store::SimStore`]): delayed requests and replies, lost requests, lost
//! replies after the store applied the request, late copies that land after
//! their caller gave up, and client pauses that outlive TTLs.
//!
//! A seeded workload ([`workload`]) drives several clients, each with
//! several tasks, through random acquires (single attempts, waits,
//! cancellations), extends, releases and drops, of locks, a lease,
//! semaphores, read-write locks and work queues; odd seeds also run the
//! election, barrier and rate-limiter workloads of `conformance::faults`
//! on clients of their own ([`more_work`]). The history is judged by
//! the conformance suite's checkers (one valid lock holder at a time,
//! tokens rising, fenced writes chaining; never more semaphore permits held
//! than exist), and once the faults stop, every lock and the semaphore must
//! be granted again within a bound ([`check`]).
//!
//! One seed gives one history: the run's trace has one digest per seed
//! ([`run_seed`] twice with the same seed gives the same
//! [`SeedReport::digest`]).
#![deny(missing_docs)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::faults::history::FencedResource;
use conformance::faults::queue::Effects;
use coord_core::Coord;
use coord_memory::MemoryBackend;

pub mod check;
pub mod more_work;
pub mod queue_work;
pub mod store;
pub mod store_more;
pub mod store_queue;
pub mod workload;
pub mod world;

pub use check::Violation;
pub use workload::Shape;
pub use world::{FaultRates, World};

/// The outcome of one seed.
#[derive(Debug, Clone)]
pub struct SeedReport {
    /// The seed.
    pub seed: u64,
    /// The digest of the run's trace: equal for equal seeds.
    pub digest: u64,
    /// The rules the history broke.
    pub violations: Vec<Violation>,
    /// The trace's lines (only when asked to keep them).
    pub trace: Vec<String>,
    /// How many grants (locks and permits) the workload recorded.
    pub grants: usize,
    /// How many trace lines the run logged.
    pub events: usize,
    /// Simulated time the run took.
    pub simulated: Duration,
}

/// Options of one run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// The workload's shape.
    pub shape: Shape,
    /// The fault rates.
    pub rates: FaultRates,
    /// Keep the trace's lines in the report.
    pub keep_trace: bool,
}

/// A client's [`Coord`] over the shared store, through its own fault
/// layer.
pub fn client(client: usize, world: &Arc<World>, store: &Arc<MemoryBackend>) -> Coord {
    let sim = Arc::new(store::SimStore::new(client, world.clone(), store.clone()));
    let caps = coord_core::Lock::capabilities(&*sim).clone();
    Coord::builder(caps)
        .lock(sim.clone())
        .lease(sim.clone())
        .election(sim.clone())
        .barrier(sim.clone())
        .limiter(sim.clone())
        .semaphore(sim.clone())
        .queue(sim)
        .build()
        .with_poll_interval(Duration::from_millis(500))
}

/// Run one seed to completion on a fresh current-thread runtime with
/// paused time, on this thread.
pub fn run_seed(seed: u64, opts: Options) -> SeedReport {
    // The core's own randomness (owner tokens, jitter) comes from the seed.
    coord_core::rng::seed_thread(seed ^ 0x9e37_79b9_7f4a_7c15);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let report = rt.block_on(run(seed, opts));
    drop(rt);
    coord_core::rng::unseed_thread();
    report
}

async fn run(seed: u64, opts: Options) -> SeedReport {
    let world = Arc::new(World::new(seed, opts.rates, opts.keep_trace));
    let store = Arc::new(MemoryBackend::new());
    let resources = Arc::new([
        FencedResource::new(),
        FencedResource::new(),
        FencedResource::new(),
    ]);
    let recorded = Arc::new(Mutex::new(workload::Recorded::default()));
    let effects = Arc::new(Effects::default());
    let end = world.start() + opts.shape.duration;
    world.log(format!("seed {seed} {:?}", opts.shape));
    let mut handles = Vec::new();
    for c in 0..opts.shape.clients {
        let coord = client(c, &world, &store);
        let (locks, leases, sems, rw, queues) = workload::facades(&coord);
        if c == 0 {
            handles.push(tokio::spawn(queue_work::produce(
                world.clone(),
                queues.clone(),
                recorded.clone(),
                end,
            )));
        }
        for t in 0..opts.shape.tasks {
            let task = workload::Task {
                id: c * 10 + t,
                world: world.clone(),
                locks: locks.clone(),
                leases: leases.clone(),
                sems: sems.clone(),
                rw: rw.clone(),
                queues: queues.clone(),
                effects: effects.clone(),
                resources: resources.clone(),
                recorded: recorded.clone(),
                end,
            };
            handles.push(tokio::spawn(task.run()));
        }
    }
    // Odd seeds also run the election, barrier and limiter workloads (half
    // the seeds, so a budget of seeds costs about what it did without).
    let more = (seed % 2 == 1).then(|| more_work::spawn(&world, &store, opts.shape.duration, end));
    for _ in 0..world.range(0, opts.rates.restarts) {
        let (w, at) = (
            world.clone(),
            world.millis(0, opts.shape.duration.as_millis() as u64),
        );
        let len = world.millis(200, 2500);
        tokio::spawn(async move {
            tokio::time::sleep(at).await;
            if w.faults_on() {
                w.restart(len);
            }
        });
    }
    tokio::time::sleep_until(end).await;
    world.heal();
    // The probe starts as the faults stop, while the tasks wind down
    // (none starts a new operation).
    let probe = tokio::spawn(check::liveness(world.clone(), client(99, &world, &store)));
    for h in handles {
        if let Err(e) = h.await {
            world.log(format!("task panicked: {e}"));
        }
    }
    let drained = queue_work::drain(&world, &client(98, &world, &store), &effects).await;
    let (mut violations, grants) = {
        let rec = recorded.lock().unwrap_or_else(|p| p.into_inner());
        let grants = rec.grants.iter().map(Vec::len).sum::<usize>()
            + rec.permits.len()
            + rec.rw.len()
            + rec.deliveries.len();
        let mut v = check::history(&rec, &resources, world.start());
        v.extend(check::queue(&rec, &effects, &drained, world.start()));
        (v, grants)
    };
    if let Some(more) = more {
        violations.extend(more_work::judge(more, &world).await);
    }
    match probe.await {
        Ok(v) => violations.extend(v),
        Err(e) => world.log(format!("probe panicked: {e}")),
    }
    // Some checkers list what they found in hash order: sort, so the
    // trace (and its digest) stays one per seed.
    violations.sort_by_key(|v| v.to_string());
    for v in &violations {
        world.log(format!("VIOLATION {v}"));
    }
    SeedReport {
        seed,
        digest: world.digest(),
        violations,
        trace: world.lines(),
        events: world.events(),
        grants,
        simulated: world.elapsed(),
    }
}
