//! The handle users hold: one object that gives every primitive, whatever
//! the store.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{
    Barrier, Election, FencingSource, Lease, Limiter, Lister, Lock, Probe, Semaphore,
};
use crate::error::{Error, Result};
use crate::late::Stepped;
use crate::queue_backend::Queue;
use crate::types::Capabilities;

/// Settings shared by every primitive of one [`Coord`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// The polling fallback: a waiter re-checks at least this often (with
    /// jitter, between half and all of it) even when no notification comes.
    pub poll_interval: Duration,
}

impl Settings {
    /// Defaults for a backend: 1 s polling where the store sends
    /// notifications, 50 ms where it does not.
    pub fn for_capabilities(caps: &Capabilities) -> Self {
        Settings {
            poll_interval: if caps.notifications {
                Duration::from_secs(1)
            } else {
                Duration::from_millis(50)
            },
        }
    }
}

/// A connection to one store, giving every primitive it supports.
///
/// Cheap to clone; clones share the connection. Build it with a backend's
/// `connect` function or, in the facade, `coord::connect(url)`.
#[derive(Clone)]
pub struct Coord {
    pub(crate) caps: Arc<Capabilities>,
    pub(crate) settings: Settings,
    pub(crate) lock: Option<Stepped<dyn Lock>>,
    pub(crate) lease: Option<Stepped<dyn Lease>>,
    pub(crate) fencing: Option<Arc<dyn FencingSource>>,
    pub(crate) election: Option<Stepped<dyn Election>>,
    pub(crate) barrier: Option<Arc<dyn Barrier>>,
    pub(crate) limiter: Option<Arc<dyn Limiter>>,
    pub(crate) semaphore: Option<Stepped<dyn Semaphore>>,
    pub(crate) queue: Option<Arc<dyn Queue>>,
    pub(crate) probe: Option<Arc<dyn Probe>>,
    pub(crate) lister: Option<Arc<dyn Lister>>,
}

impl std::fmt::Debug for Coord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coord")
            .field("backend", &self.caps.backend)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Coord {
    /// Start building a handle for a backend with these capabilities.
    pub fn builder(caps: Capabilities) -> CoordBuilder {
        CoordBuilder {
            coord: Coord {
                settings: Settings::for_capabilities(&caps),
                caps: Arc::new(caps),
                lock: None,
                lease: None,
                fencing: None,
                election: None,
                barrier: None,
                limiter: None,
                semaphore: None,
                queue: None,
                probe: None,
                lister: None,
            },
        }
    }

    /// A handle from one backend object that implements every primitive
    /// and the health probe.
    pub fn from_backend<B>(backend: Arc<B>) -> Coord
    where
        B: Lock + Lease + FencingSource + Election + Barrier + Limiter + Probe,
    {
        let caps = Lock::capabilities(&*backend).clone();
        Coord::builder(caps)
            .lock(backend.clone())
            .lease(backend.clone())
            .fencing(backend.clone())
            .election(backend.clone())
            .barrier(backend.clone())
            .limiter(backend.clone())
            .probe(backend)
            .build()
    }

    /// The same handle with semaphores provided by `backend` (for a
    /// backend built with [`Coord::from_backend`], which takes the
    /// primitives every backend has).
    ///
    /// ```
    /// # fn demo(coord: coord_core::Coord, sem: std::sync::Arc<dyn coord_core::Semaphore>) {
    /// let coord = coord.with_semaphores(sem);
    /// assert!(coord.semaphores().is_ok());
    /// # }
    /// ```
    pub fn with_semaphores(mut self, backend: Arc<dyn Semaphore>) -> Coord {
        self.semaphore = Some(Stepped::new(backend));
        self
    }

    /// What the backend promises.
    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// The shared settings.
    pub fn settings(&self) -> Settings {
        self.settings
    }

    /// The same handle with another polling fallback interval (see
    /// [`Settings::poll_interval`]). Zero is raised to 1 ms.
    pub fn with_poll_interval(mut self, poll: Duration) -> Coord {
        self.settings.poll_interval = poll.max(Duration::from_millis(1));
        self
    }

    pub(crate) fn unsupported(&self, primitive: &'static str) -> Error {
        Error::Unsupported {
            backend: self.caps.backend,
            primitive,
            reason: self.caps.why_unsupported(primitive),
        }
    }

    /// The raw lock backend (no waiting, guards or validation): for backend
    /// authors and tests. Users want [`Coord::locks`].
    pub fn raw_lock(&self) -> Result<Arc<dyn Lock>> {
        self.lock
            .as_ref()
            .map(|b| b.backend().clone())
            .ok_or_else(|| self.unsupported("locks"))
    }

    /// The raw election backend (no waiting, guards or validation): for
    /// backend authors and tests. Users want [`Coord::elections`].
    pub fn raw_election(&self) -> Result<Arc<dyn Election>> {
        self.election
            .as_ref()
            .map(|b| b.backend().clone())
            .ok_or_else(|| self.unsupported("elections"))
    }

    /// The raw semaphore backend (no waiting, guards or validation): for
    /// backend authors and tests. Users want [`Coord::semaphores`].
    ///
    /// ```
    /// # fn demo(coord: coord_core::Coord) {
    /// if let Ok(raw) = coord.raw_semaphore() {
    ///     println!("FIFO semaphores: {}", raw.fifo());
    /// }
    /// # }
    /// ```
    pub fn raw_semaphore(&self) -> Result<Arc<dyn Semaphore>> {
        self.semaphore
            .as_ref()
            .map(|b| b.backend().clone())
            .ok_or_else(|| self.unsupported("semaphores"))
    }

    /// The raw barrier backend (no waiting, retries or validation): for
    /// backend authors and tests. Users want [`Coord::barriers`].
    pub fn raw_barrier(&self) -> Result<Arc<dyn Barrier>> {
        self.barrier
            .clone()
            .ok_or_else(|| self.unsupported("barriers"))
    }
}

/// Builds a [`Coord`] from the primitives a backend implements.
#[must_use]
pub struct CoordBuilder {
    coord: Coord,
}

impl CoordBuilder {
    /// Provide locks.
    pub fn lock(mut self, b: Arc<dyn Lock>) -> Self {
        self.coord.lock = Some(Stepped::new(b));
        self
    }
    /// Provide leases.
    pub fn lease(mut self, b: Arc<dyn Lease>) -> Self {
        self.coord.lease = Some(Stepped::new(b));
        self
    }
    /// Provide fencing sources.
    pub fn fencing(mut self, b: Arc<dyn FencingSource>) -> Self {
        self.coord.fencing = Some(b);
        self
    }
    /// Provide elections.
    pub fn election(mut self, b: Arc<dyn Election>) -> Self {
        self.coord.election = Some(Stepped::new(b));
        self
    }
    /// Provide barriers.
    pub fn barrier(mut self, b: Arc<dyn Barrier>) -> Self {
        self.coord.barrier = Some(b);
        self
    }
    /// Provide rate limiters.
    pub fn limiter(mut self, b: Arc<dyn Limiter>) -> Self {
        self.coord.limiter = Some(b);
        self
    }
    /// Provide semaphores.
    ///
    /// ```
    /// # fn demo(caps: coord_core::Capabilities, sem: std::sync::Arc<dyn coord_core::Semaphore>) {
    /// let coord = coord_core::Coord::builder(caps).semaphore(sem).build();
    /// assert!(coord.semaphores().is_ok());
    /// # }
    /// ```
    pub fn semaphore(mut self, b: Arc<dyn Semaphore>) -> Self {
        self.coord.semaphore = Some(Stepped::new(b));
        self
    }
    /// Provide work queues.
    ///
    /// ```
    /// # fn demo(caps: coord_core::Capabilities, q: std::sync::Arc<dyn coord_core::Queue>) {
    /// let coord = coord_core::Coord::builder(caps).queue(q).build();
    /// assert!(coord.queues().is_ok());
    /// # }
    /// ```
    pub fn queue(mut self, b: Arc<dyn Queue>) -> Self {
        self.coord.queue = Some(b);
        self
    }
    /// Provide the health probe behind [`Coord::health`].
    pub fn probe(mut self, b: Arc<dyn Probe>) -> Self {
        self.coord.probe = Some(b);
        self
    }
    /// Provide the listing behind [`Coord::list`].
    pub fn lister(mut self, b: Arc<dyn Lister>) -> Self {
        self.coord.lister = Some(b);
        self
    }
    /// Override the settings.
    pub fn settings(mut self, settings: Settings) -> Self {
        self.coord.settings = settings;
        self
    }
    /// Finish.
    pub fn build(self) -> Coord {
        self.coord
    }
}
