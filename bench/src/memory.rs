//! The in-process store. Raw operations: a mutex-guarded hash map insert +
//! remove (cycle), a GCRA update in the same kind of map (check) and a
//! mutex-guarded `VecDeque` per queue with a map of messages in flight
//! (queue: push back, pop front into the map, remove from it). The
//! "round trip" of the handoff rows is a request to another task and its
//! reply over tokio channels; the handoff peer is `tokio::sync::Mutex`.

use std::collections::{HashMap, VecDeque};
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::coord_ops::{self, HOLD, TASKS, WAITERS, fresh};
use crate::measure::{self, Handoff, Stats, Window};
use crate::report::{Peer, Sink};

/// Store name in the output.
const STORE: &str = "memory";

/// Every row of the memory store.
pub async fn run(win: Window, sink: &mut Sink) {
    let url = "memory://bench";
    let coord = coord::connect(url).await.expect("memory");
    for tasks in TASKS {
        let c = coord_ops::cycle(&coord, tasks, win).await;
        let r = raw_cycle(tasks, win).await;
        sink.throughput(STORE, "cycle", tasks, (c, r), None);
    }
    for tasks in TASKS {
        let c = coord_ops::check(&coord, tasks, win).await;
        let r = raw_check(tasks, win).await;
        sink.throughput(STORE, "check", tasks, (c, r), None);
    }
    for (op, tasks, queues) in coord_ops::queue_rows() {
        let c = coord_ops::queue(&coord, tasks, queues, win).await;
        let r = raw_queue(tasks, queues, win).await;
        sink.throughput(STORE, op, tasks, (c, r), None);
    }
    let rtt = rtt(win).await;
    let peer = Peer {
        name: "tokio-mutex",
        stats: tokio_mutex_handoff(win).await,
    };
    let sep = coord_ops::handoff_separate(url, win).await;
    sink.handoff(
        STORE,
        "handoff_separate",
        (sep, rtt.clone()),
        Some(peer.clone()),
    );
    let shared = coord_ops::handoff_shared(&coord, win).await;
    sink.handoff(STORE, "handoff_shared", (shared, rtt), Some(peer));
}

/// Insert + remove of a per-task key in one mutex-guarded map.
async fn raw_cycle(tasks: usize, win: Window) -> Stats {
    let map: Arc<Mutex<HashMap<Arc<str>, u64>>> = Arc::default();
    let ops = (0..tasks)
        .map(|_| {
            let map = map.clone();
            let key: Arc<str> = fresh("raw").into();
            move || {
                let (map, key) = (map.clone(), key.clone());
                async move {
                    let mut m = map.lock().unwrap();
                    assert!(m.insert(key.clone(), 1).is_none());
                    black_box(m.remove(&key));
                }
            }
        })
        .collect();
    measure::throughput(ops, win).await
}

/// A GCRA check (always allowed) of a per-task key in one mutex-guarded
/// map of theoretical arrival times, in ns since the start.
async fn raw_check(tasks: usize, win: Window) -> Stats {
    let map: Arc<Mutex<HashMap<Arc<str>, u64>>> = Arc::default();
    let start = Instant::now();
    let (interval, burst) = (1u64, 60_000_000_000u64);
    let ops = (0..tasks)
        .map(|_| {
            let map = map.clone();
            let key: Arc<str> = fresh("raw").into();
            move || {
                let (map, key) = (map.clone(), key.clone());
                async move {
                    let now = start.elapsed().as_nanos() as u64;
                    let mut m = map.lock().unwrap();
                    let tat = m.entry(key).or_insert(now);
                    let next = (*tat).max(now) + interval;
                    let allowed = next - now <= burst;
                    if allowed {
                        *tat = next;
                    }
                    assert!(black_box(allowed));
                }
            }
        })
        .collect();
    measure::throughput(ops, win).await
}

/// One raw queue: its ready messages and those in flight, by id.
#[derive(Default)]
struct RawQueue {
    /// Ready message ids, oldest first.
    ready: VecDeque<u64>,
    /// Messages in flight.
    flight: HashMap<u64, ()>,
    /// The last id given.
    last: u64,
}

/// Push + pop + ack on mutex-guarded [`RawQueue`]s (the mutex taken for
/// each of the three), task `i` on queue `i % queues`.
async fn raw_queue(tasks: usize, queues: usize, win: Window) -> Stats {
    let all: Vec<Arc<Mutex<RawQueue>>> = (0..queues).map(|_| Arc::default()).collect();
    let ops = (0..tasks)
        .map(|i| {
            let q = all[i % queues].clone();
            move || {
                let q = q.clone();
                async move {
                    {
                        let mut q = q.lock().unwrap();
                        q.last += 1;
                        let id = q.last;
                        q.ready.push_back(id);
                    }
                    let got = {
                        let mut q = q.lock().unwrap();
                        let got = q.ready.pop_front().expect("a pushed message is there");
                        q.flight.insert(got, ());
                        got
                    };
                    let acked = q.lock().unwrap().flight.remove(&got);
                    assert!(black_box(acked).is_some());
                }
            }
        })
        .collect();
    measure::throughput(ops, win).await
}

/// A request to another task and its reply: the in-process round trip.
async fn rtt(win: Window) -> (Stats, Stats) {
    let (tx, mut rx) = mpsc::channel::<oneshot::Sender<()>>(1);
    let server = tokio::spawn(async move {
        while let Some(reply) = rx.recv().await {
            let _ = reply.send(());
        }
    });
    let op = move || {
        let tx = tx.clone();
        async move {
            let (reply, answer) = oneshot::channel();
            tx.send(reply).await.expect("server runs");
            answer.await.expect("server replies");
        }
    };
    let stats = coord_ops::rtt_pair(op, win).await;
    server.await.expect("server task");
    stats
}

/// A handoff waiter on a `tokio::sync::Mutex` (FIFO, no TTL).
struct MutexWaiter(Arc<tokio::sync::Mutex<()>>);

impl Handoff for MutexWaiter {
    type Held = tokio::sync::OwnedMutexGuard<()>;

    async fn acquire(&mut self) -> Option<Self::Held> {
        tokio::time::timeout(Duration::from_secs(1), self.0.clone().lock_owned())
            .await
            .ok()
    }

    async fn release(&mut self, held: Self::Held) {
        drop(held);
    }
}

/// Handoff between tasks of one `tokio::sync::Mutex`.
async fn tokio_mutex_handoff(win: Window) -> Stats {
    let m = Arc::new(tokio::sync::Mutex::new(()));
    let waiters = (0..=WAITERS).map(|_| MutexWaiter(m.clone())).collect();
    measure::handoff(waiters, win, HOLD).await
}
