//! The conformance suite catches a store that breaks one rule: each store
//! here is the in-memory store with one fault planted in one primitive,
//! and the case that checks the rule must fail on it, promptly and with
//! its message (`conformance_suite` runs the same cases on the store
//! without the fault, where they pass).
//!
//! The faults: a lease whose `remaining` does not count down.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::Factory;
use coord_core::{
    Attempt, Capabilities, Coord, Lease, Lock, OwnerToken, Queue, Result, Semaphore, async_trait,
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
    async fn grant(&self, n: &str, o: &OwnerToken, ttl: Duration) -> Result<Attempt> {
        let r = self.inner.grant(n, o, ttl).await?;
        if matches!(r, Attempt::Granted(_)) {
            self.ttls.lock().unwrap().insert(n.to_string(), ttl);
        }
        Ok(r)
    }
    async fn renew(&self, n: &str, o: &OwnerToken, ttl: Duration) -> Result<bool> {
        let r = Lease::renew(&*self.inner, n, o, ttl).await?;
        if r {
            self.ttls.lock().unwrap().insert(n.to_string(), ttl);
        }
        Ok(r)
    }
    async fn revoke(&self, n: &str, o: &OwnerToken) -> Result<bool> {
        self.inner.revoke(n, o).await
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
