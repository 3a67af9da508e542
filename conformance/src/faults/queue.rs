//! The work queue workload, and the checker of its history.
//!
//! A producer pushes numbered messages (each with its number as dedup id,
//! so a push whose reply was lost is retried safely); every client pops,
//! works for `work` (the watchdog keeping the delivery), applies the
//! message's effect to a per-message fenced register with the delivery's
//! token, then acks (every `nack_every`th delivery it nacks instead). After
//! the run, a drain pops what is left. The checker verifies, from the
//! recorded history alone (one process, one monotonic clock):
//!
//! 1. deliveries' fencing tokens are unique;
//! 2. per message, a delivery asked for after another delivery of it was
//!    returned carries a higher token (so a stale consumer's effect can be
//!    rejected);
//! 3. per message, no two deliveries are valid at once (one consumer per
//!    visibility period);
//! 4. no message is acked twice (an ack that succeeded);
//! 5. no message is lost: every pushed message was acked, in the run or by
//!    the drain;
//! 6. no stale effect: the fenced registers accepted each message's effects
//!    in rising token order, and none from a delivery whose token was below
//!    one already accepted.
//!
//! Tested against hand-made histories that break each rule, and end to end
//! on the in-memory store (coord-memory's `tests/it/faults.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_core::{Coord, PopOptions, PushOptions};
use tokio::time::{Instant, sleep};

use super::report::{Report, Run, expect_retryable, longest_stall};
use super::{FaultLog, Violation};

/// The shape of a queue workload.
#[derive(Debug, Clone, Copy)]
pub struct QueueWorkload {
    /// Each delivery's visibility (and each watchdog extension).
    pub visibility: Duration,
    /// How long a pop waits for a message.
    pub wait: Duration,
    /// The work between delivery and ack.
    pub work: Duration,
    /// Keep deliveries with the watchdog (without it, work longer than the
    /// visibility makes deliveries lapse and go to others).
    pub watchdog: bool,
    /// Every `nack_every`th delivery of a client is nacked (0: never).
    pub nack_every: u32,
    /// The producer's pause between pushes.
    pub push_every: Duration,
    /// How long the workload runs.
    pub duration: Duration,
    /// How long the drain after the run may go without acking anything,
    /// beyond three visibilities (what lapsed under the faults comes back
    /// by then).
    pub drain: Duration,
}

/// One delivery, as its consumer saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueDelivery {
    /// The consumer.
    pub client: usize,
    /// The message's number (its payload).
    pub message: u64,
    /// The delivery's fencing token.
    pub token: u64,
    /// When the pop that delivered it was sent.
    pub asked: Instant,
    /// When the delivery was returned.
    pub granted: Instant,
    /// When the consumer stopped relying on it (the ack or nack was about
    /// to be sent, or its validity deadline, whichever came first).
    pub valid_until: Instant,
    /// Whether its ack succeeded.
    pub acked: bool,
    /// Whether its ack failed with the store unreachable (it may have been
    /// applied: the message then counts as possibly acked, never lost).
    pub ack_unknown: bool,
}

/// One effect a fenced register accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Effect {
    /// The message's number.
    pub message: u64,
    /// The token it was accepted with.
    pub token: u64,
    /// The highest token the register had accepted before it (0: none).
    pub before: u64,
}

/// Per-message fenced registers: an effect is accepted iff its token is at
/// least the highest accepted for that message.
#[derive(Debug, Default)]
pub struct Effects {
    state: Mutex<(HashMap<u64, u64>, Vec<Effect>)>,
}

impl Effects {
    /// Apply message `message`'s effect with `token`; whether accepted.
    pub fn apply(&self, message: u64, token: u64) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let before = s.0.get(&message).copied().unwrap_or(0);
        if token < before {
            return false;
        }
        s.0.insert(message, token);
        s.1.push(Effect {
            message,
            token,
            before,
        });
        true
    }

    /// Every accepted effect, in order.
    pub fn log(&self) -> Vec<Effect> {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .clone()
    }
}

/// Judge a history (see the module doc). `pushed`: the messages whose push
/// succeeded; `drained`: those the drain acked.
pub fn check_queue_history(
    deliveries: &[QueueDelivery],
    effects: &[Effect],
    pushed: &HashSet<u64>,
    drained: &HashSet<u64>,
) -> Vec<Violation> {
    let mut v = Vec::new();
    let mut by_token: Vec<&QueueDelivery> = deliveries.iter().collect();
    by_token.sort_by_key(|d| d.token);
    for w in by_token.windows(2) {
        if w[0].token == w[1].token {
            v.push(Violation {
                rule: "delivery tokens are unique",
                detail: format!(
                    "token {} delivered message {} to client {} and message {} to client {}",
                    w[0].token, w[0].message, w[0].client, w[1].message, w[1].client
                ),
            });
        }
    }
    let mut per_message: HashMap<u64, Vec<&QueueDelivery>> = HashMap::new();
    for d in deliveries {
        per_message.entry(d.message).or_default().push(d);
    }
    for (m, ds) in &mut per_message {
        ds.sort_by_key(|d| d.granted);
        for (i, later) in ds.iter().enumerate() {
            for earlier in &ds[..i] {
                if later.asked > earlier.granted && later.token <= earlier.token {
                    v.push(Violation {
                        rule: "a message's tokens rise over its deliveries",
                        detail: format!(
                            "message {m}: client {} asked after client {}'s delivery (token {}) and got token {}",
                            later.client, earlier.client, earlier.token, later.token
                        ),
                    });
                }
                if later.granted < earlier.valid_until && earlier.granted < later.valid_until {
                    v.push(Violation {
                        rule: "one consumer per visibility period",
                        detail: format!(
                            "message {m}: clients {} (token {}) and {} (token {}) held valid deliveries at once",
                            earlier.client, earlier.token, later.client, later.token
                        ),
                    });
                }
            }
        }
        let acks = ds.iter().filter(|d| d.acked).count() + usize::from(drained.contains(m));
        if acks > 1 {
            v.push(Violation {
                rule: "no message is acked twice",
                detail: format!("message {m} was acked {acks} times"),
            });
        }
    }
    for m in pushed {
        let acked = drained.contains(m)
            || per_message
                .get(m)
                .is_some_and(|ds| ds.iter().any(|d| d.acked || d.ack_unknown));
        if !acked {
            v.push(Violation {
                rule: "no message is lost",
                detail: format!("message {m} was pushed and never acked"),
            });
        }
    }
    let mut highest: HashMap<u64, u64> = HashMap::new();
    for e in effects {
        let h = highest.entry(e.message).or_insert(0);
        if e.token < *h || e.before != *h {
            v.push(Violation {
                rule: "no stale effect",
                detail: format!(
                    "message {}: an effect with token {} was accepted after token {}",
                    e.message, e.token, *h
                ),
            });
        }
        *h = (*h).max(e.token);
    }
    v
}

/// Run the workload on `queue`: a producer on the last client, a consumer
/// on every client, while `faults` runs; then drain with the last client
/// and check the history.
pub async fn run_queue_workload<F>(
    clients: Vec<Coord>,
    queue: &str,
    w: QueueWorkload,
    faults: F,
) -> (Report, FaultLog)
where
    F: std::future::Future<Output = FaultLog>,
{
    let run = Run::new();
    let effects = Arc::new(Effects::default());
    let producer_client = clients.last().expect("at least one client").clone();
    let producer = {
        let (stop, queue) = (run.stop.clone(), queue.to_string());
        tokio::spawn(async move {
            let q = producer_client.queues().expect("queues");
            let (mut pushed, mut errors, mut n) = (HashSet::new(), 0usize, 0u64);
            while !stop.load(Ordering::SeqCst) {
                let opts = PushOptions::new().dedup_id(format!("m{n}"));
                match q.push_with(&queue, n.to_string(), &opts).await {
                    Ok(_) => {
                        pushed.insert(n);
                        n += 1;
                    }
                    Err(e) => {
                        expect_retryable("producer", &e);
                        errors += 1;
                    }
                }
                sleep(w.push_every).await;
            }
            (pushed, errors)
        })
    };
    let drainer = clients.last().expect("at least one client").clone();
    let mut tasks = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        let (stop, queue, effects) = (run.stop.clone(), queue.to_string(), effects.clone());
        tasks.push(tokio::spawn(async move {
            let q = c.queues().expect("queues");
            let opts = PopOptions::new(w.visibility)
                .wait(w.wait)
                .watchdog(w.watchdog);
            let (mut seen, mut errors, mut round) = (Vec::new(), 0usize, 0u32);
            while !stop.load(Ordering::SeqCst) {
                let asked = Instant::now();
                let d = match q.pop_with(&queue, opts).await {
                    Ok(Some(d)) => d,
                    Ok(None) => continue,
                    Err(e) => {
                        expect_retryable(&format!("client {i}"), &e);
                        errors += 1;
                        sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                round += 1;
                let granted = Instant::now();
                let message = std::str::from_utf8(d.payload())
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .expect("the workload's payloads are numbers");
                let token = d.fencing_token().get();
                if d.is_valid() {
                    sleep(w.work).await;
                }
                effects.apply(message, token);
                let now = Instant::now();
                let valid_until = if d.is_valid() {
                    now
                } else {
                    d.valid_until().min(now)
                };
                let nack = w.nack_every > 0 && round % w.nack_every == 0;
                let (acked, ack_unknown) = if nack {
                    if d.nack(Duration::ZERO).await.is_err() {
                        errors += 1;
                    }
                    (false, false)
                } else {
                    match d.ack().await {
                        Ok(()) => (true, false),
                        Err(e) => {
                            errors += 1;
                            (false, e.is_retryable())
                        }
                    }
                };
                seen.push(QueueDelivery {
                    client: i,
                    message,
                    token,
                    asked,
                    granted,
                    valid_until,
                    acked,
                    ack_unknown,
                });
            }
            (seen, errors)
        }));
    }
    let join = w.wait + w.visibility * 2 + Duration::from_secs(30);
    let (results, log, end) = run.finish(tasks, faults, w.duration, join).await;
    let (pushed, producer_errors) = producer.await.expect("the producer panicked");
    let (mut deliveries, mut errors) = (Vec::new(), producer_errors);
    for (d, e) in results {
        deliveries.extend(d);
        errors += e;
    }
    let drained = drain(&drainer, queue, w, &effects).await;
    let violations = check_queue_history(&deliveries, &effects.log(), &pushed, &drained);
    let progress: Vec<Instant> = deliveries
        .iter()
        .filter(|d| d.acked)
        .map(|d| d.granted)
        .collect();
    let from = log.healed.unwrap_or(run.start);
    let redelivered = deliveries.len() as u64 - per_message_count(&deliveries);
    let report = Report {
        ops: progress.len(),
        errors,
        violations,
        longest_stall: longest_stall(&progress, from, end),
        waived: 0,
        extra: vec![
            ("pushed", pushed.len() as u64),
            ("drained", drained.len() as u64),
            ("redelivered", redelivered),
        ],
        progress,
    };
    (report, log)
}

fn per_message_count(deliveries: &[QueueDelivery]) -> u64 {
    deliveries
        .iter()
        .map(|d| d.message)
        .collect::<HashSet<_>>()
        .len() as u64
}

/// Ack whatever is left (deliveries lapsed under faults come back after
/// their visibility); the numbers it acked. It gives up once no message
/// it had not acked before was acked for three visibilities plus
/// `w.drain` (a long run leaves a backlog that takes longer than that to
/// drain, and draining it is progress).
async fn drain(c: &Coord, queue: &str, w: QueueWorkload, effects: &Effects) -> HashSet<u64> {
    let q = c.queues().expect("queues");
    let mut drained = HashSet::new();
    let patience = w.visibility * 3 + w.drain;
    let mut deadline = Instant::now() + patience;
    while Instant::now() < deadline {
        match q.pop(queue, Duration::from_secs(30), w.visibility).await {
            Ok(Some(d)) => {
                let m = std::str::from_utf8(d.payload())
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .expect("the workload's payloads are numbers");
                effects.apply(m, d.fencing_token().get());
                // Only a message not drained before is progress (a broken
                // store may hand out acked ones again and again).
                if d.ack().await.is_ok() && drained.insert(m) {
                    deadline = Instant::now() + patience;
                }
            }
            Ok(None) => match q.stats(queue).await {
                Ok(s) if s.ready + s.delayed + s.in_flight == 0 => break,
                _ => {}
            },
            Err(_) => sleep(Duration::from_millis(50)).await,
        }
    }
    drained
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(
        b: Instant,
        client: usize,
        message: u64,
        token: u64,
        ms: [u64; 3],
        acked: bool,
    ) -> QueueDelivery {
        let at = |n| b + Duration::from_millis(n);
        QueueDelivery {
            client,
            message,
            token,
            asked: at(ms[0]),
            granted: at(ms[1]),
            valid_until: at(ms[2]),
            acked,
            ack_unknown: false,
        }
    }

    fn rules(
        h: &[QueueDelivery],
        e: &[Effect],
        pushed: &[u64],
        drained: &[u64],
    ) -> Vec<&'static str> {
        let p: HashSet<u64> = pushed.iter().copied().collect();
        let dr: HashSet<u64> = drained.iter().copied().collect();
        check_queue_history(h, e, &p, &dr)
            .iter()
            .map(|v| v.rule)
            .collect()
    }

    fn eff(message: u64, token: u64, before: u64) -> Effect {
        Effect {
            message,
            token,
            before,
        }
    }

    #[test]
    fn a_clean_history_passes() {
        let b = Instant::now();
        // Message 1 lapses at client 0 and is redelivered to client 1.
        let h = [
            d(b, 0, 1, 10, [0, 1, 5], false),
            d(b, 1, 1, 12, [6, 7, 9], true),
            d(b, 1, 2, 11, [0, 2, 4], true),
        ];
        let e = [eff(1, 10, 0), eff(2, 11, 0), eff(1, 12, 10)];
        assert!(rules(&h, &e, &[1, 2, 3], &[3]).is_empty());
    }

    #[test]
    fn each_broken_rule_is_found() {
        let b = Instant::now();
        let dup = [
            d(b, 0, 1, 7, [0, 1, 2], true),
            d(b, 1, 2, 7, [0, 3, 4], true),
        ];
        assert_eq!(rules(&dup, &[], &[], &[]), ["delivery tokens are unique"]);
        let back = [
            d(b, 0, 1, 9, [0, 1, 2], false),
            d(b, 1, 1, 5, [3, 4, 5], true),
        ];
        assert_eq!(
            rules(&back, &[], &[], &[]),
            ["a message's tokens rise over its deliveries"]
        );
        let overlap = [
            d(b, 0, 1, 1, [0, 1, 10], false),
            d(b, 1, 1, 2, [0, 5, 12], true),
        ];
        assert_eq!(
            rules(&overlap, &[], &[], &[]),
            ["one consumer per visibility period"]
        );
        let twice = [
            d(b, 0, 1, 1, [0, 1, 2], true),
            d(b, 1, 1, 2, [3, 4, 5], true),
        ];
        assert_eq!(rules(&twice, &[], &[], &[]), ["no message is acked twice"]);
        let drained_too = [d(b, 0, 1, 1, [0, 1, 2], true)];
        assert_eq!(
            rules(&drained_too, &[], &[1], &[1]),
            ["no message is acked twice"]
        );
        assert_eq!(rules(&[], &[], &[4], &[]), ["no message is lost"]);
        let stale = [eff(1, 12, 0), eff(1, 10, 12)];
        assert_eq!(rules(&[], &stale, &[], &[]), ["no stale effect"]);
    }
}
