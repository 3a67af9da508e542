//! The work-queue part of the workload: a producer pushing numbered
//! messages (each number its dedup id, so a push retried after a lost
//! reply is not doubled), consumers popping with random visibilities,
//! watchdogs, cancellations, nacks and drops, and the drain that takes
//! what is left once the faults stop.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::faults::queue::{Effects, QueueDelivery};
use coord_core::{Coord, PopOptions, PushOptions, Queues};
use tokio::time::Instant;

use crate::workload::{Recorded, TTLS, Task, kind};
use crate::world::World;

/// The queue the workload uses.
pub const QUEUE_NAME: &str = "jobs";

/// Push numbered messages until `end`; the numbers whose push was
/// answered are recorded as pushed.
pub async fn produce(
    world: Arc<World>,
    queues: Queues,
    recorded: Arc<Mutex<Recorded>>,
    end: Instant,
) {
    let mut n = 0u64;
    while Instant::now() < end {
        let opts = PushOptions::new().dedup_id(format!("m{n}"));
        match queues.push_with(QUEUE_NAME, n.to_string(), &opts).await {
            Ok(id) => {
                world.log(format!(
                    "producer pushed m{n} as id {} (duplicate: {})",
                    id.id, id.duplicate
                ));
                recorded
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .pushed
                    .insert(n);
                n += 1;
            }
            Err(e) => world.log(format!("producer push m{n} failed: {}", kind(&e))),
        }
        tokio::time::sleep(world.millis(50, 600)).await;
    }
}

impl Task {
    /// One pop, and what is done with its delivery.
    pub(crate) async fn queue_op(&self) {
        let w = &self.world;
        let vis = Duration::from_millis(w.pick(&TTLS));
        let wait = Duration::from_millis(w.pick(&[0, 300, 1500]));
        let watchdog = w.chance(0.3);
        let cancel = w.chance(0.2).then(|| w.millis(1, 1500));
        let opts = PopOptions::new(vis).wait(wait).watchdog(watchdog);
        self.log(format!(
            "pop vis={}ms wait={}ms watchdog={watchdog} cancel={cancel:?}",
            vis.as_millis(),
            wait.as_millis()
        ));
        let asked = Instant::now();
        let r = match cancel {
            Some(c) => {
                match tokio::time::timeout(c, self.queues.pop_with(QUEUE_NAME, opts)).await {
                    Ok(r) => r,
                    Err(_) => {
                        self.log("pop cancelled".into());
                        return;
                    }
                }
            }
            None => self.queues.pop_with(QUEUE_NAME, opts).await,
        };
        let d = match r {
            Ok(Some(d)) => d,
            Ok(None) => return,
            Err(e) => {
                self.log(format!("pop failed: {}", kind(&e)));
                return;
            }
        };
        let granted = Instant::now();
        let token = d.fencing_token().get();
        let message: u64 = std::str::from_utf8(d.payload())
            .ok()
            .and_then(|s| s.parse().ok())
            .expect("the producer pushes numbers");
        self.log(format!("delivered m{message} id={} token={token}", d.id()));
        if !watchdog && w.chance(0.1) {
            self.stale_step(d, message, token, asked, granted, vis)
                .await;
            return;
        }
        tokio::time::sleep(w.millis(0, vis.as_millis() as u64)).await;
        let mut valid_until = Instant::now().min(d.valid_until());
        let applied = d.is_valid() && self.effects.apply(message, token);
        let (mut acked, mut ack_unknown) = (false, false);
        match (applied, w.range(0, 5)) {
            (true, 0) => {
                self.log(format!("drop m{message}"));
                drop(d);
            }
            (true, 1) => {
                let r = d.nack(Duration::ZERO).await;
                self.log(format!("nack m{message}: {:?}", r.as_ref().map_err(kind)));
            }
            (true, _) => {
                valid_until = Instant::now().min(valid_until);
                let r = d.ack().await;
                self.log(format!("ack m{message}: {:?}", r.as_ref().map_err(kind)));
                match r {
                    Ok(()) => acked = true,
                    Err(e) => ack_unknown = e.is_retryable(),
                }
            }
            (false, _) => {
                self.log(format!("m{message} token={token} no longer valid"));
                drop(d);
            }
        }
        self.recorded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .deliveries
            .push(QueueDelivery {
                client: self.id,
                message,
                token,
                asked,
                granted,
                valid_until,
                acked,
                ack_unknown,
            });
    }
}

impl Task {
    /// A consumer whose visibility lapsed acks or nacks its delivery: the
    /// store must refuse it. The pop was applied before its reply came
    /// (`granted`), so its visibility ended by `granted + vis` on the
    /// store's clock, before the step is sent.
    async fn stale_step(
        &self,
        d: coord_core::Delivery,
        message: u64,
        token: u64,
        asked: Instant,
        granted: Instant,
        vis: Duration,
    ) {
        let valid_until = d.valid_until();
        tokio::time::sleep_until(granted + vis + Duration::from_millis(1)).await;
        let ack = self.world.chance(0.5);
        let r = if ack {
            d.ack().await
        } else {
            d.nack(Duration::ZERO).await
        };
        let step = if ack { "ack" } else { "nack" };
        self.log(format!(
            "stale {step} m{message} token={token}: {:?}",
            r.as_ref().map_err(kind)
        ));
        let mut rec = self.recorded.lock().unwrap_or_else(|p| p.into_inner());
        if r.is_ok() {
            rec.stale_accepted.push(format!(
                "the {step} of m{message} (token {token}) sent after its visibility lapsed was accepted"
            ));
        }
        rec.deliveries.push(QueueDelivery {
            client: self.id,
            message,
            token,
            asked,
            granted,
            valid_until,
            acked: false,
            ack_unknown: false,
        });
    }
}

/// With faults off and the workload done, take and ack every message left
/// (a pop waiting 8 s that finds nothing ends it). Returns the messages
/// acked.
pub async fn drain(world: &World, probe: &Coord, effects: &Effects) -> HashSet<u64> {
    let queues = probe.queues().expect("queues");
    let mut drained = HashSet::new();
    let opts = PopOptions::new(Duration::from_secs(5)).wait(Duration::from_secs(8));
    while let Ok(Some(d)) = queues.pop_with(QUEUE_NAME, opts).await {
        let message: u64 = std::str::from_utf8(d.payload())
            .ok()
            .and_then(|s| s.parse().ok())
            .expect("the producer pushes numbers");
        let token = d.fencing_token().get();
        effects.apply(message, token);
        if d.ack().await.is_ok() {
            drained.insert(message);
        }
    }
    world.log(format!("drained {} messages", drained.len()));
    drained
}
