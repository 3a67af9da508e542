//! A backend that forwards every call to a [`MemoryBackend`] and injects
//! scripted store errors, to drive coord-core's error handling (retries,
//! fallbacks, cleanup) deterministically. It is a test double for the
//! store-independent logic only: the fault suite runs real faults on real
//! servers.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_core::wake::Waiter;
use coord_core::{
    Arrival, Attempt, Capabilities, Coord, Decision, Error, FencingToken, LeaderInfo, OwnerToken,
    Quota, Result, Settings, Step, async_trait,
};
use coord_memory::MemoryBackend;
use tokio::time::Instant;

/// What the next call of one operation does instead of (or besides)
/// answering normally.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// Fail with a retryable error, sending nothing to the store.
    Unavailable,
    /// Fail with a non-retryable store error, sending nothing.
    Broken,
    /// Apply the call on the store, then lose the reply (retryable error).
    LoseReply,
    /// Apply the call on the store, then wait this long before replying.
    SlowReply(Duration),
    /// Wait this long, then apply the call and reply (a slow request).
    Delay(Duration),
}

/// Scripted faults and call counts per operation name (`"lock.try_acquire"`,
/// `"barrier.arrive"`, ...: the trait's name in lower case, a dot, the
/// method).
#[derive(Default)]
pub struct Faulty {
    pub inner: Arc<MemoryBackend>,
    script: Mutex<HashMap<&'static str, VecDeque<Fault>>>,
    always: Mutex<HashMap<&'static str, Fault>>,
    calls: Mutex<HashMap<&'static str, Vec<Instant>>>,
    steps: Mutex<HashMap<&'static str, Vec<Step>>>,
    leader_answers: Mutex<VecDeque<Option<LeaderInfo>>>,
}

impl Faulty {
    pub fn new() -> Arc<Faulty> {
        Arc::new(Faulty::default())
    }

    /// A `Coord` over this backend for every primitive, polling at `poll`.
    pub fn coord(self: &Arc<Self>, poll: Duration) -> Coord {
        let caps = coord_core::Lock::capabilities(&*self.inner).clone();
        Coord::builder(caps)
            .lock(self.clone())
            .lease(self.clone())
            .fencing(self.clone())
            .election(self.clone())
            .barrier(self.clone())
            .limiter(self.clone())
            .queue(self.clone())
            .settings(Settings {
                poll_interval: poll,
            })
            .build()
    }

    /// The next `n` calls of `op` get `fault`.
    pub fn next(&self, op: &'static str, fault: Fault, n: usize) {
        let mut s = self.script.lock().unwrap();
        let q = s.entry(op).or_default();
        q.extend(std::iter::repeat_n(fault, n));
    }

    /// Every call of `op` gets `fault` until [`heal`](Faulty::heal).
    pub fn always(&self, op: &'static str, fault: Fault) {
        self.always.lock().unwrap().insert(op, fault);
    }

    /// The next `election.leader` calls answer these, in order, instead of
    /// the store (a stale read, as a lagging replica gives).
    pub fn answer_leader(&self, answers: impl IntoIterator<Item = Option<LeaderInfo>>) {
        self.leader_answers.lock().unwrap().extend(answers);
    }

    /// Stop every fault.
    pub fn heal(&self) {
        self.always.lock().unwrap().clear();
        self.script.lock().unwrap().clear();
    }

    /// How many times `op` was called.
    pub fn calls(&self, op: &'static str) -> usize {
        self.times(op).len()
    }

    /// The steps the calls of `op` carried, in order (attempts, extends
    /// and releases of the claim traits).
    pub fn steps(&self, op: &'static str) -> Vec<Step> {
        self.steps
            .lock()
            .unwrap()
            .get(op)
            .cloned()
            .unwrap_or_default()
    }

    fn record(&self, op: &'static str, step: Step) {
        self.steps.lock().unwrap().entry(op).or_default().push(step);
    }

    /// When `op` was called, in order (tokio's clock).
    pub fn times(&self, op: &'static str) -> Vec<Instant> {
        self.calls
            .lock()
            .unwrap()
            .get(op)
            .cloned()
            .unwrap_or_default()
    }

    fn fault(&self, op: &'static str) -> Option<Fault> {
        self.calls
            .lock()
            .unwrap()
            .entry(op)
            .or_default()
            .push(Instant::now());
        if let Some(f) = self.always.lock().unwrap().get(op) {
            return Some(*f);
        }
        self.script.lock().unwrap().get_mut(op)?.pop_front()
    }

    async fn call<T, F>(&self, op: &'static str, f: F) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        match self.fault(op) {
            None => f.await,
            Some(Fault::Unavailable) => Err(unavailable(op)),
            Some(Fault::Broken) => Err(Error::Store {
                backend: "memory",
                operation: op,
                message: "broken (test)".into(),
                source: None,
            }),
            Some(Fault::LoseReply) => {
                let _ = f.await;
                Err(unavailable(op))
            }
            Some(Fault::SlowReply(d)) => {
                let r = f.await;
                tokio::time::sleep(d).await;
                r
            }
            Some(Fault::Delay(d)) => {
                tokio::time::sleep(d).await;
                f.await
            }
        }
    }
}

fn unavailable(op: &'static str) -> Error {
    Error::Unavailable {
        backend: "memory",
        operation: op,
        message: "injected (test)".into(),
        source: None,
    }
}

#[async_trait]
impl coord_core::Lock for Faulty {
    fn capabilities(&self) -> &Capabilities {
        coord_core::Lock::capabilities(&*self.inner)
    }
    async fn try_acquire(&self, n: &str, step: Step, ttl: Duration) -> Result<Attempt> {
        self.record("lock.try_acquire", step);
        self.call(
            "lock.try_acquire",
            coord_core::Lock::try_acquire(&*self.inner, n, step, ttl),
        )
        .await
    }
    async fn release(&self, n: &str, step: Step) -> Result<bool> {
        self.record("lock.release", step);
        self.call(
            "lock.release",
            coord_core::Lock::release(&*self.inner, n, step),
        )
        .await
    }
    async fn extend(&self, n: &str, step: Step, ttl: Duration) -> Result<bool> {
        self.record("lock.extend", step);
        self.call(
            "lock.extend",
            coord_core::Lock::extend(&*self.inner, n, step, ttl),
        )
        .await
    }
    async fn force_release(&self, n: &str) -> Result<bool> {
        self.call(
            "lock.force_release",
            coord_core::Lock::force_release(&*self.inner, n),
        )
        .await
    }
    async fn subscribe(&self, n: &str, o: &OwnerToken) -> Result<Waiter> {
        self.call(
            "lock.subscribe",
            coord_core::Lock::subscribe(&*self.inner, n, o),
        )
        .await
    }
}

#[async_trait]
impl coord_core::Lease for Faulty {
    fn capabilities(&self) -> &Capabilities {
        coord_core::Lease::capabilities(&*self.inner)
    }
    async fn grant(&self, n: &str, step: Step, ttl: Duration) -> Result<Attempt> {
        self.record("lease.grant", step);
        self.call(
            "lease.grant",
            coord_core::Lease::grant(&*self.inner, n, step, ttl),
        )
        .await
    }
    async fn renew(&self, n: &str, step: Step, ttl: Duration) -> Result<bool> {
        self.record("lease.renew", step);
        self.call(
            "lease.renew",
            coord_core::Lease::renew(&*self.inner, n, step, ttl),
        )
        .await
    }
    async fn revoke(&self, n: &str, step: Step) -> Result<bool> {
        self.record("lease.revoke", step);
        self.call(
            "lease.revoke",
            coord_core::Lease::revoke(&*self.inner, n, step),
        )
        .await
    }
    async fn remaining(&self, n: &str) -> Result<Option<Duration>> {
        self.call(
            "lease.remaining",
            coord_core::Lease::remaining(&*self.inner, n),
        )
        .await
    }
}

#[async_trait]
impl coord_core::FencingSource for Faulty {
    fn capabilities(&self) -> &Capabilities {
        coord_core::FencingSource::capabilities(&*self.inner)
    }
    async fn next(&self, r: &str) -> Result<FencingToken> {
        self.call(
            "fencing.next",
            coord_core::FencingSource::next(&*self.inner, r),
        )
        .await
    }
}

#[async_trait]
impl coord_core::Election for Faulty {
    fn capabilities(&self) -> &Capabilities {
        coord_core::Election::capabilities(&*self.inner)
    }
    async fn try_campaign(&self, n: &str, c: &str, step: Step, ttl: Duration) -> Result<Attempt> {
        self.record("election.try_campaign", step);
        self.call(
            "election.try_campaign",
            coord_core::Election::try_campaign(&*self.inner, n, c, step, ttl),
        )
        .await
    }
    async fn renew(&self, n: &str, step: Step, ttl: Duration) -> Result<bool> {
        self.record("election.renew", step);
        self.call(
            "election.renew",
            coord_core::Election::renew(&*self.inner, n, step, ttl),
        )
        .await
    }
    async fn resign(&self, n: &str, step: Step) -> Result<bool> {
        self.record("election.resign", step);
        self.call(
            "election.resign",
            coord_core::Election::resign(&*self.inner, n, step),
        )
        .await
    }
    async fn leader(&self, n: &str) -> Result<Option<LeaderInfo>> {
        if let Some(answer) = self.leader_answers.lock().unwrap().pop_front() {
            self.fault("election.leader");
            return Ok(answer);
        }
        self.call(
            "election.leader",
            coord_core::Election::leader(&*self.inner, n),
        )
        .await
    }
    async fn subscribe(&self, n: &str) -> Result<Waiter> {
        self.call(
            "election.subscribe",
            coord_core::Election::subscribe(&*self.inner, n),
        )
        .await
    }
}

#[async_trait]
impl coord_core::Barrier for Faulty {
    fn capabilities(&self) -> &Capabilities {
        coord_core::Barrier::capabilities(&*self.inner)
    }
    async fn arrive(&self, n: &str, p: u32, who: &str, id: &OwnerToken) -> Result<Arrival> {
        self.call(
            "barrier.arrive",
            coord_core::Barrier::arrive(&*self.inner, n, p, who, id),
        )
        .await
    }
    async fn is_complete(&self, n: &str, g: u64) -> Result<bool> {
        self.call(
            "barrier.is_complete",
            coord_core::Barrier::is_complete(&*self.inner, n, g),
        )
        .await
    }
    async fn withdraw(&self, n: &str, g: u64, who: &str, id: &OwnerToken) -> Result<bool> {
        self.call(
            "barrier.withdraw",
            coord_core::Barrier::withdraw(&*self.inner, n, g, who, id),
        )
        .await
    }
    async fn subscribe(&self, n: &str) -> Result<Waiter> {
        self.call(
            "barrier.subscribe",
            coord_core::Barrier::subscribe(&*self.inner, n),
        )
        .await
    }
}

#[async_trait]
impl coord_core::Limiter for Faulty {
    fn capabilities(&self) -> &Capabilities {
        coord_core::Limiter::capabilities(&*self.inner)
    }
    async fn check(&self, k: &str, q: &Quota, cost: u64) -> Result<Decision> {
        self.call(
            "limiter.check",
            coord_core::Limiter::check(&*self.inner, k, q, cost),
        )
        .await
    }
}

crate::forward_queue!(Faulty, abandon);
