//! The "Distributed Queue: fair task distribution" scenario: producers push
//! tasks for several tenants, workers share them, a worker killed mid-task
//! has its task finished by another, and a stale worker's late write is
//! rejected by its fencing token.
//!
//! 1. Three producers push at once, one per tenant: `bulk` 30 tasks,
//!    `alice` and `bob` 3 each. Deliveries are shared round-robin across
//!    tenants with ready tasks, so alice's and bob's tasks do not wait
//!    behind bulk's backlog.
//! 2. A worker takes a task and is killed (no ack, no nack): after the
//!    visibility timeout the task is delivered again (attempt 2) and
//!    finished by another worker.
//! 3. A worker takes a task, pauses past its visibility (a GC pause, a
//!    network stall); the task goes to another worker, which finishes it.
//!    When the paused worker wakes up, its write is rejected (stale token)
//!    and its ack is refused.
//! 4. One worker takes the next 12 tasks one at a time: alice's and bob's
//!    are all among them. Three workers drain the rest; every task is
//!    done exactly once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord::{Error, FencedRegister, FencingToken, MessageId, PopOptions, PushOptions, QueueConfig};
use coord_examples::{connect, fresh};

/// The results store: one fenced row per task, keeping the highest token
/// it has seen (the PHP original's `WHERE fencing_token < ?`).
#[derive(Default)]
struct Results {
    rows: Mutex<HashMap<MessageId, Arc<FencedRegister<String>>>>,
}

impl Results {
    fn row(&self, id: MessageId) -> Arc<FencedRegister<String>> {
        self.rows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id)
            .or_insert_with(|| Arc::new(FencedRegister::new(String::new())))
            .clone()
    }
}

/// How many deliveries one worker takes alone, one after another, before
/// three drain the rest: alice's and bob's tasks must all be among them.
const TAKEN_ALONE: usize = 12;

/// Each acked task: which worker finished it, at which attempt, with
/// which token.
type Finished = HashMap<MessageId, (usize, u32, FencingToken)>;

/// What the draining workers share.
#[derive(Clone)]
struct Shared {
    queues: coord::Queues,
    queue: String,
    results: Arc<Results>,
    /// The tenant of each delivery, in the order taken.
    order: Arc<Mutex<Vec<String>>>,
    finished: Arc<Mutex<Finished>>,
}

impl Shared {
    /// The next task, waiting up to 500 ms for one.
    async fn pop(&self) -> coord::Result<Option<coord::Delivery>> {
        let opts = PopOptions::new(Duration::from_secs(30)).wait(Duration::from_millis(500));
        self.queues.pop_with(&self.queue, opts).await
    }

    /// Worker `w` does `task`: writes its result with the delivery's
    /// token, then acks it.
    async fn finish(&self, w: usize, task: coord::Delivery) -> coord::Result<()> {
        let body = String::from_utf8_lossy(task.payload()).to_string();
        self.order
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(task.group().unwrap_or("").to_string());
        if task.attempts() > 1 {
            println!(
                "worker {w}: took {body} again (attempt {}, token {})",
                task.attempts(),
                task.fencing_token()
            );
        }
        let accepted = self
            .results
            .row(task.id())
            .write(task.fencing_token(), format!("done by worker {w}"));
        assert!(accepted, "a live delivery's write was rejected");
        let (id, attempts, token) = (task.id(), task.attempts(), task.fencing_token());
        task.ack().await?;
        let before = self
            .finished
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, (w, attempts, token));
        assert!(before.is_none(), "task {id} was finished twice");
        Ok(())
    }
}

#[tokio::main]
async fn main() -> coord::Result<()> {
    let coord = connect().await?;
    let queues = coord
        .queues()?
        .with_config(QueueConfig::default().max_deliveries(5));
    let queue = fresh("tasks");
    let visibility =
        coord::validate::ttl("visibility", Duration::from_secs(1), coord.capabilities())?;

    // 1. Three producers at once, one per tenant.
    let mut producers: Vec<tokio::task::JoinHandle<coord::Result<usize>>> = Vec::new();
    for (tenant, tasks) in [("bulk", 30), ("alice", 3), ("bob", 3)] {
        let (queues, queue) = (queues.clone(), queue.clone());
        producers.push(tokio::spawn(async move {
            let opts = PushOptions::new().group(tenant);
            for i in 0..tasks {
                queues
                    .push_with(&queue, format!("{tenant}-{i}"), &opts)
                    .await?;
            }
            coord::Result::Ok(tasks)
        }));
    }
    let mut pushed = 0usize;
    for p in producers {
        pushed += p.await.map_err(|e| Error::Config(e.to_string()))??;
    }
    assert_eq!(pushed, 36);
    println!("producers: 3 at once pushed 30 tasks for bulk, 3 each for alice and bob");

    let results = Arc::new(Results::default());

    // 2. A worker killed mid-task.
    let killed = queues
        .pop(&queue, visibility, Duration::ZERO)
        .await?
        .ok_or_else(|| Error::Config("the queue was empty".into()))?;
    let (killed_id, killed_token) = (killed.id(), killed.fencing_token());
    println!(
        "worker K: took {} (attempt {}) and is killed before finishing",
        String::from_utf8_lossy(killed.payload()),
        killed.attempts()
    );
    std::mem::forget(killed); // the process died: nothing is sent

    // 3. A worker that pauses past its visibility.
    let paused = queues
        .pop(&queue, visibility, Duration::ZERO)
        .await?
        .ok_or_else(|| Error::Config("the queue was empty".into()))?;
    println!(
        "worker P: took {} with token {}, then pauses...",
        String::from_utf8_lossy(paused.payload()),
        paused.fencing_token()
    );
    tokio::time::sleep(visibility + Duration::from_millis(300)).await;

    // 4. The killed and the paused workers' tasks come back with attempt 2.
    // Worker 1 takes the first TAKEN_ALONE deliveries alone, one after another:
    // every tenant with tasks left is ready at each pop, so the turns are
    // exactly the queue's rule (round-robin across ready tenants), whatever
    // the machine's speed. Then three workers drain the rest.
    let order = Arc::new(Mutex::new(Vec::<String>::new()));
    let finished = Arc::new(Mutex::new(Finished::new()));
    let shared = Shared {
        queues: queues.clone(),
        queue: queue.clone(),
        results: results.clone(),
        order: order.clone(),
        finished: finished.clone(),
    };
    let mut total = 0usize;
    for _ in 0..TAKEN_ALONE {
        let Some(task) = shared.pop().await? else {
            break;
        };
        shared.finish(1, task).await?;
        total += 1;
    }
    let mut workers: Vec<tokio::task::JoinHandle<coord::Result<usize>>> = Vec::new();
    for w in 1..=3 {
        let shared = shared.clone();
        workers.push(tokio::spawn(async move {
            let mut done = 0usize;
            while let Some(task) = shared.pop().await? {
                shared.finish(w, task).await?;
                done += 1;
            }
            coord::Result::Ok(done)
        }));
    }
    for w in workers {
        total += w.await.map_err(|e| Error::Config(e.to_string()))??;
    }
    println!("workers 1-3: finished {total} tasks");

    let order = order.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let small_by = order
        .iter()
        .enumerate()
        .filter(|(_, g)| *g != "bulk")
        .map(|(i, _)| i + 1)
        .max()
        .unwrap_or(0);
    println!(
        "fairness: alice's and bob's tasks were all done by delivery {small_by} of {} \
         (taken one at a time: {TAKEN_ALONE} at most)",
        order.len()
    );
    assert!(
        small_by <= TAKEN_ALONE,
        "small tenants waited behind the backlog (done by {small_by})"
    );

    // The paused worker wakes up: its write and its ack are refused.
    let row = results.row(paused.id());
    let accepted = row.write(paused.fencing_token(), "done by worker P".to_string());
    println!(
        "worker P: wakes up and writes with token {}: {}",
        paused.fencing_token(),
        if accepted {
            "ACCEPTED (bug)"
        } else {
            "rejected as stale"
        }
    );
    assert!(!accepted);
    match paused.ack().await {
        Err(Error::NotHeld { .. }) => println!("worker P: its ack is refused (not held)"),
        other => panic!("a stale ack must be NotHeld, got {other:?}"),
    }
    let finished = finished.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let Some(&(by, attempts, token)) = finished.get(&killed_id) else {
        panic!("the killed worker's task {killed_id} was never finished");
    };
    println!(
        "task {killed_id} of the killed worker: redelivered (attempt {attempts}, token {token}) \
         and {}",
        results.row(killed_id).read().0
    );
    assert_eq!(
        attempts, 2,
        "the killed worker's task must come back as attempt 2"
    );
    assert!(
        token > killed_token,
        "its redelivery's token {token} is not above the killed worker's {killed_token}"
    );
    assert_eq!(
        results.row(killed_id).read().0,
        format!("done by worker {by}"),
        "the killed worker's task was not finished by the worker that acked it"
    );
    assert_eq!(finished.len(), 36, "every task is acked exactly once");

    let stats = queues.stats(&queue).await?;
    assert_eq!(total, 36);
    assert_eq!((stats.ready, stats.in_flight, stats.dead), (0, 0, 0));
    println!("every task was done exactly once; the queue is empty");
    Ok(())
}
