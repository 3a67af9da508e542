//! The simulated store as one client sees it: the in-memory backend
//! behind a seeded network, with the late-copy protocol of the networked
//! backends (`coord_core::late`).
//!
//! Every request is spawned as its own task, so it reaches the store (or
//! not) whatever becomes of the caller's future, as a request already on
//! the wire does: delayed, lost on the way, applied with its reply lost,
//! or applied after the caller gave up. The caller waits for the reply at
//! most the call timeout and then gets [`Error::Unavailable`], as a network
//! backend's caller does. A paused client sends nothing and hears nothing
//! until the pause ends.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_core::late::superseded;
use coord_core::wake::Waiter;
use coord_core::{
    Attempt, Capabilities, Error, Lock, OwnerToken, PermitRequest, Result, Semaphore, Step,
    async_trait,
};
use coord_memory::MemoryBackend;
use futures::future::BoxFuture;
use tokio::time::Instant;

use crate::world::{World, short};

/// One client's view of the shared simulated store.
pub struct SimStore {
    pub(crate) client: usize,
    pub(crate) world: Arc<World>,
    pub(crate) store: Arc<MemoryBackend>,
    pub(crate) caps: Capabilities,
    paused_until: Mutex<Option<Instant>>,
    cut_until: Mutex<Option<Instant>>,
}

/// What a request does on the store, given the store.
type Apply<T> = Box<dyn FnOnce(Arc<MemoryBackend>) -> BoxFuture<'static, Result<T>> + Send>;

impl SimStore {
    /// Client `client` of `store`, its faults drawn from `world`.
    pub fn new(client: usize, world: Arc<World>, store: Arc<MemoryBackend>) -> Self {
        let mut caps = Lock::capabilities(&*store).clone();
        caps.backend = "sim";
        SimStore {
            client,
            world,
            store,
            caps,
            paused_until: Mutex::new(None),
            cut_until: Mutex::new(None),
        }
    }

    fn pause_end(&self) -> Option<Instant> {
        let mut p = self.paused_until.lock().unwrap_or_else(|e| e.into_inner());
        if !self.world.faults_on() || p.is_some_and(|t| t <= Instant::now()) {
            *p = None;
        }
        *p
    }

    /// Send `apply` as one request labelled `what`; its reply, or
    /// [`Error::Unavailable`] at the call timeout.
    pub(crate) async fn call<T, F>(&self, what: String, apply: F) -> Result<T>
    where
        T: Send + std::fmt::Debug + 'static,
        F: FnOnce(Arc<MemoryBackend>) -> BoxFuture<'static, Result<T>> + Send + 'static,
    {
        self.call_shown(what, |t: &T| format!("{t:?}"), apply).await
    }

    /// [`call`](Self::call), with the reply shown in the trace by `show`
    /// (for replies whose `Debug` carries wall-clock times).
    pub(crate) async fn call_shown<T, F>(
        &self,
        what: String,
        show: fn(&T) -> String,
        apply: F,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<MemoryBackend>) -> BoxFuture<'static, Result<T>> + Send + 'static,
    {
        if let Some(until) = self.pause_end() {
            tokio::time::sleep_until(until).await;
        }
        let w = &self.world;
        let r = w.rates;
        let faulty = w.faults_on();
        let mut fate = "ok";
        let mut there = Duration::ZERO;
        let mut back = Duration::ZERO;
        if faulty {
            if w.chance(r.delay) {
                there = w.millis(1, r.call_timeout.as_millis() as u64 / 2);
            }
            if w.chance(r.delay) {
                back = w.millis(1, r.call_timeout.as_millis() as u64 / 2);
            }
            if w.chance(r.lose_request) {
                fate = "lose-request";
            } else if w.chance(r.lose_reply) {
                fate = "lose-reply";
            } else if w.chance(r.late) {
                fate = "late";
                there = r.call_timeout + w.millis(1, 3000);
            }
            let mut cut = self.cut_until.lock().unwrap_or_else(|e| e.into_inner());
            if w.chance(r.cut) {
                let len = w.millis(500, 4000);
                w.log(format!("c{} cut off {}ms", self.client, len.as_millis()));
                *cut = Some(Instant::now() + len);
            }
            if cut.is_some_and(|t| Instant::now() < t) {
                fate = "lose-request";
            }
            drop(cut);
            if w.chance(r.pause) {
                let len = w.millis(500, 4000);
                w.log(format!("c{} pause {}ms", self.client, len.as_millis()));
                *self.paused_until.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(Instant::now() + len);
            }
        }
        let client = self.client;
        w.log(format!("c{client} send {what} [{fate}]"));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (world, store) = (self.world.clone(), self.store.clone());
        let apply: Apply<T> = Box::new(apply);
        let sent_in = w.restarts();
        let req = async move {
            tokio::time::sleep(there).await;
            if fate == "lose-request" {
                world.log(format!("c{client} lost {what}"));
                return;
            }
            if world.down() || world.restarts() != sent_in {
                world.log(format!("c{client} lost {what} to a restart"));
                return;
            }
            let out = apply(store).await;
            let shown = match &out {
                Ok(t) => show(t),
                Err(e) => format!("{e:?}"),
            };
            world.log(format!("c{client} applied {what} -> {shown}"));
            tokio::time::sleep(back).await;
            if fate == "lose-reply" || world.restarts() != sent_in {
                return;
            }
            let _ = tx.send(out);
        };
        tokio::spawn(req);
        let deadline = Instant::now() + r.call_timeout;
        let answer = tokio::time::timeout_at(deadline, rx).await;
        // A paused client hears nothing until its pause ends.
        if let Some(until) = self.pause_end() {
            tokio::time::sleep_until(until).await;
        }
        match answer {
            Ok(Ok(out)) => out,
            _ => {
                tokio::time::sleep_until(deadline).await;
                w.log(format!("c{client} timed out"));
                Err(Error::Unavailable {
                    backend: "sim",
                    operation: "request",
                    message: "no reply within the call timeout".into(),
                    source: None,
                })
            }
        }
    }

    /// An attempt of `step`'s owner on `name`: refused on the store if a
    /// marking release or extend of the owner was sent after it (the core
    /// keeps the book of unanswered steps and tells those to mark).
    pub(crate) async fn attempt<F, Fut>(
        &self,
        name: &str,
        step: Step,
        what: String,
        f: F,
    ) -> Result<Attempt>
    where
        F: FnOnce(Arc<MemoryBackend>, String, OwnerToken) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Attempt>> + Send + 'static,
    {
        let stamp = step.stamp as u64;
        let (world, n, o) = (self.world.clone(), name.to_string(), step.owner);
        self.call(what, move |s| {
            Box::pin(async move {
                if world.refused(&n, &o, stamp) {
                    world.log(format!("store refused late copy #{stamp} of {}", short(&o)));
                    return Ok(Attempt::Held { expires_in: None });
                }
                f(s, n, o).await
            })
        })
        .await
    }

    /// An extend (or renewal) of `step`'s owner on `name`, as the networked
    /// backends apply it (`coord_core::late`): refused on the store,
    /// changing nothing, if a marking step of the owner was sent after it;
    /// marking when the step says so.
    pub(crate) async fn step<F, Fut>(
        &self,
        name: &str,
        step: Step,
        what: String,
        f: F,
    ) -> Result<bool>
    where
        F: FnOnce(Arc<MemoryBackend>, String, OwnerToken) -> Fut + Send + 'static,
        Fut: Future<Output = Result<bool>> + Send + 'static,
    {
        let (world, n, o) = (self.world.clone(), name.to_string(), step.owner);
        self.call(what, move |s| {
            Box::pin(async move {
                let stamp = step.stamp as u64;
                if world.refused(&n, &o, stamp) {
                    world.log(format!("store refused late step #{stamp} of {}", short(&o)));
                    return Err(superseded("sim", "extend"));
                }
                if step.mark {
                    world.mark(&n, &o, stamp);
                }
                f(s, n, o).await
            })
        })
        .await
    }

    /// A release of `step`'s owner on `name`, leaving a mark against late
    /// copies when the step says so.
    pub(crate) async fn ending<F, Fut>(
        &self,
        name: &str,
        step: Step,
        what: String,
        f: F,
    ) -> Result<bool>
    where
        F: FnOnce(Arc<MemoryBackend>, String, OwnerToken) -> Fut + Send + 'static,
        Fut: Future<Output = Result<bool>> + Send + 'static,
    {
        let (world, n, o) = (self.world.clone(), name.to_string(), step.owner);
        self.call(what, move |s| {
            Box::pin(async move {
                if step.mark {
                    world.mark(&n, &o, step.stamp as u64);
                }
                f(s, n, o).await
            })
        })
        .await
    }
}

#[async_trait]
impl Lock for SimStore {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn try_acquire(&self, name: &str, step: Step, ttl: Duration) -> Result<Attempt> {
        let owner = &step.owner;
        let what = format!(
            "lock.try_acquire {name} {} ttl={}ms",
            short(owner),
            ttl.as_millis()
        );
        self.attempt(name, step, what, move |s, n, o| async move {
            Lock::try_acquire(&*s, &n, o.step(), ttl).await
        })
        .await
    }

    async fn release(&self, name: &str, step: Step) -> Result<bool> {
        let owner = &step.owner;
        let what = format!("lock.release {name} {}", short(owner));
        self.ending(name, step, what, |s, n, o| async move {
            Lock::release(&*s, &n, o.step()).await
        })
        .await
    }

    async fn extend(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        let owner = &step.owner;
        let what = format!(
            "lock.extend {name} {} ttl={}ms",
            short(owner),
            ttl.as_millis()
        );
        self.step(name, step, what, move |s, n, o| async move {
            Lock::extend(&*s, &n, o.step(), ttl).await
        })
        .await
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        let n = name.to_string();
        self.call(format!("lock.force_release {name}"), move |s| {
            Box::pin(async move { Lock::force_release(&*s, &n).await })
        })
        .await
    }

    async fn subscribe(&self, name: &str, owner: &OwnerToken) -> Result<Waiter> {
        Lock::subscribe(&*self.store, name, owner).await
    }
}

#[async_trait]
impl Semaphore for SimStore {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn fifo(&self) -> bool {
        Semaphore::fifo(&*self.store)
    }

    async fn try_acquire(
        &self,
        name: &str,
        step: Step,
        request: &PermitRequest,
    ) -> Result<Attempt> {
        let owner = &step.owner;
        let req = *request;
        let what = format!(
            "sem.try_acquire {name} {} n={}/{} ttl={}ms queue={}",
            short(owner),
            req.permits,
            req.total,
            req.ttl.as_millis(),
            req.queue
        );
        self.attempt(name, step, what, move |s, n, o| async move {
            Semaphore::try_acquire(&*s, &n, o.step(), &req).await
        })
        .await
    }

    async fn release(&self, name: &str, step: Step) -> Result<bool> {
        let owner = &step.owner;
        let what = format!("sem.release {name} {}", short(owner));
        self.ending(name, step, what, |s, n, o| async move {
            Semaphore::release(&*s, &n, o.step()).await
        })
        .await
    }

    async fn extend(&self, name: &str, step: Step, ttl: Duration) -> Result<bool> {
        let owner = &step.owner;
        let what = format!(
            "sem.extend {name} {} ttl={}ms",
            short(owner),
            ttl.as_millis()
        );
        self.step(name, step, what, move |s, n, o| async move {
            Semaphore::extend(&*s, &n, o.step(), ttl).await
        })
        .await
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        let n = name.to_string();
        self.call(format!("sem.force_release {name}"), move |s| {
            Box::pin(async move { Semaphore::force_release(&*s, &n).await })
        })
        .await
    }

    async fn subscribe(&self, name: &str, owner: &OwnerToken) -> Result<Waiter> {
        Semaphore::subscribe(&*self.store, name, owner).await
    }
}
