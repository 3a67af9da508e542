//! [`Delivery`]: a queue message delivered to this consumer, a blocking
//! guard plus the message, ended by a blocking ack or nack.

use std::ops::{Deref, DerefMut};
use std::time::{Duration, SystemTime};

use super::{Claim, Guard};
use crate::blocking::Rt;
use crate::{Lane, Message, MessageId, Result};

/// A message delivered to this consumer: a [`Guard`] (through `Deref`:
/// fencing token, [`extend`](Guard::extend) of the visibility,
/// [`keep_alive`](Guard::keep_alive), [`lost_token`](Guard::lost_token)),
/// plus the message. The blocking form of [`crate::Delivery`].
///
/// End it with [`ack`](Delivery::ack) or [`nack`](Delivery::nack).
/// Dropped without either, it is given back at once (a `nack` without
/// delay), blocking as a guard's release on drop does.
#[must_use = "dropping a delivery gives it back; ack or nack it"]
pub struct Delivery {
    guard: Guard,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.guard.fmt(f)
    }
}

impl Delivery {
    pub(in crate::blocking) fn new(delivery: coord_core::Delivery, rt: Rt) -> Delivery {
        Delivery {
            guard: Guard::new(Claim::Delivery(delivery), rt),
        }
    }

    fn inner(&self) -> &coord_core::Delivery {
        match self.guard.claim() {
            Claim::Delivery(d) => d,
            _ => unreachable!("a blocking delivery holds a delivery"),
        }
    }

    /// Take the delivery out to end it (see [`Guard::take`]).
    fn take(self) -> Result<(coord_core::Delivery, Rt)> {
        match self.guard.take()? {
            (Claim::Delivery(d), rt) => Ok((d, rt)),
            _ => unreachable!("a blocking delivery holds a delivery"),
        }
    }

    /// The message id.
    pub fn id(&self) -> MessageId {
        self.inner().id()
    }

    /// The queue's name.
    pub fn queue(&self) -> &str {
        self.inner().queue()
    }

    /// The lane it was popped from.
    pub fn lane(&self) -> Lane {
        self.inner().lane()
    }

    /// The payload bytes.
    pub fn payload(&self) -> &[u8] {
        self.inner().payload()
    }

    /// The payload decoded from JSON.
    ///
    /// Errors: [`Error::Payload`](crate::Error::Payload) if it is not a `T`
    /// (the delivery is unchanged).
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        self.inner().json()
    }

    /// Its group (`None`: the group `""`).
    pub fn group(&self) -> Option<&str> {
        self.inner().group()
    }

    /// How many times it has been delivered, this time included.
    pub fn attempts(&self) -> u32 {
        self.inner().attempts()
    }

    /// When it was pushed (the store's clock where it has one).
    pub fn enqueued_at(&self) -> SystemTime {
        self.inner().enqueued_at()
    }

    /// The whole message.
    pub fn message(&self) -> &Message {
        self.inner().message()
    }

    /// Done: delete the message iff this delivery still holds it.
    ///
    /// Errors: as [`crate::Delivery::ack`]; inside an async runtime
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument), and the
    /// delivery is given back in the background, as on drop.
    pub fn ack(self) -> Result<()> {
        let (delivery, rt) = self.take()?;
        rt.block_on(delivery.ack())
    }

    /// Give the message back iff this delivery still holds it: deliverable
    /// again after `delay` (zero: at once), attempt count kept.
    ///
    /// Errors: as [`crate::Delivery::nack`]; inside an async runtime as
    /// [`ack`](Delivery::ack).
    pub fn nack(self, delay: Duration) -> Result<()> {
        let (delivery, rt) = self.take()?;
        rt.block_on(delivery.nack(delay))
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
