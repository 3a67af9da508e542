//! The fault suite's workloads on the in-memory store. It has no network
//! or server to break, so it runs them under contention with short TTLs
//! and no watchdog (holders whose work outlasts the TTL are fenced off),
//! and proves the checker catches a lock that is not exclusive. The
//! election, barrier and limiter workloads run on the healthy store with
//! the same checkers the networked stores' fault scenarios use.

use std::sync::Arc;
use std::time::Duration;

use conformance::faults::{
    BarrierWorkload, ElectionWorkload, FaultLog, LimiterWorkload, LockWorkload,
    run_barrier_workload, run_election_workload, run_limiter_workload, run_lock_workload, schedule,
};
use coord_core::{
    Algorithm, Attempt, Capabilities, Coord, OwnerToken, Quota, Result, Step, async_trait,
};
use coord_memory::MemoryBackend;

fn clients(backend: &Arc<MemoryBackend>, n: usize) -> Vec<Coord> {
    (0..n)
        .map(|_| Coord::from_backend(backend.clone()))
        .collect()
}

/// 8 clients on one name; half the critical sections outlast the TTL, so
/// locks expire under their holders: no two valid holders, no lost update.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_workload_with_expiring_holders() {
    let backend = Arc::new(MemoryBackend::new());
    let w = LockWorkload {
        ttl: Duration::from_millis(30),
        wait: Duration::from_secs(5),
        watchdog: false,
        work: Duration::from_millis(20),
        duration: schedule(Duration::from_secs(3)),
    };
    let (report, log) = run_lock_workload(clients(&backend, 8), "mem-faults", w, async {
        FaultLog::default()
    })
    .await;
    report.assert_ok(
        "expiring-holders",
        "memory",
        log.injected,
        Duration::from_secs(2),
    );
}

/// A broken lock that grants everyone: the checker must see overlapping
/// holders and lost updates (a checker that cannot fail proves nothing).
struct GrantsEveryone {
    inner: Arc<MemoryBackend>,
    next: std::sync::atomic::AtomicU64,
}

#[async_trait]
impl coord_core::Lock for GrantsEveryone {
    fn capabilities(&self) -> &Capabilities {
        coord_core::Lock::capabilities(&*self.inner)
    }
    async fn try_acquire(&self, _n: &str, _step: Step, _t: Duration) -> Result<Attempt> {
        let t = self.next.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        Ok(Attempt::Granted(coord_core::FencingToken(t)))
    }
    async fn release(&self, _n: &str, _step: Step) -> Result<bool> {
        Ok(true)
    }
    async fn extend(&self, _n: &str, _step: Step, _t: Duration) -> Result<bool> {
        Ok(true)
    }
    async fn force_release(&self, _n: &str) -> Result<bool> {
        Ok(true)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_checker_catches_a_lock_that_is_not_exclusive() {
    let inner = Arc::new(MemoryBackend::new());
    let broken = Arc::new(GrantsEveryone {
        inner: inner.clone(),
        next: Default::default(),
    });
    let clients: Vec<Coord> = (0..4)
        .map(|_| {
            Coord::builder(coord_core::Lock::capabilities(&*inner).clone())
                .lock(broken.clone())
                .build()
        })
        .collect();
    let w = LockWorkload {
        ttl: Duration::from_secs(1),
        wait: Duration::from_secs(1),
        watchdog: false,
        work: Duration::from_millis(5),
        duration: Duration::from_millis(500),
    };
    let (report, _) = run_lock_workload(clients, "broken", w, async { FaultLog::default() }).await;
    let rules: Vec<&str> = report.violations.iter().map(|v| v.rule).collect();
    assert!(
        rules.contains(&"one valid holder at a time"),
        "overlapping holders not caught: {rules:?}"
    );
}

/// 4 candidates and 2 observers; leaderships of 30 ms with 20 ms of work
/// and no renewal, so some expire under their leader (fenced off): one
/// leader per term, terms rising, observe never going back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn election_workload_with_expiring_leaders() {
    let backend = Arc::new(MemoryBackend::new());
    let w = ElectionWorkload {
        ttl: Duration::from_millis(30),
        wait: Duration::from_secs(2),
        keep_alive: false,
        work: Duration::from_millis(20),
        duration: schedule(Duration::from_secs(3)),
    };
    let (report, log) = run_election_workload(
        clients(&backend, 4),
        clients(&backend, 2),
        "mem-election",
        w,
        async { FaultLog::default() },
    )
    .await;
    report.assert_ok(
        "election-expiring-leaders",
        "memory",
        log.injected,
        Duration::from_secs(1),
    );
}

/// 5 participants pass generation after generation of one barrier.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn barrier_workload() {
    let backend = Arc::new(MemoryBackend::new());
    let w = BarrierWorkload {
        timeout: Duration::from_secs(2),
        duration: schedule(Duration::from_secs(3)),
    };
    let (report, log) = run_barrier_workload(clients(&backend, 5), "mem-barrier", w, async {
        FaultLog::default()
    })
    .await;
    report.assert_ok("barrier", "memory", log.injected, Duration::from_secs(1));
    assert!(report.ops > 50, "only {} generations", report.ops);
}

/// 4 clients hammer one key, fixed window then sliding log: reported
/// admissions never exceed the quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn limiter_workload() {
    let runs = [
        (Algorithm::FixedWindow, None, 2usize),
        (Algorithm::SlidingLog, None, 2),
        (Algorithm::FixedWindow, Some(3), 1),
        (Algorithm::SlidingLog, Some(3), 1),
        (Algorithm::SlidingWindow, Some(3), 1),
        (Algorithm::Gcra, Some(3), 1),
    ];
    for (algorithm, changed_limit, seconds) in runs {
        let backend = Arc::new(MemoryBackend::new());
        let w = LimiterWorkload {
            quota: Quota::new(5, Duration::from_millis(200), algorithm),
            changed_limit,
            pace: Duration::from_millis(2),
            duration: schedule(Duration::from_secs(seconds as u64)),
        };
        let (report, log) = run_limiter_workload(clients(&backend, 4), "mem-limiter", w, async {
            FaultLog::default()
        })
        .await;
        report.assert_ok(
            &format!("limiter-{algorithm:?}"),
            "memory",
            log.injected,
            Duration::from_millis(400),
        );
        // Limit 5 per 200 ms: at least 4 a window (3 while the limit
        // alternates with 3).
        let least = if changed_limit.is_some() { 15 } else { 20 } * seconds;
        assert!(report.ops >= least, "only {} admissions", report.ops);
    }
}

/// Broken stores the workloads must catch (a checker that cannot fail
/// proves nothing): a limiter that admits what it should deny, a barrier
/// that lets a generation pass one arrival short, an election that makes
/// every candidate leader.
struct Broken {
    inner: Arc<MemoryBackend>,
    next: std::sync::atomic::AtomicU64,
}

#[async_trait]
impl coord_core::Limiter for Broken {
    fn capabilities(&self) -> &Capabilities {
        coord_core::Limiter::capabilities(&*self.inner)
    }
    async fn check(&self, key: &str, quota: &Quota, cost: u64) -> Result<coord_core::Decision> {
        let d = coord_core::Limiter::check(&*self.inner, key, quota, cost).await?;
        // Every other denial is admitted all the same.
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(coord_core::Decision {
            allowed: d.allowed || n % 2 == 0,
            ..d
        })
    }
}

#[async_trait]
impl coord_core::Barrier for Broken {
    fn capabilities(&self) -> &Capabilities {
        coord_core::Barrier::capabilities(&*self.inner)
    }
    async fn arrive(
        &self,
        name: &str,
        parties: u32,
        participant: &str,
        arrival: &OwnerToken,
    ) -> Result<coord_core::Arrival> {
        let short = parties.saturating_sub(1).max(1);
        coord_core::Barrier::arrive(&*self.inner, name, short, participant, arrival).await
    }
    async fn is_complete(&self, name: &str, generation: u64) -> Result<bool> {
        coord_core::Barrier::is_complete(&*self.inner, name, generation).await
    }
    async fn withdraw(
        &self,
        name: &str,
        generation: u64,
        participant: &str,
        arrival: &OwnerToken,
    ) -> Result<bool> {
        coord_core::Barrier::withdraw(&*self.inner, name, generation, participant, arrival).await
    }
}

#[async_trait]
impl coord_core::Election for Broken {
    fn capabilities(&self) -> &Capabilities {
        coord_core::Election::capabilities(&*self.inner)
    }
    async fn try_campaign(&self, _: &str, _: &str, _step: Step, _: Duration) -> Result<Attempt> {
        let t = self.next.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        Ok(Attempt::Granted(coord_core::FencingToken(t)))
    }
    async fn renew(&self, _: &str, _step: Step, _: Duration) -> Result<bool> {
        Ok(true)
    }
    async fn resign(&self, _: &str, _step: Step) -> Result<bool> {
        Ok(true)
    }
    async fn leader(&self, _: &str) -> Result<Option<coord_core::LeaderInfo>> {
        Ok(None)
    }
}

fn broken_clients(n: usize) -> Vec<Coord> {
    let inner = Arc::new(MemoryBackend::new());
    let b = Arc::new(Broken {
        inner: inner.clone(),
        next: Default::default(),
    });
    let caps = coord_core::Lock::capabilities(&*inner).clone();
    (0..n)
        .map(|_| {
            Coord::builder(caps.clone())
                .limiter(b.clone())
                .barrier(b.clone())
                .election(b.clone())
                .build()
        })
        .collect()
}

fn rules(r: &conformance::faults::Report) -> Vec<&'static str> {
    r.violations.iter().map(|v| v.rule).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_checkers_catch_broken_limiter_barrier_and_election() {
    let none = || async { FaultLog::default() };
    let w = LimiterWorkload {
        quota: Quota::new(5, Duration::from_millis(200), Algorithm::FixedWindow),
        changed_limit: None,
        pace: Duration::from_millis(2),
        duration: Duration::from_millis(600),
    };
    let (r, _) = run_limiter_workload(broken_clients(4), "broken", w, none()).await;
    assert!(rules(&r).contains(&"admissions per fixed window"), "{r:?}");
    let w = BarrierWorkload {
        timeout: Duration::from_millis(200),
        duration: Duration::from_millis(600),
    };
    let (r, _) = run_barrier_workload(broken_clients(4), "broken", w, none()).await;
    assert!(
        rules(&r).contains(&"no pass before parties arrivals"),
        "{:?}",
        rules(&r)
    );
    let w = ElectionWorkload {
        ttl: Duration::from_secs(1),
        wait: Duration::from_secs(1),
        keep_alive: false,
        work: Duration::from_millis(5),
        duration: Duration::from_millis(500),
    };
    let (r, _) = run_election_workload(broken_clients(4), vec![], "broken", w, none()).await;
    assert!(
        rules(&r).contains(&"one live leader at a time"),
        "{:?}",
        rules(&r)
    );
}

fn with_semaphores(backend: &Arc<MemoryBackend>, n: usize) -> Vec<Coord> {
    (0..n)
        .map(|_| Coord::from_backend(backend.clone()).with_semaphores(backend.clone()))
        .collect()
}

fn permit_workload(kind: conformance::faults::PermitKind) -> conformance::faults::PermitWorkload {
    conformance::faults::PermitWorkload {
        kind,
        ttl: Duration::from_millis(40),
        wait: Duration::from_secs(5),
        watchdog: false,
        work: Duration::from_millis(30),
        duration: schedule(Duration::from_secs(3)),
    }
}

/// 8 clients on a semaphore of 3 permits (1 or 2 at a time) and on a
/// read-write lock, short TTLs (40 ms, held 30 ms), no watchdog: never more than the capacity
/// valid at once, tokens unique and rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn semaphore_and_rwlock_workloads() {
    use conformance::faults::{PermitKind, run_permit_workload};
    let backend = Arc::new(MemoryBackend::new());
    for (kind, scenario) in [
        (PermitKind::Semaphore { total: 3 }, "semaphore-contended"),
        (PermitKind::RwLock { write_every: 3 }, "rwlock-contended"),
    ] {
        let (report, log) = run_permit_workload(
            with_semaphores(&backend, 8),
            scenario,
            permit_workload(kind),
            async { FaultLog::default() },
        )
        .await;
        report.assert_ok(scenario, "memory", log.injected, Duration::from_secs(2));
    }
}

/// A semaphore that admits one permit more than asked: the checker must
/// see more than the capacity held at once.
struct OneTooMany(Arc<MemoryBackend>);

#[async_trait]
impl coord_core::Semaphore for OneTooMany {
    fn capabilities(&self) -> &Capabilities {
        coord_core::Semaphore::capabilities(&*self.0)
    }
    fn fifo(&self) -> bool {
        true
    }
    async fn try_acquire(
        &self,
        name: &str,
        step: Step,
        request: &coord_core::PermitRequest,
    ) -> Result<Attempt> {
        let mut r = *request;
        r.total += 1;
        coord_core::Semaphore::try_acquire(&*self.0, name, step, &r).await
    }
    async fn release(&self, name: &str, step: Step) -> Result<bool> {
        coord_core::Semaphore::release(&*self.0, name, step).await
    }
    async fn extend(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        coord_core::Semaphore::extend(&*self.0, name, step, ttl).await
    }
    async fn force_release(&self, name: &str) -> Result<bool> {
        coord_core::Semaphore::force_release(&*self.0, name).await
    }
    async fn subscribe(&self, name: &str, owner: &OwnerToken) -> Result<coord_core::wake::Waiter> {
        coord_core::Semaphore::subscribe(&*self.0, name, owner).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_permit_checker_catches_a_semaphore_admitting_one_too_many() {
    use conformance::faults::{PermitKind, run_permit_workload};
    let backend = Arc::new(MemoryBackend::new());
    let broken = Arc::new(OneTooMany(backend.clone()));
    let clients = (0..8)
        .map(|_| Coord::from_backend(backend.clone()).with_semaphores(broken.clone()))
        .collect();
    let mut w = permit_workload(PermitKind::Semaphore { total: 3 });
    w.ttl = Duration::from_secs(5);
    w.duration = Duration::from_secs(2);
    let (report, _) =
        run_permit_workload(clients, "one-too-many", w, async { FaultLog::default() }).await;
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.rule == "at most the capacity is held at once"),
        "the checker missed 4 permits of 3 held at once: {:?}",
        report.violations
    );
}
