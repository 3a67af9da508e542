//! Barriers: wait until N participants have arrived; reusable.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{ANY_GENERATION, Barrier};
use crate::coord::{Coord, Settings};
use crate::error::{Error, Result};
use crate::settle::{self, Armed, Undo};
use crate::types::{Arrival, OwnerToken};
use crate::wake::Waiter;
use crate::{validate, wait};

/// Barriers on one store (the "barrier synchronization: wait for
/// all nodes" scenario).
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
    /// (nothing changed); store errors. Cancel-safe: a dropped wait (even
    /// one dropped while its arrival was being recorded) withdraws the
    /// participant in the background. An arrival whose outcome the wait
    /// never learned (its reply lost, and every retry failing until the
    /// deadline: the wait returns that error) is settled in the background
    /// too: it is sent again with the same arrival id (which counts once;
    /// for up to 10 minutes while the store does not answer) to learn its
    /// generation, and that arrival is withdrawn from it. Every withdraw
    /// names the wait's arrival id: it undoes that arrival only (a next
    /// wait of the same participant stays), and a late copy of it landing
    /// afterwards is refused and counts for nothing. One participant may
    /// wait twice at the same time: it counts once while either waits. The
    /// store tells a late copy by its stamp (no newer than an arrival of
    /// the participant that passed or was withdrawn), so once the later
    /// of two such waits has ended, the earlier one's arrival, if it had
    /// not landed yet, fails with [`Error::ArrivalLost`].
    ///
    /// [`Error::ArrivalLost`] when the barrier's state was lost (swept as
    /// abandoned, or expired while this waiter was cut off from the store)
    /// and made again after this wait arrived: the wait did not pass; wait
    /// again to arrive anew.
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
            store = self.backend.capabilities().backend,
            name,
            participant,
            parties,
            outcome = tracing::field::Empty
        );
        let r = async {
            let deadline = wait::deadline_in(timeout);
            let arrival_id = OwnerToken::random();
            // The arrival runs in its own task: if this wait is dropped while
            // the store records it, the cleanup still learns the generation
            // and withdraws the participant.
            let arriving = tokio::spawn(arrive(
                self.backend.clone(),
                name.to_string(),
                parties,
                participant.to_string(),
                arrival_id,
                deadline,
                self.settings.poll_interval,
            ));
            // Armed until the store said the participant passed or was
            // withdrawn.
            let mut pending = Armed::new(Withdraw {
                backend: self.backend.clone(),
                name: name.to_string(),
                participant: participant.to_string(),
                arrival: arrival_id,
                stage: Stage::Arriving(arriving),
            });
            let arrived = match &mut pending.get_mut().stage {
                Stage::Arriving(handle) => handle.await,
                _ => unreachable!("set just above"),
            };
            let arrived = match arrived {
                Ok(arrived) => arrived,
                Err(e) => {
                    // Its arrival may have landed: settle it.
                    pending.get_mut().stage = Stage::Unsettled;
                    return Err(Error::Store {
                        backend: self.backend.capabilities().backend,
                        operation: "barrier arrive",
                        message: format!("the arrival task failed: {e}"),
                        source: None,
                    });
                }
            };
            let arrival = match arrived.result {
                Ok(arrival) => arrival,
                Err(e) if arrived.ambiguous => {
                    // A try may have been recorded without an answer, and
                    // none came before the deadline: the participant may
                    // count. Settled in the background.
                    pending.get_mut().stage = Stage::Unsettled;
                    return Err(e);
                }
                Err(e) => {
                    // Refused by the store: nothing was recorded.
                    pending.settled();
                    return Err(e);
                }
            };
            if arrival.complete {
                pending.settled();
                return Ok(arrival.generation);
            }
            let generation = arrival.generation;
            pending.get_mut().stage = Stage::Waiting(generation);
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
                        pending.settled();
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
                    // Armed until the store answered: cancelled, or failed,
                    // the withdraw is sent again in the background
                    // (withdrawing is idempotent).
                    let withdrawn = pending
                        .settle_with(self.backend.withdraw(
                            name,
                            generation,
                            participant,
                            &arrival_id,
                        ))
                        .await?;
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
                    biased;
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

/// How an arrival ended: its result, and whether any try failed in a way
/// that may have been recorded (a retryable error: a lost reply looks the
/// same as a request that never left).
struct Arrived {
    result: Result<Arrival>,
    ambiguous: bool,
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
) -> Arrived {
    let mut backoff = Duration::from_millis(20);
    let mut ambiguous = false;
    loop {
        match backend.arrive(&name, parties, &participant, &arrival).await {
            Err(e) if e.is_retryable() => {
                ambiguous = true;
                if Instant::now() + backoff >= deadline {
                    return Arrived {
                        result: Err(e),
                        ambiguous,
                    };
                }
                tracing::debug!(error = %e, "barrier arrive failed, retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(poll).min(Duration::from_secs(1));
            }
            result => return Arrived { result, ambiguous },
        }
    }
}

/// Where a barrier wait stands, for the cleanup that withdraws the
/// participant of a wait that ended without passing or withdrawing.
enum Stage {
    /// The arrival is being recorded.
    Arriving(JoinHandle<Arrived>),
    /// The arrival ended without an answer that says where it stands: it
    /// may have been recorded.
    Unsettled,
    /// Arrived in this generation, not yet passed.
    Waiting(u64),
}

/// The undo of a barrier wait: withdraw the participant from the generation
/// it arrived in, unless that completed (it passed).
struct Withdraw {
    backend: Arc<dyn Barrier>,
    name: String,
    participant: String,
    /// The wait's arrival id.
    arrival: OwnerToken,
    stage: Stage,
}

impl Undo for Withdraw {
    fn start(self) {
        settle::spawn(async move {
            let Withdraw {
                backend,
                name,
                participant,
                arrival,
                stage,
            } = self;
            let generation = match stage {
                Stage::Waiting(g) => Some(g),
                Stage::Arriving(handle) => match handle.await {
                    Ok(Arrived { result: Ok(a), .. }) => (!a.complete).then_some(a.generation),
                    Ok(Arrived {
                        result: Err(_),
                        ambiguous: false,
                    }) => None,
                    // Maybe recorded, somewhere: withdrawn wherever it
                    // stands (see `ANY_GENERATION`).
                    Ok(Arrived { result: Err(_), .. }) | Err(_) => Some(ANY_GENERATION),
                },
                Stage::Unsettled => Some(ANY_GENERATION),
            };
            let Some(generation) = generation else {
                return;
            };
            let store = backend.capabilities().backend;
            let withdrawn = settle::retrying(store, "barrier_withdraw", &name, || {
                backend.withdraw(&name, generation, &participant, &arrival)
            })
            .await;
            if let Err(e) = withdrawn {
                tracing::debug!(name, error = %e, "withdraw after an abandoned barrier wait failed");
            }
        });
    }
}
