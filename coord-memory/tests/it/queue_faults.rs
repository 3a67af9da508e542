//! The fault suite's work queue workload on the in-memory store: under
//! contention with a visibility shorter than the work for some deliveries
//! (so they lapse and go to others), and against two broken queues the
//! checker must catch.

use std::sync::Arc;
use std::time::Duration;

use conformance::faults::{FaultLog, QueueWorkload, run_queue_workload, schedule};
use coord_core::wake::Waiter;
use coord_core::{
    Capabilities, Coord, FencingToken, Lane, Message, MessageId, NewMessage, OwnerToken,
    PopAttempt, Pushed, Queue, QueueConfig, QueueStats, Result, async_trait,
};
use coord_memory::MemoryBackend;

fn workload(watchdog: bool) -> QueueWorkload {
    QueueWorkload {
        visibility: Duration::from_millis(60),
        wait: Duration::from_millis(200),
        work: Duration::from_millis(40),
        watchdog,
        nack_every: 5,
        push_every: Duration::from_millis(2),
        duration: schedule(Duration::from_secs(3)),
        drain: Duration::from_secs(2),
    }
}

fn clients(backend: Arc<dyn Queue>, n: usize) -> Vec<Coord> {
    let base = Arc::new(MemoryBackend::new());
    (0..n)
        .map(|_| Coord::from_backend(base.clone()).with_queues(backend.clone()))
        .collect()
}

/// 8 consumers, 60 ms visibility, 40 ms of work plus scheduling: without
/// the watchdog some deliveries lapse and are redelivered, with it none
/// should; either way nothing is lost, nothing acked twice, no two valid
/// deliveries of one message, tokens unique and rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_workload_with_and_without_the_watchdog() {
    for (watchdog, scenario) in [(false, "queue-lapsing"), (true, "queue-watchdog")] {
        let backend: Arc<dyn Queue> = Arc::new(MemoryBackend::new());
        let (report, log) =
            run_queue_workload(clients(backend, 8), scenario, workload(watchdog), async {
                FaultLog::default()
            })
            .await;
        report.assert_ok(scenario, "memory", log.injected, Duration::from_secs(2));
        let pushed = report.extra.iter().find(|(k, _)| *k == "pushed").unwrap().1;
        assert!(pushed > 100, "only {pushed} messages pushed");
    }
}

/// How a broken queue misbehaves.
#[derive(Clone, Copy)]
enum Fault {
    /// Every delivery carries token 1.
    SameToken,
    /// A delivered message stays visible to others.
    StaysVisible,
}

struct Broken(Arc<MemoryBackend>, Fault);

#[async_trait]
impl Queue for Broken {
    fn capabilities(&self) -> &Capabilities {
        Queue::capabilities(&*self.0)
    }
    async fn push(&self, queue: &str, m: &NewMessage<'_>) -> Result<Pushed> {
        self.0.push(queue, m).await
    }
    async fn try_pop(
        &self,
        queue: &str,
        lane: Lane,
        consumer: &OwnerToken,
        visibility: Duration,
        config: &QueueConfig,
    ) -> Result<PopAttempt> {
        let r = self
            .0
            .try_pop(queue, lane, consumer, visibility, config)
            .await?;
        match (self.1, r) {
            (Fault::SameToken, PopAttempt::Delivered { message, .. }) => {
                Ok(PopAttempt::Delivered {
                    message,
                    token: FencingToken(1),
                })
            }
            (Fault::StaysVisible, PopAttempt::Delivered { message, token }) => {
                // Hand it out, and give it back at once behind the holder.
                self.0
                    .nack(queue, lane, message.id, consumer, Duration::ZERO)
                    .await?;
                Ok(PopAttempt::Delivered { message, token })
            }
            (_, other) => Ok(other),
        }
    }
    async fn ack(&self, q: &str, l: Lane, id: MessageId, c: &OwnerToken) -> Result<bool> {
        match self.1 {
            // The holder's ack is what a store that lost track would do:
            // accept it (else nothing would ever be acked).
            Fault::StaysVisible => Ok(true),
            Fault::SameToken => self.0.ack(q, l, id, c).await,
        }
    }
    async fn nack(
        &self,
        q: &str,
        l: Lane,
        id: MessageId,
        c: &OwnerToken,
        d: Duration,
    ) -> Result<bool> {
        self.0.nack(q, l, id, c, d).await
    }
    async fn extend(
        &self,
        q: &str,
        l: Lane,
        id: MessageId,
        c: &OwnerToken,
        v: Duration,
    ) -> Result<bool> {
        match self.1 {
            Fault::StaysVisible => Ok(true),
            Fault::SameToken => self.0.extend(q, l, id, c, v).await,
        }
    }
    async fn peek(&self, q: &str, l: Lane, limit: usize) -> Result<Vec<Message>> {
        self.0.peek(q, l, limit).await
    }
    async fn redrive(&self, q: &str, limit: usize) -> Result<u64> {
        self.0.redrive(q, limit).await
    }
    async fn stats(&self, q: &str) -> Result<QueueStats> {
        self.0.stats(q).await
    }
    async fn purge(&self, q: &str) -> Result<u64> {
        self.0.purge(q).await
    }
    async fn subscribe(&self, q: &str, l: Lane) -> Result<Waiter> {
        self.0.subscribe(q, l).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_queue_checker_catches_broken_queues() {
    for (fault, rule) in [
        (Fault::SameToken, "delivery tokens are unique"),
        (Fault::StaysVisible, "one consumer per visibility period"),
    ] {
        let broken: Arc<dyn Queue> = Arc::new(Broken(Arc::new(MemoryBackend::new()), fault));
        let mut w = workload(true);
        w.visibility = Duration::from_secs(1);
        w.duration = Duration::from_secs(2);
        let (report, _) = run_queue_workload(clients(broken, 8), "broken", w, async {
            FaultLog::default()
        })
        .await;
        assert!(
            report.violations.iter().any(|v| v.rule == rule),
            "the checker missed `{rule}`: {:?}",
            report.violations.iter().take(3).collect::<Vec<_>>()
        );
    }
}
