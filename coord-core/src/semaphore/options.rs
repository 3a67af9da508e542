//! How to take semaphore permits.

use std::time::Duration;

/// How to take semaphore permits: how many, of how many, for how long, how
/// long to wait, and whether the watchdog keeps them alive.
///
/// ```
/// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
/// use std::time::Duration;
/// use coord_core::PermitOptions;
/// // 2 of the 8 permits of "gpu-pool", for 30 s, renewed until release,
/// // waiting up to 10 s for them.
/// let opts = PermitOptions::new(8, Duration::from_secs(30))
///     .permits(2)
///     .wait(Duration::from_secs(10))
///     .watchdog(true);
/// let permit = coord.semaphores()?.acquire_with("gpu-pool", opts).await?;
/// assert_eq!(permit.permits(), 2);
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PermitOptions {
    /// How many permits to take at once, all or none (default 1).
    pub permits: u32,
    /// How many permits the name has in all. It binds while the name is in
    /// use: see [`Semaphores`](crate::Semaphores).
    pub permits_total: u32,
    /// Time-to-live of the grant (and of each renewal).
    pub ttl: Duration,
    /// How long `acquire` waits for the permits; zero means one attempt.
    pub wait: Duration,
    /// Start the watchdog on the permit's guard.
    pub watchdog: bool,
}

impl PermitOptions {
    /// One permit of `permits_total`, for `ttl`, no waiting, no watchdog.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let o = coord_core::PermitOptions::new(4, Duration::from_secs(5));
    /// assert_eq!((o.permits, o.permits_total, o.wait), (1, 4, Duration::ZERO));
    /// ```
    pub fn new(permits_total: u32, ttl: Duration) -> Self {
        PermitOptions {
            permits: 1,
            permits_total,
            ttl,
            wait: Duration::ZERO,
            watchdog: false,
        }
    }

    /// Take `n` permits at once (all or none).
    ///
    /// ```
    /// # use std::time::Duration;
    /// let o = coord_core::PermitOptions::new(4, Duration::from_secs(5)).permits(3);
    /// assert_eq!(o.permits, 3);
    /// ```
    pub fn permits(mut self, n: u32) -> Self {
        self.permits = n;
        self
    }

    /// Wait up to `wait` for the permits.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let o = coord_core::PermitOptions::new(4, Duration::from_secs(5)).wait(Duration::from_secs(1));
    /// assert_eq!(o.wait, Duration::from_secs(1));
    /// ```
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Keep the permits alive with the watchdog until release.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let o = coord_core::PermitOptions::new(4, Duration::from_secs(5)).watchdog(true);
    /// assert!(o.watchdog);
    /// ```
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }
}
