//! Barriers: wait until N participants have arrived; reusable.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::Barrier;
use crate::coord::{Coord, Settings};
use crate::error::{Error, Result};
use crate::wake::Waiter;
use crate::{validate, wait};

/// Barriers on one store (the seed's "barrier synchronization: wait for
/// all nodes").
///
/// `wait` returns once `parties` distinct participants of the same
/// generation have arrived; the next arrivals form the next generation, so
/// one barrier name serves round after round. Arriving twice counts once.
/// A participant that times out is withdrawn, so it does not count towards
/// a generation it never waited for.
///
/// ```
/// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
/// use std::time::Duration;
/// let barriers = coord.barriers()?;
/// let mut tasks = Vec::new();
/// for worker in ["w1", "w2", "w3"] {
///     let b = barriers.clone();
///     tasks.push(tokio::spawn(async move {
///         b.wait("phase-1", 3, worker, Duration::from_secs(10)).await
///     }));
/// }
/// for t in tasks {
///     t.await.unwrap()?; // all three pass together
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Barriers {
    backend: Arc<dyn Barrier>,
    settings: Settings,
}

impl std::fmt::Debug for Barriers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Barriers")
            .field("backend", &self.backend.capabilities().backend)
            .finish_non_exhaustive()
    }
}

impl Coord {
    /// The barriers of this store. Errors: [`Error::Unsupported`].
    pub fn barriers(&self) -> Result<Barriers> {
        Ok(Barriers {
            backend: self
                .barrier
                .clone()
                .ok_or_else(|| self.unsupported("barriers"))?,
            settings: self.settings,
        })
    }
}

impl Barriers {
    /// Arrive at `name` as `participant` and wait until `parties`
    /// participants of this generation have arrived. Returns the generation
    /// that completed.
    ///
    /// Errors: [`Error::Timeout`] after `timeout` (the participant has been
    /// withdrawn); [`Error::InvalidArgument`] for bad input, or a `parties`
    /// different from the one the current generation was started with
    /// (nothing changed). Cancel-safe: a dropped wait withdraws the
    /// participant in the background.
    pub async fn wait(
        &self,
        name: &str,
        parties: u32,
        participant: &str,
        timeout: Duration,
    ) -> Result<u64> {
        validate::name("name", name)?;
        validate::name("participant", participant)?;
        validate::parties(parties)?;
        let span = tracing::debug_span!(
            "coord.barrier.wait",
            backend = self.backend.capabilities().backend,
            name,
            participant,
            parties
        );
        async {
            let deadline = Instant::now() + timeout;
            let arrival = self.backend.arrive(name, parties, participant).await?;
            if arrival.complete {
                return Ok(arrival.generation);
            }
            let generation = arrival.generation;
            let mut pending = Withdraw {
                backend: Some(self.backend.clone()),
                name,
                participant,
                generation,
            };
            let waiter = match self.backend.subscribe(name).await {
                Ok(w) => w,
                Err(e) if e.is_retryable() => Waiter::never(),
                Err(e) => return Err(e),
            };
            loop {
                let notified = waiter.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let mut sleep = wait::jittered(self.settings.poll_interval);
                match self.backend.is_complete(name, generation).await {
                    Ok(true) => {
                        pending.backend = None;
                        return Ok(generation);
                    }
                    Ok(false) => {}
                    Err(e) if e.is_retryable() => {
                        tracing::debug!(error = %e, "barrier check failed, retrying");
                        sleep = Duration::from_millis(20).min(sleep);
                    }
                    Err(e) => return Err(e),
                }
                if Instant::now() >= deadline {
                    pending.backend = None;
                    return if self.backend.withdraw(name, generation, participant).await? {
                        Err(Error::Timeout {
                            operation: "barrier wait",
                            name: name.to_string(),
                            waited: timeout,
                        })
                    } else {
                        // Completed while we were giving up: we passed.
                        Ok(generation)
                    };
                }
                let until = (Instant::now() + sleep).min(deadline);
                tokio::select! {
                    _ = &mut notified => {}
                    _ = tokio::time::sleep_until(until) => {}
                }
            }
        }
        .instrument(span)
        .await
    }
}

/// Withdraws a participant whose wait was dropped midway.
struct Withdraw<'a> {
    backend: Option<Arc<dyn Barrier>>,
    name: &'a str,
    participant: &'a str,
    generation: u64,
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        let Some(backend) = self.backend.take() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (name, participant, generation) = (
            self.name.to_string(),
            self.participant.to_string(),
            self.generation,
        );
        rt.spawn(async move {
            if let Err(e) = backend.withdraw(&name, generation, &participant).await {
                tracing::debug!(name, error = %e, "withdraw after a cancelled barrier wait failed");
            }
        });
    }
}
