//! The conformance suite catches a store that breaks one rule: each store
//! here is the in-memory store with one fault planted in one primitive,
//! and the case that checks the rule must fail on it, promptly and with
//! its message (`conformance_suite` runs the same cases on the store
//! without the fault, where they pass).
//!
//! The faults: a lease whose `remaining` does not count down; names cut
//! to 255 bytes (in locks, leases or semaphores); a dedup window restarted
//! by each duplicate push; a semaphore release that wakes one waiter where
//! several fit; a released permit kept until its TTL.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::Factory;
use coord_core::wake::{Waiter, Wakeups};
use coord_core::{
    Attempt, Capabilities, Coord, Lane, Lease, Lock, Message, MessageId, NewMessage, OwnerToken,
    PermitRequest, PopAttempt, Pushed, Queue, QueueConfig, QueueStats, Result, Semaphore, Step,
    async_trait,
};
use coord_memory::MemoryBackend;
use tokio::time::Instant;

/// A case must fail within this long of its start on a faulty store.
const FAST: Duration = Duration::from_secs(5);

/// The in-memory store, with the primitives given here in place of its
/// own.
#[derive(Default, Clone)]
struct Planted {
    lock: Option<Arc<dyn Lock>>,
    lease: Option<Arc<dyn Lease>>,
    semaphore: Option<Arc<dyn Semaphore>>,
    queue: Option<Arc<dyn Queue>>,
}

impl Planted {
    /// A factory whose clients all share `store` (as clients of one server
    /// would), each primitive from `self` where given.
    fn factory(self, store: Arc<MemoryBackend>) -> Factory {
        Factory::new(move || {
            let (store, p) = (store.clone(), self.clone());
            async move {
                let caps = Lock::capabilities(&*store).clone();
                Coord::builder(caps)
                    .lock(p.lock.unwrap_or_else(|| store.clone() as Arc<dyn Lock>))
                    .lease(p.lease.unwrap_or_else(|| store.clone() as Arc<dyn Lease>))
                    .fencing(store.clone())
                    .election(store.clone())
                    .barrier(store.clone())
                    .limiter(store.clone())
                    .semaphore(
                        p.semaphore
                            .unwrap_or_else(|| store.clone() as Arc<dyn Semaphore>),
                    )
                    .queue(p.queue.unwrap_or_else(|| store.clone() as Arc<dyn Queue>))
                    .build()
            }
        })
    }
}

/// Run `case` on `factory`: it must fail within [`FAST`], with a message
/// containing `says`.
async fn caught<C, Fut>(what: &str, factory: Factory, case: C, says: &str)
where
    C: FnOnce(Factory) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let started = Instant::now();
    let outcome = tokio::time::timeout(FAST, tokio::spawn(case(factory))).await;
    let failed = match outcome {
        Err(_) => panic!("{what}: the case still ran after {FAST:?}"),
        Ok(Ok(())) => panic!("{what}: the case passed on the faulty store"),
        Ok(Err(e)) => e.into_panic(),
    };
    let message = failed
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| failed.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(
        message.contains(says),
        "{what}: the case failed, but not on the planted fault: {message}"
    );
    eprintln!("caught in {:?}: {what}: {message}", started.elapsed());
}

// ---- a lease whose remaining time does not count down ----

/// Leases whose `remaining` reports the TTL of the last grant or renewal
/// for as long as the lease lives.
struct FullRemaining {
    inner: Arc<MemoryBackend>,
    ttls: Mutex<HashMap<String, Duration>>,
}

#[async_trait]
impl Lease for FullRemaining {
    fn capabilities(&self) -> &Capabilities {
        Lease::capabilities(&*self.inner)
    }
    async fn grant(&self, n: &str, step: Step, ttl: Duration) -> Result<Attempt> {
        let r = self.inner.grant(n, step, ttl).await?;
        if matches!(r, Attempt::Granted(_)) {
            self.ttls.lock().unwrap().insert(n.to_string(), ttl);
        }
        Ok(r)
    }
    async fn renew(&self, n: &str, step: Step, ttl: Duration) -> Result<bool> {
        let r = Lease::renew(&*self.inner, n, step, ttl).await?;
        if r {
            self.ttls.lock().unwrap().insert(n.to_string(), ttl);
        }
        Ok(r)
    }
    async fn revoke(&self, n: &str, step: Step) -> Result<bool> {
        self.inner.revoke(n, step).await
    }
    async fn remaining(&self, n: &str) -> Result<Option<Duration>> {
        let live = self.inner.remaining(n).await?;
        Ok(live.map(|left| self.ttls.lock().unwrap().get(n).copied().unwrap_or(left)))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_remaining_that_does_not_count_down_is_caught() {
    let store = Arc::new(MemoryBackend::new());
    let lease = Arc::new(FullRemaining {
        inner: store.clone(),
        ttls: Mutex::default(),
    });
    let planted = Planted {
        lease: Some(lease),
        ..Planted::default()
    };
    caught(
        "remaining stuck at the TTL",
        planted.factory(store),
        |f| async move { conformance::cases::lease_remaining_counts_down(&f).await },
        "remaining does not count down",
    )
    .await;
}

// ---- names cut to 255 bytes ----

/// Locks, leases and semaphores that keep only the first 255 bytes of a
/// name.
struct CutNames(Arc<MemoryBackend>);

fn cut(name: &str) -> &str {
    let mut end = name.len().min(255);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

#[async_trait]
impl Lock for CutNames {
    fn capabilities(&self) -> &Capabilities {
        Lock::capabilities(&*self.0)
    }
    async fn try_acquire(&self, n: &str, step: Step, ttl: Duration) -> Result<Attempt> {
        Lock::try_acquire(&*self.0, cut(n), step, ttl).await
    }
    async fn release(&self, n: &str, step: Step) -> Result<bool> {
        Lock::release(&*self.0, cut(n), step).await
    }
    async fn extend(&self, n: &str, step: Step, ttl: Duration) -> Result<bool> {
        Lock::extend(&*self.0, cut(n), step, ttl).await
    }
    async fn force_release(&self, n: &str) -> Result<bool> {
        Lock::force_release(&*self.0, cut(n)).await
    }
    async fn subscribe(&self, n: &str, o: &OwnerToken) -> Result<Waiter> {
        Lock::subscribe(&*self.0, cut(n), o).await
    }
}

#[async_trait]
impl Lease for CutNames {
    fn capabilities(&self) -> &Capabilities {
        Lease::capabilities(&*self.0)
    }
    async fn grant(&self, n: &str, step: Step, ttl: Duration) -> Result<Attempt> {
        self.0.grant(cut(n), step, ttl).await
    }
    async fn renew(&self, n: &str, step: Step, ttl: Duration) -> Result<bool> {
        Lease::renew(&*self.0, cut(n), step, ttl).await
    }
    async fn revoke(&self, n: &str, step: Step) -> Result<bool> {
        self.0.revoke(cut(n), step).await
    }
    async fn remaining(&self, n: &str) -> Result<Option<Duration>> {
        self.0.remaining(cut(n)).await
    }
}

#[async_trait]
impl Semaphore for CutNames {
    fn capabilities(&self) -> &Capabilities {
        Semaphore::capabilities(&*self.0)
    }
    fn fifo(&self) -> bool {
        Semaphore::fifo(&*self.0)
    }
    async fn try_acquire(&self, n: &str, step: Step, r: &PermitRequest) -> Result<Attempt> {
        Semaphore::try_acquire(&*self.0, cut(n), step, r).await
    }
    async fn release(&self, n: &str, step: Step) -> Result<bool> {
        Semaphore::release(&*self.0, cut(n), step).await
    }
    async fn extend(&self, n: &str, step: Step, ttl: Duration) -> Result<bool> {
        Semaphore::extend(&*self.0, cut(n), step, ttl).await
    }
    async fn force_release(&self, n: &str) -> Result<bool> {
        Semaphore::force_release(&*self.0, cut(n)).await
    }
    async fn subscribe(&self, n: &str, o: &OwnerToken) -> Result<Waiter> {
        Semaphore::subscribe(&*self.0, cut(n), o).await
    }
}

/// Names cut short in any one of locks, leases and semaphores are caught
/// (each primitive's check works on its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn names_cut_to_255_bytes_are_caught_in_each_primitive() {
    for (kind, says) in [
        ("locks", "a lock on one holds the other"),
        ("leases", "a lease on one holds the other"),
        (
            "semaphores",
            "2 of 2 permits of one, while the other is held",
        ),
    ] {
        let store = Arc::new(MemoryBackend::new());
        let cutting = Arc::new(CutNames(store.clone()));
        let planted = match kind {
            "locks" => Planted {
                lock: Some(cutting),
                ..Planted::default()
            },
            "leases" => Planted {
                lease: Some(cutting),
                ..Planted::default()
            },
            _ => Planted {
                semaphore: Some(cutting),
                ..Planted::default()
            },
        };
        caught(
            &format!("{kind} cutting names to 255 bytes"),
            planted.factory(store),
            |f| async move {
                conformance::cases::input_long_names_sharing_a_prefix_are_separate(&f).await
            },
            says,
        )
        .await;
    }
}

// ---- a dedup window restarted by each duplicate ----

/// Queues whose dedup ids are remembered for a window from their LAST
/// push: each duplicate restarts it.
struct RestartedDedup {
    inner: Arc<MemoryBackend>,
    seen: Mutex<HashMap<(String, String), (MessageId, Instant)>>,
}

#[async_trait]
impl Queue for RestartedDedup {
    fn capabilities(&self) -> &Capabilities {
        Queue::capabilities(&*self.inner)
    }
    async fn push(&self, q: &str, m: &NewMessage<'_>) -> Result<Pushed> {
        let Some(d) = m.dedup_id else {
            return self.inner.push(q, m).await;
        };
        let key = (q.to_string(), d.to_string());
        let now = Instant::now();
        if let Some((id, until)) = self.seen.lock().unwrap().get_mut(&key) {
            if *until > now {
                *until = now + m.dedup_window;
                return Ok(Pushed {
                    id: *id,
                    duplicate: true,
                });
            }
        }
        let plain = NewMessage {
            dedup_id: None,
            ..*m
        };
        let pushed = self.inner.push(q, &plain).await?;
        let until = now + m.dedup_window;
        self.seen.lock().unwrap().insert(key, (pushed.id, until));
        Ok(pushed)
    }
    async fn try_pop(
        &self,
        q: &str,
        l: Lane,
        c: &OwnerToken,
        v: Duration,
        cfg: &QueueConfig,
    ) -> Result<PopAttempt> {
        self.inner.try_pop(q, l, c, v, cfg).await
    }
    async fn ack(&self, q: &str, l: Lane, id: MessageId, c: &OwnerToken) -> Result<bool> {
        self.inner.ack(q, l, id, c).await
    }
    async fn nack(
        &self,
        q: &str,
        l: Lane,
        id: MessageId,
        c: &OwnerToken,
        d: Duration,
    ) -> Result<bool> {
        self.inner.nack(q, l, id, c, d).await
    }
    async fn abandon(&self, q: &str, l: Lane, c: &OwnerToken) -> Result<()> {
        self.inner.abandon(q, l, c).await
    }
    async fn extend(
        &self,
        q: &str,
        l: Lane,
        id: MessageId,
        c: &OwnerToken,
        v: Duration,
    ) -> Result<bool> {
        Queue::extend(&*self.inner, q, l, id, c, v).await
    }
    async fn peek(&self, q: &str, l: Lane, limit: usize) -> Result<Vec<Message>> {
        self.inner.peek(q, l, limit).await
    }
    async fn redrive(&self, q: &str, limit: usize) -> Result<u64> {
        self.inner.redrive(q, limit).await
    }
    async fn stats(&self, q: &str) -> Result<QueueStats> {
        self.inner.stats(q).await
    }
    async fn purge(&self, q: &str) -> Result<u64> {
        self.seen.lock().unwrap().retain(|(name, _), _| name != q);
        self.inner.purge(q).await
    }
    async fn subscribe(&self, q: &str, l: Lane) -> Result<Waiter> {
        Queue::subscribe(&*self.inner, q, l).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dedup_window_restarted_by_duplicates_is_caught() {
    let store = Arc::new(MemoryBackend::new());
    let queue = Arc::new(RestartedDedup {
        inner: store.clone(),
        seen: Mutex::default(),
    });
    let planted = Planted {
        queue: Some(queue),
        ..Planted::default()
    };
    caught(
        "dedup window restarted by each duplicate",
        planted.factory(store),
        |f| async move {
            conformance::cases::queue_dedup_window_runs_from_the_first_push(&f).await
        },
        "restarted it",
    )
    .await;
}

// ---- semaphore faults ----

/// How a [`FaultySemaphore`] breaks the rules.
#[derive(Clone, Copy)]
enum SemFault {
    /// A release wakes one waiter of the name, however many now fit.
    WakesOne,
    /// A release reports success and returns nothing: the permits come
    /// back at the grant's TTL.
    KeepsPermits,
}

/// The in-memory semaphores with one [`SemFault`].
struct FaultySemaphore {
    inner: Arc<MemoryBackend>,
    fault: SemFault,
    /// Waiters by name ([`SemFault::WakesOne`]).
    wakeups: Wakeups,
}

#[async_trait]
impl Semaphore for FaultySemaphore {
    fn capabilities(&self) -> &Capabilities {
        Semaphore::capabilities(&*self.inner)
    }
    fn fifo(&self) -> bool {
        Semaphore::fifo(&*self.inner)
    }
    async fn try_acquire(&self, n: &str, step: Step, r: &PermitRequest) -> Result<Attempt> {
        Semaphore::try_acquire(&*self.inner, n, step, r).await
    }
    async fn release(&self, n: &str, step: Step) -> Result<bool> {
        let o = &step.owner;
        match self.fault {
            SemFault::WakesOne => {
                let released = Semaphore::release(&*self.inner, n, step).await?;
                self.wakeups.notify_one(n);
                Ok(released)
            }
            SemFault::KeepsPermits => {
                let held = Semaphore::inspect(&*self.inner, n).await?;
                Ok(held.holders.iter().any(|h| h.owner == *o))
            }
        }
    }
    async fn extend(&self, n: &str, step: Step, ttl: Duration) -> Result<bool> {
        Semaphore::extend(&*self.inner, n, step, ttl).await
    }
    async fn force_release(&self, n: &str) -> Result<bool> {
        let removed = Semaphore::force_release(&*self.inner, n).await?;
        self.wakeups.notify_all(n);
        Ok(removed)
    }
    async fn subscribe(&self, n: &str, o: &OwnerToken) -> Result<Waiter> {
        match self.fault {
            SemFault::WakesOne => Ok(self.wakeups.subscribe(n)),
            SemFault::KeepsPermits => Semaphore::subscribe(&*self.inner, n, o).await,
        }
    }
}

fn faulty_semaphore(fault: SemFault) -> Factory {
    let store = Arc::new(MemoryBackend::new());
    let semaphore = Arc::new(FaultySemaphore {
        inner: store.clone(),
        fault,
        wakeups: Wakeups::new(),
    });
    Planted {
        semaphore: Some(semaphore),
        ..Planted::default()
    }
    .factory(store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_that_wakes_one_of_several_fitting_waiters_is_caught() {
    caught(
        "a release waking one waiter",
        faulty_semaphore(SemFault::WakesOne),
        |f| async move {
            conformance::cases::semaphore_release_wakes_every_waiter_that_fits(&f).await
        },
        "the release woke only one waiter",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_released_permit_kept_until_its_ttl_is_caught() {
    caught(
        "a release keeping the permits",
        faulty_semaphore(SemFault::KeepsPermits),
        |f| async move { conformance::cases::semaphore_released_permit_is_free_at_once(&f).await },
        "a single attempt for them is refused",
    )
    .await;
}
