//! [`Delivery`]: a message delivered to this consumer, held like a lock
//! until it is acked or given back.

use std::ops::{Deref, DerefMut};
use std::time::{Duration, SystemTime};

use super::check_delay;
use crate::claim::{End, Guard};
use crate::error::{Error, Result};
use crate::metrics;
use crate::queue_backend::{Lane, Message, MessageId};

/// A message delivered to this consumer: a [`Guard`] (through `Deref`, so
/// [`fencing_token`](Guard::fencing_token), [`remaining`](Guard::remaining),
/// [`extend`](Guard::extend) (the visibility), [`keep_alive`](Guard::keep_alive),
/// [`lost`](Guard::lost) and [`lost_token`](Guard::lost_token) work as for
/// locks), plus the message.
///
/// End it with [`ack`](Delivery::ack) (done: deleted) or
/// [`nack`](Delivery::nack) (give it back, after a delay).
///
/// # Dropping
/// Dropping a delivery without ack or nack stops its watchdog and gives it
/// back at once in the background (a nack without delay) if a tokio
/// runtime is available; otherwise it is delivered again when its
/// visibility lapses.
///
/// ```
/// # async fn demo(q: coord_core::Queues) -> coord_core::Result<()> {
/// use std::time::Duration;
/// if let Some(mut d) = q.pop("jobs", Duration::from_secs(10), Duration::from_secs(1)).await? {
///     d.keep_alive(); // long work: extend the visibility until ack
///     let stop = d.lost_token(); // cancelled if the delivery lapses
///     // ... work, stopping if `stop` is cancelled ...
///     # let _ = stop;
///     d.ack().await?;
/// }
/// # Ok(()) }
/// ```
#[must_use = "dropping a delivery gives it back in the background; ack or nack it"]
pub struct Delivery {
    pub(super) guard: Guard,
    pub(super) message: Message,
    pub(super) lane: Lane,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("queue", &self.guard.name())
            .field("lane", &self.lane)
            .field("message", &self.message)
            .field("fencing_token", &self.guard.fencing_token())
            .field("remaining", &self.guard.remaining())
            .finish()
    }
}

impl Delivery {
    /// The message id.
    ///
    /// ```
    /// # fn demo(d: coord_core::Delivery) { println!("{}", d.id()); }
    /// ```
    pub fn id(&self) -> MessageId {
        self.message.id
    }

    /// The queue's name.
    ///
    /// ```
    /// # fn demo(d: coord_core::Delivery) { println!("{}", d.queue()); }
    /// ```
    pub fn queue(&self) -> &str {
        self.guard.name()
    }

    /// The lane it was popped from.
    ///
    /// ```
    /// # fn demo(d: coord_core::Delivery) { println!("{:?}", d.lane()); }
    /// ```
    pub fn lane(&self) -> Lane {
        self.lane
    }

    /// The payload bytes.
    ///
    /// ```
    /// # fn demo(d: coord_core::Delivery) { println!("{} bytes", d.payload().len()); }
    /// ```
    pub fn payload(&self) -> &[u8] {
        &self.message.payload
    }

    /// The payload decoded from JSON.
    ///
    /// Errors: [`Error::Payload`] if it is not a `T` (the delivery is
    /// unchanged).
    ///
    /// ```
    /// # fn demo(d: coord_core::Delivery) -> coord_core::Result<()> {
    /// let (task, size): (String, u32) = d.json()?;
    /// # let _ = (task, size); Ok(()) }
    /// ```
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_slice(&self.message.payload).map_err(|e| Error::Payload {
            id: self.message.id.0,
            message: format!("not the JSON of {}: {e}", std::any::type_name::<T>()),
        })
    }

    /// Its group (`None`: the group `""`).
    ///
    /// ```
    /// # fn demo(d: coord_core::Delivery) { println!("{:?}", d.group()); }
    /// ```
    pub fn group(&self) -> Option<&str> {
        self.message.group.as_deref()
    }

    /// How many times it has been delivered, this time included (1 the
    /// first time).
    ///
    /// ```
    /// # fn demo(d: coord_core::Delivery) { assert!(d.attempts() >= 1); }
    /// ```
    pub fn attempts(&self) -> u32 {
        self.message.attempts
    }

    /// When it was pushed (the store's clock where it has one).
    ///
    /// ```
    /// # fn demo(d: coord_core::Delivery) { println!("{:?}", d.enqueued_at()); }
    /// ```
    pub fn enqueued_at(&self) -> SystemTime {
        self.message.enqueued_at
    }

    /// The whole message.
    ///
    /// ```
    /// # fn demo(d: coord_core::Delivery) { assert_eq!(d.message().id, d.id()); }
    /// ```
    pub fn message(&self) -> &Message {
        &self.message
    }

    /// Done: delete the message iff this delivery still holds it, after
    /// stopping the watchdog.
    ///
    /// Errors: [`Error::NotHeld`] if the visibility lapsed (it may have
    /// been delivered to another consumer; nothing was changed); store
    /// errors (then it is delivered again after its visibility).
    /// Cost: one round trip.
    ///
    /// ```
    /// # async fn demo(d: coord_core::Delivery) -> coord_core::Result<()> {
    /// d.ack().await?;
    /// # Ok(()) }
    /// ```
    pub async fn ack(self) -> Result<()> {
        let store = self.guard.store();
        let r = self.guard.end(End::Ack).await;
        if r.is_ok() {
            metrics::queue_op(store, "ack");
        }
        r
    }

    /// Give the message back iff this delivery still holds it: deliverable
    /// again after `delay` (zero: at once), attempt count kept.
    ///
    /// Errors: as for [`ack`](Delivery::ack); a delay over a year is
    /// [`Error::InvalidArgument`]: nothing is sent, and the message is
    /// delivered again when its visibility lapses. Cost: one round trip.
    ///
    /// ```
    /// # async fn demo(d: coord_core::Delivery) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// d.nack(Duration::from_secs(30)).await?; // try again in 30 s
    /// # Ok(()) }
    /// ```
    pub async fn nack(self, delay: Duration) -> Result<()> {
        if let Err(e) = check_delay("delay", delay) {
            // Nothing is sent, and nothing is given back on drop either:
            // the message is delivered again when its visibility lapses.
            self.guard.forget();
            return Err(e);
        }
        let store = self.guard.store();
        let r = self.guard.end(End::Nack(delay)).await;
        if r.is_ok() {
            metrics::queue_op(store, "nack");
        }
        r
    }
}

impl Deref for Delivery {
    type Target = Guard;
    fn deref(&self) -> &Guard {
        &self.guard
    }
}

impl DerefMut for Delivery {
    fn deref_mut(&mut self) -> &mut Guard {
        &mut self.guard
    }
}
