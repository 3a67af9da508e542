//! [`Ownership`]: a cheap, clonable view of a held claim, for the code
//! running under it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Inner, spawn_deadline_timer};
use crate::types::FencingToken;

/// A cheap, clonable view of a held claim, for the code running under it
/// (what [`Locks::with_lock`](crate::Locks::with_lock) hands its closure).
#[derive(Clone)]
pub struct Ownership {
    pub(super) inner: Arc<Inner>,
}

impl std::fmt::Debug for Ownership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ownership")
            .field("name", &self.inner.name)
            .field("fencing_token", &self.inner.token)
            .finish_non_exhaustive()
    }
}

impl Ownership {
    /// The claim's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }
    /// The grant's fencing token.
    pub fn fencing_token(&self) -> FencingToken {
        self.inner.token
    }
    /// Time left before the local validity deadline.
    pub fn remaining(&self) -> Duration {
        self.inner
            .deadline()
            .saturating_duration_since(Instant::now())
    }
    /// Whether the claim is still valid locally.
    pub fn is_valid(&self) -> bool {
        !self.inner.is_released() && !self.inner.is_lost() && !self.remaining().is_zero()
    }
    /// Completes when ownership is lost; see [`Guard::lost`](crate::Guard::lost).
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.inner.clone().lost()
    }
    /// Cancelled when ownership is lost; see [`Guard::lost_token`](crate::Guard::lost_token).
    pub fn lost_token(&self) -> CancellationToken {
        spawn_deadline_timer(&self.inner);
        self.inner.token()
    }
}
