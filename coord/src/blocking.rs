//! The same primitives as plain blocking functions, for programs without an
//! async runtime (cargo feature `blocking`, on by default).
//!
//! [`connect`] gives a [`Coord`] whose handles ([`Locks`], [`Leases`],
//! [`Fencing`], [`Elections`], [`Barriers`], [`RateLimiter`],
//! [`Semaphores`], [`RwLocks`], [`Queues`]) have the async handles' methods,
//! with the same names and arguments, as functions that block until the
//! store answered. Their guards ([`Guard`], [`Permit`], [`Leadership`],
//! [`RwGuard`], [`Delivery`], [`MultiGuard`]) end with blocking calls too
//! and **release on drop**.
//!
//! ```
//! use std::time::Duration;
//!
//! fn main() -> coord::Result<()> {
//!     let coord = coord::blocking::connect("memory://")?;
//!     let locks = coord.locks()?;
//!     let mut guard = locks.acquire("order:42", Duration::from_secs(30), Duration::from_secs(5))?;
//!     guard.keep_alive(); // renewed in the background while this thread works
//!     // Pass the fencing token to everything you write while holding the lock.
//!     println!("token {}", guard.fencing_token());
//!     guard.release()?;
//!
//!     // A guard that goes out of scope is released at once, not left to its TTL.
//!     {
//!         let _held = locks.acquire("order:43", Duration::from_secs(30), Duration::ZERO)?;
//!     }
//!     assert!(locks.try_acquire("order:43", Duration::from_secs(30))?.is_some());
//!
//!     let queues = coord.queues()?;
//!     queues.push("emails", b"welcome:42")?;
//!     if let Some(delivery) = queues.pop("emails", Duration::from_secs(30), Duration::ZERO)? {
//!         println!("sending {:?}", delivery.payload());
//!         delivery.ack()?;
//!     }
//!     Ok(())
//! }
//! ```
//!
//! # How it runs
//!
//! Like `reqwest::blocking`, a client owns a tokio runtime: a multi-thread
//! runtime with one worker thread (`coord-blocking`), started by
//! [`connect`] and shared by the client's clones, handles and guards. Each
//! call blocks the calling thread on the async call. The worker thread runs
//! what goes on in the background (the watchdog of
//! [`keep_alive`](Guard::keep_alive), the store's notifications, the
//! connection's own tasks, cleanups) while your thread does other work or
//! sleeps. The runtime stops when the client's last clone, handle or guard
//! is dropped (waiting up to a second for its thread); work it still had
//! in the background then ends, and what that work would have released
//! ends with its TTL.
//!
//! # Dropping a guard
//!
//! A guard dropped without `release` (or a delivery without `ack` or
//! `nack`) is released on the store before the drop returns, blocking up to
//! [`RELEASE_ON_DROP_TIMEOUT`] and ignoring errors: the next owner gets it
//! at once, not after the TTL. Call `release` to know that it happened.
//! A delivery dropped is given back (a `nack` without delay).
//!
//! # Inside an async runtime
//!
//! Blocking there would stall the runtime's thread, or deadlock it. Every
//! call that waits for the store checks first, and on a thread that is
//! inside a tokio runtime's context (an async task, `block_on`, a
//! `spawn_blocking` closure, a `Handle::enter` scope) returns
//! [`Error::InvalidArgument`] with field `runtime`, having done nothing:
//! use the async API there ([`crate::connect`] and its handles). Calls that
//! do not wait (`keep_alive`, `fencing_token`, `is_valid`, ...) work
//! anywhere. A guard dropped inside a runtime (or whose `release`, `ack`
//! or `nack` was refused there) cannot block: its release is started on
//! the client's own runtime in the background instead, as the async
//! guards do, and the claim ends at its TTL at the latest. Dropping a
//! client's last handle there stops its runtime without waiting.
//!
//! The other connection options (a backend's own options type, a
//! PostgreSQL pool builder) go through [`connect_with`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::{Capabilities, Error, Result, Settings};

mod claims;
mod handles;
pub use claims::{Delivery, Guard, Leadership, MultiGuard, Permit, RwGuard};
pub use handles::{
    Barriers, Elections, Fencing, LeaderChanges, Leases, Locks, Queues, RateLimiter, RwLocks,
    Semaphores,
};

/// How long dropping a guard (or a delivery, or a [`MultiGuard`]) waits for
/// its release on the store: 5 s, about one store call's own time limit.
/// If the store has not answered by then, the drop returns; the release is
/// sent again in the background while the client's runtime runs, and the
/// claim ends at its TTL at the latest.
pub const RELEASE_ON_DROP_TIMEOUT: Duration = Duration::from_secs(5);

/// How long dropping a client's last handle waits for its runtime's
/// threads to stop.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(1);

/// Connect to the store named by `url`, as [`crate::connect`] does, and get
/// a blocking client for every primitive.
///
/// Errors: those of [`crate::connect`]; [`Error::InvalidArgument`] (field
/// `runtime`) when called inside an async runtime (use
/// [`crate::connect`] there); [`Error::Config`] if the client's runtime
/// cannot be started (the system refused a thread).
///
/// ```
/// let coord = coord::blocking::connect("memory://").unwrap();
/// assert_eq!(coord.capabilities().backend, "memory");
/// ```
pub fn connect(url: &str) -> Result<Coord> {
    connect_with(|| crate::connect(url))
}

/// A blocking client from an async connect call of your own, for the
/// options a URL does not carry: `connect` is run on the client's runtime,
/// where the connection's background tasks then live.
///
/// Errors: those of `connect`, and as [`connect`].
///
/// ```
/// # fn main() -> coord::Result<()> {
/// let coord = coord::blocking::connect_with(|| async { coord::connect("memory://").await })?;
/// # let _ = coord; Ok(()) }
/// ```
pub fn connect_with<F, Fut>(connect: F) -> Result<Coord>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<coord_core::Coord>>,
{
    check()?;
    let rt = Rt::start()?;
    let inner = rt.block_on(connect())?;
    Ok(Coord { inner, rt })
}

/// A blocking connection to one store, giving every primitive it supports.
///
/// Cheap to clone: clones share the connection and the runtime. Get one with
/// [`connect`]. The primitives: [`locks`](Coord::locks),
/// [`leases`](Coord::leases), [`fencing`](Coord::fencing),
/// [`elections`](Coord::elections), [`barriers`](Coord::barriers),
/// [`limiter`](Coord::limiter), [`semaphores`](Coord::semaphores),
/// [`rw_locks`](Coord::rw_locks), [`queues`](Coord::queues).
#[derive(Clone)]
pub struct Coord {
    inner: coord_core::Coord,
    rt: Rt,
}

impl std::fmt::Debug for Coord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::Coord").field(&self.inner).finish()
    }
}

impl Coord {
    /// What the backend promises.
    pub fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    /// The shared settings.
    pub fn settings(&self) -> Settings {
        self.inner.settings()
    }

    /// The same client with another polling fallback interval (see
    /// [`Settings::poll_interval`]). Zero is raised to 1 ms.
    pub fn with_poll_interval(mut self, poll: Duration) -> Coord {
        self.inner = self.inner.with_poll_interval(poll);
        self
    }
}

/// The runtime of one blocking client, shared by its clones, handles and
/// guards; stopped when the last of them is dropped.
#[derive(Clone)]
struct Rt(Arc<Runtime>);

/// Owns the runtime, to stop it the way the dropping thread allows.
struct Runtime(Option<tokio::runtime::Runtime>);

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            if in_runtime() {
                // Waiting for its threads would block an async thread (and
                // tokio panics rather than do it).
                rt.shutdown_background();
            } else {
                rt.shutdown_timeout(SHUTDOWN_TIMEOUT);
            }
        }
    }
}

impl Rt {
    /// A multi-thread runtime with one worker thread: it runs the
    /// background tasks (watchdogs, notifications, connections) whether or
    /// not a caller is blocked on it.
    fn start() -> Result<Rt> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("coord-blocking")
            .enable_all()
            .build()
            .map_err(|e| {
                Error::Config(format!(
                    "cannot start the runtime of coord::blocking (one thread): {e}"
                ))
            })?;
        Ok(Rt(Arc::new(Runtime(Some(rt)))))
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        (self.0)
            .0
            .as_ref()
            .expect("the runtime is stopped only when its last handle is dropped")
    }

    /// Run `call` to its end, blocking this thread; refused inside an async
    /// runtime ([`check`]), with nothing done.
    fn block_on<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        check()?;
        self.runtime().block_on(call)
    }

    /// Enter the runtime's context, for calls that spawn on it without
    /// waiting (the watchdog, the lost-signal timer).
    fn enter(&self) -> tokio::runtime::EnterGuard<'_> {
        self.runtime().enter()
    }

    /// End `claim` with `end`, ignoring the outcome, for a drop: blocking up
    /// to [`RELEASE_ON_DROP_TIMEOUT`]; inside an async runtime, where it
    /// cannot block, by dropping the claim in this runtime's context, which
    /// starts its release in the background.
    fn end_on_drop<C, F>(&self, claim: C, end: impl FnOnce(C) -> F)
    where
        F: Future<Output = Result<()>>,
    {
        if in_runtime() {
            let _entered = self.enter();
            drop(claim);
            return;
        }
        // Dropped within the runtime's context when the time is up, so a
        // release cut short is sent again in the background.
        self.runtime().block_on(async move {
            let _ = tokio::time::timeout(RELEASE_ON_DROP_TIMEOUT, end(claim)).await;
        });
    }
}

/// Whether this thread is inside a tokio runtime's context.
fn in_runtime() -> bool {
    tokio::runtime::Handle::try_current().is_ok()
}

/// Refuse a blocking call inside an async runtime: [`Error::InvalidArgument`]
/// with field `runtime`.
fn check() -> Result<()> {
    if in_runtime() {
        return Err(Error::invalid(
            "runtime",
            "coord::blocking was called from inside an async (tokio) runtime, where blocking would \
             stall or deadlock it; nothing was done. Use the async API inside a runtime \
             (coord::connect(url).await and its handles), or call coord::blocking from a thread \
             that is not in one",
        ));
    }
    Ok(())
}
