//! How to push and how to pop: [`PushOptions`] and [`PopOptions`].

use std::time::Duration;

use crate::queue_backend::{DEFAULT_DEDUP_WINDOW, Lane};

/// How to push a message: a delay, a group (tenant) key, a dedup id.
///
/// ```
/// use std::time::Duration;
/// let opts = coord_core::PushOptions::new()
///     .group("tenant-7")
///     .delay(Duration::from_secs(5))
///     .dedup_id("order-1234");
/// assert_eq!(opts.group.as_deref(), Some("tenant-7"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushOptions {
    /// Not deliverable before now + `delay` (default zero).
    pub delay: Duration,
    /// The group (tenant) the message belongs to (default: the group `""`).
    pub group: Option<String>,
    /// A repeated push with this id within `dedup_window` of the first is a
    /// no-op returning the first message's id.
    pub dedup_id: Option<String>,
    /// How long a dedup id is remembered (default
    /// [`DEFAULT_DEDUP_WINDOW`], 5 minutes).
    pub dedup_window: Duration,
}

impl Default for PushOptions {
    fn default() -> Self {
        PushOptions {
            delay: Duration::ZERO,
            group: None,
            dedup_id: None,
            dedup_window: DEFAULT_DEDUP_WINDOW,
        }
    }
}

impl PushOptions {
    /// No delay, no group, no dedup id.
    ///
    /// ```
    /// assert!(coord_core::PushOptions::new().group.is_none());
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Deliverable only after `delay`.
    ///
    /// ```
    /// # use std::time::Duration;
    /// assert_eq!(coord_core::PushOptions::new().delay(Duration::from_secs(1)).delay, Duration::from_secs(1));
    /// ```
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Put the message in `group` (FIFO within it, round-robin across
    /// groups).
    ///
    /// ```
    /// assert_eq!(coord_core::PushOptions::new().group("a").group.as_deref(), Some("a"));
    /// ```
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Deduplicate on `id` within the dedup window.
    ///
    /// ```
    /// assert_eq!(coord_core::PushOptions::new().dedup_id("x").dedup_id.as_deref(), Some("x"));
    /// ```
    pub fn dedup_id(mut self, id: impl Into<String>) -> Self {
        self.dedup_id = Some(id.into());
        self
    }

    /// Remember dedup ids for `window`.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let o = coord_core::PushOptions::new().dedup_window(Duration::from_secs(60));
    /// assert_eq!(o.dedup_window, Duration::from_secs(60));
    /// ```
    pub fn dedup_window(mut self, window: Duration) -> Self {
        self.dedup_window = window;
        self
    }
}

/// How to pop: which lane, for how long a delivery stays invisible to
/// others, how long to wait for one, whether the watchdog keeps it.
///
/// ```
/// use std::time::Duration;
/// let opts = coord_core::PopOptions::new(Duration::from_secs(30))
///     .wait(Duration::from_secs(10))
///     .watchdog(true);
/// assert!(opts.watchdog);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PopOptions {
    /// The lane to pop from (default [`Lane::Main`]).
    pub lane: Lane,
    /// How long the delivery is invisible to other consumers (and each
    /// extension's length).
    pub visibility: Duration,
    /// How long to wait for a message; zero means one attempt.
    pub wait: Duration,
    /// Start the watchdog on the delivery (extends at a third of the
    /// visibility until ack or nack).
    pub watchdog: bool,
}

impl PopOptions {
    /// Main lane, `visibility`, no waiting, no watchdog.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let o = coord_core::PopOptions::new(Duration::from_secs(30));
    /// assert_eq!(o.wait, Duration::ZERO);
    /// ```
    pub fn new(visibility: Duration) -> Self {
        PopOptions {
            lane: Lane::Main,
            visibility,
            wait: Duration::ZERO,
            watchdog: false,
        }
    }

    /// Wait up to `wait` for a message.
    ///
    /// ```
    /// # use std::time::Duration;
    /// assert_eq!(coord_core::PopOptions::new(Duration::from_secs(1)).wait(Duration::from_secs(2)).wait, Duration::from_secs(2));
    /// ```
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Pop from `lane` (the dead letters, with [`Lane::Dead`]).
    ///
    /// ```
    /// # use std::time::Duration;
    /// use coord_core::Lane;
    /// assert_eq!(coord_core::PopOptions::new(Duration::from_secs(1)).lane(Lane::Dead).lane, Lane::Dead);
    /// ```
    pub fn lane(mut self, lane: Lane) -> Self {
        self.lane = lane;
        self
    }

    /// Keep the delivery invisible with the watchdog until ack or nack.
    ///
    /// ```
    /// # use std::time::Duration;
    /// assert!(coord_core::PopOptions::new(Duration::from_secs(1)).watchdog(true).watchdog);
    /// ```
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }
}
