//! A store whose calls take time: every call of the in-memory backend goes
//! through [`Slow`], which waits `before` (the request on its way: a call
//! dropped then changes nothing) and `after` it (the reply on its way: a
//! call dropped then took effect and nobody hears it). Unlike
//! `support::faulty`, it also wraps the semaphore and the work queue, and a
//! wait can be set for one operation, so a test can drop an operation in
//! the middle of any of its store calls.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_core::inspect::{ClaimRecord, LeaderRecord};
use coord_core::wake::Waiter;
use coord_core::{
    Arrival, Attempt, Capabilities, Coord, LeaderInfo, OwnerToken, PermitRequest, Result, Settings,
    Step, async_trait,
};
use coord_memory::MemoryBackend;

/// How long one call waits before it reaches the store, and after.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lag {
    /// Before the store applies the call.
    pub before: Duration,
    /// After the store applied it, before the reply.
    pub after: Duration,
}

impl Lag {
    /// `before` on the way there, `after` on the way back.
    pub fn new(before: Duration, after: Duration) -> Lag {
        Lag { before, after }
    }
}

/// The in-memory backend behind a lag (see the module docs).
pub struct Slow {
    /// The store itself: read it here to see what a test left, at once.
    pub inner: Arc<MemoryBackend>,
    every: Lag,
    per_op: Mutex<HashMap<&'static str, Lag>>,
    /// Whether the semaphore says it queues waiters (and lets them queue).
    fifo: bool,
}

impl Slow {
    /// Every call lagged by `every`, with the memory backend's FIFO
    /// semaphores.
    pub fn new(every: Lag) -> Arc<Slow> {
        Arc::new(Slow {
            inner: Arc::new(MemoryBackend::new()),
            every,
            per_op: Mutex::new(HashMap::new()),
            fifo: true,
        })
    }

    /// As [`new`](Slow::new), but the semaphore is a store that keeps no
    /// queue: it says it is not FIFO and never asks the store to queue.
    pub fn racing(every: Lag) -> Arc<Slow> {
        Arc::new(Slow {
            inner: Arc::new(MemoryBackend::new()),
            every,
            per_op: Mutex::new(HashMap::new()),
            fifo: false,
        })
    }

    /// Calls of `op` (`"semaphore.release"`, ...: the trait in lower case,
    /// a dot, the method) lag by `lag` instead.
    pub fn set(&self, op: &'static str, lag: Lag) {
        self.per_op.lock().unwrap().insert(op, lag);
    }

    /// A `Coord` with locks, elections, barriers, semaphores and queues over
    /// this store, polling at `poll`.
    pub fn coord(self: &Arc<Self>, poll: Duration) -> Coord {
        let caps = coord_core::Lock::capabilities(&*self.inner).clone();
        Coord::builder(caps)
            .lock(self.clone())
            .election(self.clone())
            .barrier(self.clone())
            .semaphore(self.clone())
            .queue(self.clone())
            .settings(Settings {
                poll_interval: poll,
            })
            .build()
    }

    /// A `Coord` over the same store without the lag: for setting up and
    /// checking what an operation left, at once.
    pub fn plain(&self) -> Coord {
        Coord::from_backend(self.inner.clone())
            .with_semaphores(self.inner.clone())
            .with_queues(self.inner.clone())
    }

    async fn call<T>(&self, op: &'static str, f: impl Future<Output = T>) -> T {
        let lag = self
            .per_op
            .lock()
            .unwrap()
            .get(op)
            .copied()
            .unwrap_or(self.every);
        tokio::time::sleep(lag.before).await;
        let r = f.await;
        tokio::time::sleep(lag.after).await;
        r
    }
}

#[async_trait]
impl coord_core::Lock for Slow {
    fn capabilities(&self) -> &Capabilities {
        coord_core::Lock::capabilities(&*self.inner)
    }
    async fn try_acquire(&self, n: &str, step: Step, ttl: Duration) -> Result<Attempt> {
        let f = coord_core::Lock::try_acquire(&*self.inner, n, step, ttl);
        self.call("lock.try_acquire", f).await
    }
    async fn release(&self, n: &str, step: Step) -> Result<bool> {
        let f = coord_core::Lock::release(&*self.inner, n, step);
        self.call("lock.release", f).await
    }
    async fn extend(&self, n: &str, step: Step, ttl: Duration) -> Result<bool> {
        let f = coord_core::Lock::extend(&*self.inner, n, step, ttl);
        self.call("lock.extend", f).await
    }
    async fn force_release(&self, n: &str) -> Result<bool> {
        let f = coord_core::Lock::force_release(&*self.inner, n);
        self.call("lock.force_release", f).await
    }
    async fn subscribe(&self, n: &str, o: &OwnerToken) -> Result<Waiter> {
        let f = coord_core::Lock::subscribe(&*self.inner, n, o);
        self.call("lock.subscribe", f).await
    }
}

#[async_trait]
impl coord_core::Election for Slow {
    fn capabilities(&self) -> &Capabilities {
        coord_core::Election::capabilities(&*self.inner)
    }
    async fn try_campaign(&self, n: &str, c: &str, step: Step, ttl: Duration) -> Result<Attempt> {
        let f = coord_core::Election::try_campaign(&*self.inner, n, c, step, ttl);
        self.call("election.try_campaign", f).await
    }
    async fn renew(&self, n: &str, step: Step, ttl: Duration) -> Result<bool> {
        let f = coord_core::Election::renew(&*self.inner, n, step, ttl);
        self.call("election.renew", f).await
    }
    async fn resign(&self, n: &str, step: Step) -> Result<bool> {
        let f = coord_core::Election::resign(&*self.inner, n, step);
        self.call("election.resign", f).await
    }
    async fn leader(&self, n: &str) -> Result<Option<LeaderInfo>> {
        let f = coord_core::Election::leader(&*self.inner, n);
        self.call("election.leader", f).await
    }
    async fn inspect(&self, n: &str) -> Result<Option<LeaderRecord>> {
        let f = coord_core::Election::inspect(&*self.inner, n);
        self.call("election.inspect", f).await
    }
    async fn subscribe(&self, n: &str) -> Result<Waiter> {
        let f = coord_core::Election::subscribe(&*self.inner, n);
        self.call("election.subscribe", f).await
    }
}

#[async_trait]
impl coord_core::Barrier for Slow {
    fn capabilities(&self) -> &Capabilities {
        coord_core::Barrier::capabilities(&*self.inner)
    }
    async fn arrive(&self, n: &str, p: u32, who: &str, id: &OwnerToken) -> Result<Arrival> {
        let f = coord_core::Barrier::arrive(&*self.inner, n, p, who, id);
        self.call("barrier.arrive", f).await
    }
    async fn is_complete(&self, n: &str, g: u64) -> Result<bool> {
        let f = coord_core::Barrier::is_complete(&*self.inner, n, g);
        self.call("barrier.is_complete", f).await
    }
    async fn withdraw(&self, n: &str, g: u64, who: &str, id: &OwnerToken) -> Result<bool> {
        let f = coord_core::Barrier::withdraw(&*self.inner, n, g, who, id);
        self.call("barrier.withdraw", f).await
    }
    async fn subscribe(&self, n: &str) -> Result<Waiter> {
        let f = coord_core::Barrier::subscribe(&*self.inner, n);
        self.call("barrier.subscribe", f).await
    }
}

#[async_trait]
impl coord_core::Semaphore for Slow {
    fn capabilities(&self) -> &Capabilities {
        coord_core::Semaphore::capabilities(&*self.inner)
    }
    fn fifo(&self) -> bool {
        self.fifo
    }
    async fn try_acquire(&self, n: &str, step: Step, req: &PermitRequest) -> Result<Attempt> {
        let req = PermitRequest {
            queue: req.queue && self.fifo,
            ..*req
        };
        let f = coord_core::Semaphore::try_acquire(&*self.inner, n, step, &req);
        self.call("semaphore.try_acquire", f).await
    }
    async fn release(&self, n: &str, step: Step) -> Result<bool> {
        let f = coord_core::Semaphore::release(&*self.inner, n, step);
        self.call("semaphore.release", f).await
    }
    async fn extend(&self, n: &str, step: Step, ttl: Duration) -> Result<bool> {
        let f = coord_core::Semaphore::extend(&*self.inner, n, step, ttl);
        self.call("semaphore.extend", f).await
    }
    async fn force_release(&self, n: &str) -> Result<bool> {
        let f = coord_core::Semaphore::force_release(&*self.inner, n);
        self.call("semaphore.force_release", f).await
    }
    async fn subscribe(&self, n: &str, o: &OwnerToken) -> Result<Waiter> {
        let f = coord_core::Semaphore::subscribe(&*self.inner, n, o);
        self.call("semaphore.subscribe", f).await
    }
    async fn inspect(&self, n: &str) -> Result<ClaimRecord> {
        let f = coord_core::Semaphore::inspect(&*self.inner, n);
        self.call("semaphore.inspect", f).await
    }
}

crate::forward_queue!(Slow);

/// `Coord::health` lists read-write locks only where the semaphores queue
/// in order (the condition `Coord::rw_locks` has), and semaphores either
/// way.
#[tokio::test]
async fn health_lists_read_write_locks_only_over_fifo_semaphores() {
    for store in [Slow::new(Lag::default()), Slow::racing(Lag::default())] {
        let coord = store
            .coord(Duration::from_millis(50))
            .with_probe(store.inner.clone());
        let h = coord.health().await.unwrap();
        assert!(h.primitives.contains(&"semaphores"), "{h:?}");
        assert_eq!(
            h.primitives.contains(&"rwlocks"),
            coord.rw_locks().is_ok(),
            "fifo {}: {h:?}",
            store.fifo
        );
    }
}
