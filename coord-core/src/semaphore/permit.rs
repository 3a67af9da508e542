//! Held semaphore permits.

use std::ops::{Deref, DerefMut};

use crate::claim::Guard;
use crate::error::Result;

/// Semaphore permits that are held: a [`Guard`] (through `Deref`, so
/// [`fencing_token`](Guard::fencing_token), [`extend`](Guard::extend),
/// [`keep_alive`](Guard::keep_alive), [`lost`](Guard::lost) and
/// [`lost_token`](Guard::lost_token) work as for locks), plus how many
/// permits it holds.
///
/// # Dropping
/// As for every [`Guard`]: dropping it without [`release`](Permit::release)
/// stops its watchdog and releases the permits in the background if a
/// tokio runtime is available; otherwise they come back at their TTL.
///
/// ```
/// # async fn demo(sem: coord_core::Semaphores) -> coord_core::Result<()> {
/// use std::time::Duration;
/// let mut permit = sem.acquire("workers", 5, Duration::from_secs(10), Duration::from_secs(1)).await?;
/// permit.keep_alive();
/// let stop = permit.lost_token();
/// // ... do the work, stopping if `stop` is cancelled ...
/// # let _ = stop;
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "dropping a permit releases it in the background; keep it while you rely on it"]
pub struct Permit {
    pub(super) guard: Guard,
    pub(super) permits: u32,
    pub(super) permits_total: u32,
}

impl Permit {
    /// How many permits this grant holds.
    ///
    /// ```
    /// # fn demo(p: coord_core::Permit) { assert!(p.permits() >= 1); }
    /// ```
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The name's `permits_total` this grant was taken under.
    ///
    /// ```
    /// # fn demo(p: coord_core::Permit) { assert!(p.permits() <= p.permits_total()); }
    /// ```
    pub fn permits_total(&self) -> u32 {
        self.permits_total
    }

    /// Give the permits back iff this owner still holds them
    /// (compare-and-delete), after stopping the watchdog; wakes the waiters
    /// that can now be granted. Errors: [`Error::NotHeld`](crate::Error::NotHeld) if the grant had
    /// expired or been removed (nothing changed). See [`Guard::release`].
    ///
    /// ```
    /// # async fn demo(p: coord_core::Permit) -> coord_core::Result<()> {
    /// p.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn release(self) -> Result<()> {
        self.guard.release().await
    }

    /// The underlying guard, for code written against [`Guard`].
    ///
    /// ```
    /// # fn demo(p: coord_core::Permit) { let g: coord_core::Guard = p.into_guard(); drop(g); }
    /// ```
    pub fn into_guard(self) -> Guard {
        self.guard
    }
}

impl Deref for Permit {
    type Target = Guard;
    fn deref(&self) -> &Guard {
        &self.guard
    }
}

impl DerefMut for Permit {
    fn deref_mut(&mut self) -> &mut Guard {
        &mut self.guard
    }
}
