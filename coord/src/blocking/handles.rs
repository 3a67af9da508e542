//! The blocking handles, one per primitive: each method blocks on the
//! async handle's method of the same name.

mod barrier;
mod election;
mod fencing;
mod lease;
mod limiter;
mod lock;
mod queue;
mod rwlock;
mod semaphore;

use super::claims::{Claim, Guard};
use super::{Coord, Rt};
use crate::{Acquired, Error, Ownership, Result, WithLockError};

pub use barrier::Barriers;
pub use election::{Elections, LeaderChanges};
pub use fencing::Fencing;
pub use lease::Leases;
pub use limiter::RateLimiter;
pub use lock::Locks;
pub use queue::Queues;
pub use rwlock::RwLocks;
pub use semaphore::Semaphores;

/// A plain guard from an async one.
fn guard(rt: &Rt) -> impl Fn(coord_core::Guard) -> Guard + '_ {
    move |g| Guard::new(Claim::Guard(g), rt.clone())
}

/// The same outcome of an `*_or_holders` call, with a blocking grant.
fn acquired<A, B>(a: Acquired<A>, f: impl FnOnce(A) -> B) -> Acquired<B> {
    match a {
        Acquired::Granted(g) => Acquired::Granted(f(g)),
        Acquired::Held(info) => Acquired::Held(info),
    }
}

impl Coord {
    /// The locks of this store.
    ///
    /// Errors: [`Error::Unsupported`] if the backend has no locks.
    pub fn locks(&self) -> Result<Locks> {
        Ok(Locks {
            inner: self.inner.locks()?,
            rt: self.rt.clone(),
        })
    }

    /// The leases of this store. Errors: [`Error::Unsupported`].
    pub fn leases(&self) -> Result<Leases> {
        Ok(Leases {
            inner: self.inner.leases()?,
            rt: self.rt.clone(),
        })
    }

    /// The fencing sources of this store. Errors: [`Error::Unsupported`].
    pub fn fencing(&self) -> Result<Fencing> {
        Ok(Fencing {
            inner: self.inner.fencing()?,
            rt: self.rt.clone(),
        })
    }

    /// The elections of this store. Errors: [`Error::Unsupported`].
    pub fn elections(&self) -> Result<Elections> {
        Ok(Elections {
            inner: self.inner.elections()?,
            rt: self.rt.clone(),
        })
    }

    /// The barriers of this store. Errors: [`Error::Unsupported`].
    pub fn barriers(&self) -> Result<Barriers> {
        Ok(Barriers {
            inner: self.inner.barriers()?,
            rt: self.rt.clone(),
        })
    }

    /// The rate limiters of this store. Errors: [`Error::Unsupported`].
    pub fn limiter(&self) -> Result<RateLimiter> {
        Ok(RateLimiter {
            inner: self.inner.limiter()?,
            rt: self.rt.clone(),
        })
    }

    /// The semaphores of this store. Errors: [`Error::Unsupported`].
    pub fn semaphores(&self) -> Result<Semaphores> {
        Ok(Semaphores {
            inner: self.inner.semaphores()?,
            rt: self.rt.clone(),
        })
    }

    /// The read-write locks of this store. Errors: [`Error::Unsupported`]
    /// when the store has no semaphores, or its semaphores do not queue
    /// waiters in order.
    pub fn rw_locks(&self) -> Result<RwLocks> {
        Ok(RwLocks {
            inner: self.inner.rw_locks()?,
            rt: self.rt.clone(),
        })
    }

    /// Work queues on this store, with the default [`QueueConfig`](crate::QueueConfig).
    /// Errors: [`Error::Unsupported`].
    pub fn queues(&self) -> Result<Queues> {
        Ok(Queues {
            inner: self.inner.queues()?,
            rt: self.rt.clone(),
        })
    }
}

/// Run `work` under `guard` (its watchdog on) on this thread, then end the
/// claim: the blocking scoped forms (`with_lock`, `with_leadership`). A
/// claim that was no longer valid when `work` ended gives its output back
/// as [`WithLockError::Release`] with [`Error::Lost`].
fn hold_while<F, T>(guard: Guard, work: F) -> std::result::Result<T, WithLockError<T>>
where
    F: FnOnce(Ownership) -> T,
{
    let output = work(guard.ownership());
    let held = guard.is_valid();
    let lost = Error::Lost {
        name: guard.ownership().name().to_string(),
    };
    match guard.release() {
        Ok(()) if held => Ok(output),
        Ok(()) | Err(Error::NotHeld { .. }) => Err(WithLockError::Release {
            output,
            error: lost,
        }),
        Err(_) if !held => Err(WithLockError::Release {
            output,
            error: lost,
        }),
        Err(error) => Err(WithLockError::Release { output, error }),
    }
}
