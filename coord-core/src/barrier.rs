//! Barriers: wait until N participants have arrived; reusable.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::Barrier;
use crate::coord::{Coord, Settings};
use crate::error::{Error, Result};
use crate::types::{Arrival, OwnerToken};
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
    /// (nothing changed). Cancel-safe: a dropped wait (even one dropped
    /// while its arrival was being recorded) withdraws the participant in
    /// the background. One participant should not wait twice at the same
    /// time: the two waits share one arrival, and either one's timeout
    /// withdraws it.
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
            parties,
            outcome = tracing::field::Empty
        );
        let r = async {
            let deadline = wait::deadline_in(timeout);
            // The arrival runs in its own task: if this wait is dropped while
            // the store records it, the guard below still learns the
            // generation and withdraws the participant.
            let mut pending = Pending {
                backend: self.backend.clone(),
                name: name.to_string(),
                participant: participant.to_string(),
                stage: Stage::Done,
            };
            let arriving = tokio::spawn(arrive(
                self.backend.clone(),
                name.to_string(),
                parties,
                participant.to_string(),
                OwnerToken::random(),
                deadline,
                self.settings.poll_interval,
            ));
            pending.stage = Stage::Arriving(arriving);
            let arrival = match &mut pending.stage {
                Stage::Arriving(handle) => handle.await,
                _ => unreachable!("set just above"),
            };
            pending.stage = Stage::Done;
            let arrival = arrival.map_err(|e| Error::Store {
                backend: self.backend.capabilities().backend,
                operation: "barrier arrive",
                message: format!("the arrival task failed: {e}"),
            })??;
            if arrival.complete {
                return Ok(arrival.generation);
            }
            let generation = arrival.generation;
            pending.stage = Stage::Waiting(generation);
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
                        pending.stage = Stage::Done;
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
                    // If this is cancelled or fails, the guard withdraws in
                    // the background (withdrawing is idempotent).
                    let withdrawn = self.backend.withdraw(name, generation, participant).await?;
                    pending.stage = Stage::Done;
                    return if withdrawn {
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
        .instrument(span.clone())
        .await;
        span.record(
            "outcome",
            match &r {
                Ok(_) => "passed",
                Err(Error::Timeout { .. }) => "timeout",
                Err(_) => "error",
            },
        );
        // Once per wait (retried calls inside it count with the error
        // they end in); bad input and a timeout are not store errors.
        if let Err(e) = &r {
            crate::metrics::error(self.backend.capabilities().backend, e);
        }
        r
    }
}

/// Record an arrival, retrying retryable errors until the deadline
/// (arriving is idempotent per participant and per arrival id, so a retry
/// after a lost reply counts once, even if that arrival completed its
/// generation).
async fn arrive(
    backend: Arc<dyn Barrier>,
    name: String,
    parties: u32,
    participant: String,
    arrival: OwnerToken,
    deadline: Instant,
    poll: Duration,
) -> Result<Arrival> {
    let mut backoff = Duration::from_millis(20);
    loop {
        match backend.arrive(&name, parties, &participant, &arrival).await {
            Err(e) if e.is_retryable() && Instant::now() + backoff < deadline => {
                tracing::debug!(error = %e, "barrier arrive failed, retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(poll).min(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}

/// Where a barrier wait stands, for the guard that cleans up after a wait
/// that was dropped (or failed) midway.
enum Stage {
    /// The arrival is being recorded.
    Arriving(JoinHandle<Result<Arrival>>),
    /// Arrived in this generation, not yet passed.
    Waiting(u64),
    /// Passed, withdrawn, or never arrived: nothing to undo.
    Done,
}

/// Withdraws the participant of a wait that ended without passing or
/// withdrawing (cancelled, or failed after arriving).
struct Pending {
    backend: Arc<dyn Barrier>,
    name: String,
    participant: String,
    stage: Stage,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let stage = std::mem::replace(&mut self.stage, Stage::Done);
        if matches!(stage, Stage::Done) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let backend = self.backend.clone();
        let name = std::mem::take(&mut self.name);
        let participant = std::mem::take(&mut self.participant);
        rt.spawn(async move {
            let generation = match stage {
                Stage::Waiting(g) => g,
                Stage::Arriving(handle) => match handle.await {
                    Ok(Ok(a)) if !a.complete => a.generation,
                    _ => return,
                },
                Stage::Done => return,
            };
            if let Err(e) = backend.withdraw(&name, generation, &participant).await {
                crate::metrics::error(backend.capabilities().backend, &e);
                tracing::debug!(name, error = %e, "withdraw after an abandoned barrier wait failed");
            }
        });
    }
}
