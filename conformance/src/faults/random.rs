//! Random fault schedules against real servers (`scripts/faults
//! --random`): every workload of this module's parent (lock, semaphore,
//! read-write lock, work queue, election, barrier, limiter) at once, each
//! on clients of its own behind their own [`FaultProxy`], under a schedule
//! drawn from a seed: at random moments a random set of a workload's
//! proxies drops requests, drops replies, goes dark, adds latency, freezes
//! its open connections or resets them, for a random while, then heals.
//! Each workload is judged by its own checker, as in the fixed scenarios.
//! A run prints its seed; `COORD_FAULT_SEED` replays that schedule (the
//! workloads' own timing still varies with the machine).

use std::future::Future;
use std::time::Duration;

use coord_core::Coord;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::{Instant, sleep};

use super::{
    FaultLog, LockWorkload, PermitKind, run_barrier_workload, run_election_workload,
    run_limiter_workload, run_lock_workload, run_permit_workload, run_queue_workload, scenarios,
};
use crate::testkit::proxy::{FaultProxy, Mode};

/// The seed of this run: `COORD_FAULT_SEED`, or drawn; printed either way.
pub fn seed() -> u64 {
    let seed = std::env::var("COORD_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    println!("random faults: seed {seed} (replay with COORD_FAULT_SEED={seed})");
    seed
}

/// Random faults on `proxies` for `duration`, drawn from `seed`; every
/// fault healed by the end.
pub async fn schedule(proxies: &[FaultProxy], seed: u64, duration: Duration) -> FaultLog {
    let mut rng = StdRng::seed_from_u64(seed);
    let end = Instant::now() + duration;
    let mut injected = 0;
    loop {
        let gap = Duration::from_millis(rng.random_range(100..1500));
        if Instant::now() + gap >= end {
            break;
        }
        sleep(gap).await;
        let n = rng.random_range(1..=proxies.len());
        let first = rng.random_range(0..proxies.len());
        let hit: Vec<&FaultProxy> = (0..n)
            .map(|k| &proxies[(first + k) % proxies.len()])
            .collect();
        let fault = rng.random_range(0..6);
        let latency = Duration::from_millis(rng.random_range(50..400));
        for p in &hit {
            match fault {
                0 => p.set(Mode::DropRequests),
                1 => p.set(Mode::DropReplies),
                2 => p.set(Mode::Blackhole),
                3 => p.latency(latency),
                4 => p.freeze_open(),
                _ => p.reset(),
            }
        }
        injected += 1;
        let left = end.saturating_duration_since(Instant::now());
        sleep(Duration::from_millis(rng.random_range(100..3000)).min(left)).await;
        for p in &hit {
            p.heal();
        }
    }
    sleep(end.saturating_duration_since(Instant::now())).await;
    FaultLog::healed_now(injected)
}

/// Every workload at once for `duration` under random faults drawn from
/// `seed`, on clients made by `proxied(n)` (n clients, each behind a
/// proxy of its own), with claims of `ttl`; each is judged by its checker
/// and must make progress within `bound` of the last heal (it panics with
/// the first broken rule). Prints one `FAULTS` line per workload.
pub async fn every_workload<F, Fut>(
    backend: &str,
    ttl: Duration,
    bound: Duration,
    duration: Duration,
    seed: u64,
    proxied: F,
) where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = (Vec<FaultProxy>, Vec<Coord>)>,
{
    let (lp, lock_clients) = proxied(3).await;
    let (sp, sem_clients) = proxied(3).await;
    let (rp, rw_clients) = proxied(3).await;
    let (qp, queue_clients) = proxied(3).await;
    let (ep, mut election_clients) = proxied(4).await;
    let (bp, barrier_clients) = proxied(3).await;
    let (mp, limiter_clients) = proxied(2).await;
    let observers = election_clients.split_off(3);
    let lock = LockWorkload {
        ttl,
        wait: ttl * 3,
        watchdog: true,
        work: Duration::from_millis(20),
        duration,
    };
    let sem = scenarios::permits(PermitKind::Semaphore { total: 3 }, ttl, duration);
    let rw = scenarios::permits(PermitKind::RwLock { write_every: 3 }, ttl, duration);
    let ((lock, lock_log), (sem, sem_log), (rw, rw_log), (queue, queue_log)) = futures::join!(
        run_lock_workload(
            lock_clients,
            "random-lock",
            lock,
            schedule(&lp, seed, duration)
        ),
        run_permit_workload(
            sem_clients,
            "random-sem",
            sem,
            schedule(&sp, seed ^ 1, duration)
        ),
        run_permit_workload(
            rw_clients,
            "random-rw",
            rw,
            schedule(&rp, seed ^ 2, duration)
        ),
        run_queue_workload(
            queue_clients,
            "random-queue",
            scenarios::queue(ttl, duration),
            schedule(&qp, seed ^ 3, duration)
        ),
    );
    let ((election, election_log), (barrier, barrier_log), (limiter, limiter_log)) = futures::join!(
        run_election_workload(
            election_clients,
            observers,
            "random-election",
            scenarios::election(ttl, duration),
            schedule(&ep, seed ^ 4, duration)
        ),
        run_barrier_workload(
            barrier_clients,
            "random-barrier",
            scenarios::barrier(Duration::from_millis(1500), duration),
            schedule(&bp, seed ^ 5, duration)
        ),
        run_limiter_workload(
            limiter_clients,
            "random-limiter",
            scenarios::limiter(duration),
            schedule(&mp, seed ^ 6, duration)
        ),
    );
    lock.assert_ok("random_lock", backend, lock_log.injected, bound);
    for (scenario, report, log) in [
        ("random_semaphore", sem, sem_log),
        ("random_rwlock", rw, rw_log),
        ("random_queue", queue, queue_log),
        ("random_election", election, election_log),
        ("random_barrier", barrier, barrier_log),
        ("random_limiter", limiter, limiter_log),
    ] {
        report.assert_ok(scenario, backend, log.injected, bound);
    }
}
