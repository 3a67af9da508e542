//! Popping: each attempt in a task of its own, and an attempt whose outcome
//! nobody saw abandoned in the background.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use super::Queues;
use super::delivery::Delivery;
use super::options::PopOptions;
use crate::backend::Attempt;
use crate::claim::{ClaimBackend, Guard};
use crate::error::{Error, Result};
use crate::metrics;
use crate::queue_backend::{Lane, Message, MessageId, PopAttempt, Queue};
use crate::settle::{self, Armed, Undo};
use crate::types::OwnerToken;
use crate::validate;
use crate::wait;

impl Queues {
    /// Take the next message of `queue` for `visibility`, waiting up to
    /// `wait` for one. `Ok(None)`: none came within `wait`.
    ///
    /// Errors: [`Error::InvalidArgument`] (nothing sent); store errors.
    /// Cost: one round trip when a message is ready. Cancel-safe: if the
    /// future is dropped while an attempt is on its way, the attempt's
    /// reply is still awaited (each attempt runs in a task of its own).
    /// An attempt whose outcome nobody saw (dropped, timed out, its reply
    /// lost) is abandoned in the background ([`Queue::abandon`]): a
    /// message it delivered comes back at once, not counted as a delivery
    /// (so `max_deliveries(1)` still delivers it once), and a copy of it
    /// landing later delivers nothing.
    ///
    /// ```
    /// # async fn demo(q: coord_core::Queues) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// while let Some(d) = q.pop("jobs", Duration::from_secs(30), Duration::from_secs(1)).await? {
    ///     // ... do the work, writing with d.fencing_token() ...
    ///     d.ack().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn pop(
        &self,
        queue: &str,
        visibility: Duration,
        wait: Duration,
    ) -> Result<Option<Delivery>> {
        self.pop_with(queue, PopOptions::new(visibility).wait(wait))
            .await
    }

    /// Pop as `opts` say (lane, visibility, wait, watchdog).
    ///
    /// ```
    /// # async fn demo(q: coord_core::Queues) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// use coord_core::{Lane, PopOptions};
    /// let opts = PopOptions::new(Duration::from_secs(30)).lane(Lane::Dead);
    /// if let Some(dead) = q.pop_with("jobs", opts).await? {
    ///     println!("dead letter {} after {} attempts", dead.id(), dead.attempts());
    ///     dead.ack().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn pop_with(&self, queue: &str, opts: PopOptions) -> Result<Option<Delivery>> {
        validate::name("queue", queue)?;
        let visibility = validate::ttl("visibility", opts.visibility, self.capabilities())?;
        if self.config.max_deliveries == Some(0) {
            return Err(Error::invalid(
                "max_deliveries",
                "is 0; must be at least 1 (or None: never dead-letter)",
            ));
        }
        // Dead letters are not dead-lettered again: the stores apply
        // `max_deliveries` to the main lane only (`queue_state::dead_letters`).
        let config = self.config;
        let store = self.backend.capabilities().backend;
        let span = tracing::debug_span!(
            "coord.queue.pop",
            store = store,
            name = queue,
            lane = opts.lane.as_str(),
            outcome = tracing::field::Empty,
            waited_ms = tracing::field::Empty
        );
        let start = Instant::now();
        let lane = opts.lane;
        let got: Mutex<Option<(Message, Instant, OwnerToken)>> = Mutex::new(None);
        // In `coord_waiting` from the first empty answer until this pop ends.
        let waiting = std::sync::OnceLock::new();
        let outcome = wait::until(
            || {
                let b = self.backend.clone();
                let got = &got;
                async move {
                    let sent = Instant::now();
                    // Each attempt is its own consumer: one whose reply
                    // nobody saw is abandoned on its own, and never used
                    // again.
                    let owner = OwnerToken::random();
                    // The attempt runs in its own task, and the cleanup that
                    // undoes it stays armed until its reply is in hand: if
                    // this pop is dropped meanwhile, the reply still
                    // arrives, to the cleanup.
                    let (b2, name) = (b.clone(), queue.to_string());
                    let task = tokio::spawn(async move {
                        b2.try_pop(&name, lane, &owner, visibility, &config).await
                    });
                    let mut in_flight = Armed::new(GiveBack {
                        backend: b.clone(),
                        queue: queue.to_string(),
                        lane,
                        owner,
                        task,
                    });
                    let reply = (&mut in_flight.get_mut().task).await;
                    // The reply is in hand: a delivery goes to the guard
                    // built from it, with no await in between.
                    in_flight.settled();
                    let reply = match reply {
                        Ok(r) => r,
                        Err(e) => {
                            abandon(b, queue.to_string(), lane, owner, None);
                            return Err(Error::Store {
                                backend: store,
                                operation: "queue pop",
                                message: format!("the pop attempt's task failed: {e}"),
                                source: None,
                            });
                        }
                    };
                    match reply {
                        Ok(PopAttempt::Delivered { message, token }) => {
                            *got.lock().unwrap_or_else(|p| p.into_inner()) =
                                Some((message, sent, owner));
                            Ok(Attempt::Granted(token))
                        }
                        Ok(PopAttempt::Empty { next_in }) => Ok(Attempt::Held {
                            expires_in: next_in,
                        }),
                        Err(e) => {
                            // A timeout or a lost connection: the attempt
                            // may have reached the store, or may still.
                            if e.is_retryable() {
                                abandon(b, queue.to_string(), lane, owner, None);
                            }
                            Err(e)
                        }
                    }
                }
            },
            || {
                let _ = waiting.set(metrics::Counted::waiting(store, "delivery"));
                let b = self.backend.clone();
                async move { b.subscribe(queue, lane).await }
            },
            wait::deadline_in(opts.wait),
            self.settings.poll_interval,
        )
        .instrument(span.clone())
        .await;
        drop(waiting);
        span.record("waited_ms", start.elapsed().as_millis() as u64);
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                span.record("outcome", "error");
                metrics::error(store, &e);
                return Err(e);
            }
        };
        let taken = got.lock().unwrap_or_else(|p| p.into_inner()).take();
        match (outcome.granted, taken) {
            (Some(token), Some((message, sent_at, owner))) => {
                span.record("outcome", "delivered");
                metrics::queue_op(store, "deliver");
                let mut guard = Guard::new(
                    ClaimBackend::Delivery {
                        queue: self.backend.clone(),
                        lane,
                        id: message.id,
                    },
                    queue,
                    owner,
                    token,
                    visibility,
                    sent_at,
                );
                if opts.watchdog {
                    guard.keep_alive();
                }
                Ok(Some(Delivery {
                    guard,
                    message,
                    lane,
                }))
            }
            _ => match outcome.last_error {
                Some(e) => {
                    span.record("outcome", "error");
                    metrics::error(store, &e);
                    Err(e)
                }
                None => {
                    span.record("outcome", "empty");
                    Ok(None)
                }
            },
        }
    }
}

/// The undo of a pop attempt whose reply its pop did not wait for: once the
/// reply comes, what the attempt may have done is abandoned ([`abandon`]).
struct GiveBack {
    backend: Arc<dyn Queue>,
    queue: String,
    lane: Lane,
    owner: OwnerToken,
    /// The attempt on its way.
    task: tokio::task::JoinHandle<Result<PopAttempt>>,
}

impl Undo for GiveBack {
    fn start(self) {
        let GiveBack {
            backend,
            queue,
            lane,
            owner,
            task,
        } = self;
        settle::spawn(async move {
            let id = match task.await {
                Ok(Ok(PopAttempt::Delivered { message, .. })) => Some(message.id),
                Ok(Ok(PopAttempt::Empty { .. })) => return,
                Ok(Err(e)) if !e.is_retryable() => return,
                _ => None,
            };
            abandon_now(backend, queue, lane, owner, id).await;
        });
    }
}

/// Abandon, in the background, the pop attempt made as `owner`, which
/// delivered `id` if its reply said so ([`abandon_now`]).
fn abandon(
    backend: Arc<dyn Queue>,
    queue: String,
    lane: Lane,
    owner: OwnerToken,
    id: Option<MessageId>,
) {
    settle::spawn(abandon_now(backend, queue, lane, owner, id));
}

/// Undo the pop attempt made as `owner`, whose outcome no caller saw
/// ([`Queue::abandon`]: what it delivered comes back uncounted, and a copy
/// landing later delivers nothing), sent again while the store does not
/// answer. A store without it: the delivery `id` a reply showed is given
/// back (a nack without delay); one whose reply was lost comes back when
/// its visibility lapses.
async fn abandon_now(
    backend: Arc<dyn Queue>,
    queue: String,
    lane: Lane,
    owner: OwnerToken,
    id: Option<MessageId>,
) {
    let store = backend.capabilities().backend;
    let r = settle::retrying(store, "queue_give_back", &queue, || {
        backend.abandon(&queue, lane, &owner)
    })
    .await;
    if let (Err(Error::Unsupported { .. }), Some(id)) = (r, id) {
        let _ = settle::retrying(store, "queue_give_back", &queue, || {
            backend.nack(&queue, lane, id, &owner, Duration::ZERO)
        })
        .await;
    }
}
