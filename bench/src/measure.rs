//! How things are measured: by time window, after a warm-up, with every
//! task's latencies kept in a log-linear histogram.
//!
//! - [`throughput`] runs one [`Op`] per task in a loop; the result is the
//!   number of operations completed inside the window over all tasks, per
//!   second, plus their latency quantiles.
//! - [`handoff`] runs contending [`Handoff`] waiters on one lock; the
//!   result is the time from a holder starting its release to the next
//!   holder having the lock.

use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// Phase of a measurement: operations finished in the warm-up are not
/// counted.
const WARM_UP: u8 = 0;
/// Phase of a measurement: operations finished now are counted.
const MEASURE: u8 = 1;
/// Phase of a measurement: tasks stop at their next operation.
const STOP: u8 = 2;

/// How long one measurement runs.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    /// Time first run and thrown away (connections, caches, JIT of scripts).
    pub warm_up: Duration,
    /// Time whose completed operations are counted.
    pub measure: Duration,
}

/// Histogram buckets below which every nanosecond value has its own bucket.
const LINEAR: u64 = 64;
/// Sub-buckets per power of two above [`LINEAR`] (1.6% resolution).
const SUB_BITS: u32 = 6;

/// A log-linear latency histogram in nanoseconds (about 1.6% resolution),
/// so long full-mode runs keep constant memory.
#[derive(Clone, Debug)]
pub struct Histogram {
    /// Counts per bucket; see [`Histogram::bucket`].
    counts: Vec<u64>,
    /// Total number of values recorded.
    total: u64,
}

impl Histogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Histogram {
            counts: vec![0; 60 * LINEAR as usize],
            total: 0,
        }
    }

    /// The bucket of `ns`: values below 64 exactly, larger ones by their
    /// power of two and the next six bits.
    fn bucket(ns: u64) -> usize {
        if ns < LINEAR {
            return ns as usize;
        }
        let exp = 63 - ns.leading_zeros();
        let mantissa = (ns >> (exp - SUB_BITS)) & (LINEAR - 1);
        ((exp - SUB_BITS + 1) as usize) * LINEAR as usize + mantissa as usize
    }

    /// The middle of bucket `b`, in nanoseconds.
    fn value(b: usize) -> u64 {
        if (b as u64) < LINEAR {
            return b as u64;
        }
        let exp = (b as u64 / LINEAR) as u32 + SUB_BITS - 1;
        let mantissa = b as u64 % LINEAR;
        let low = (LINEAR + mantissa) << (exp - SUB_BITS);
        low + (1u64 << (exp - SUB_BITS)) / 2
    }

    /// Record one latency.
    pub fn add(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.counts[Self::bucket(ns)] += 1;
        self.total += 1;
    }

    /// Add every value of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
    }

    /// The `q` quantile (0..=1); zero when empty.
    pub fn quantile(&self, q: f64) -> Duration {
        let rank = ((q * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Duration::from_nanos(Self::value(b));
            }
        }
        Duration::ZERO
    }
}

/// What one measurement found.
#[derive(Clone, Debug)]
pub struct Stats {
    /// Latencies of the operations completed inside the window.
    pub hist: Histogram,
    /// The window's real length.
    pub elapsed: Duration,
}

impl Stats {
    /// Operations completed per second, over all tasks.
    pub fn per_sec(&self) -> f64 {
        self.hist.total as f64 / self.elapsed.as_secs_f64()
    }
    /// Median latency.
    pub fn p50(&self) -> Duration {
        self.hist.quantile(0.50)
    }
    /// 99th percentile latency.
    pub fn p99(&self) -> Duration {
        self.hist.quantile(0.99)
    }
    /// Number of operations counted.
    pub fn count(&self) -> u64 {
        self.hist.total
    }
}

/// One operation run in a loop by one task; each task owns its own (its
/// connection, its lock name). Closures returning a `Send` future are ops.
pub trait Op: Send + 'static {
    /// Run the operation once; panics on a store error (a benchmark that
    /// fails should stop loudly).
    fn call(&mut self) -> impl Future<Output = ()> + Send;
}

impl<F, Fut> Op for F
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    fn call(&mut self) -> impl Future<Output = ()> + Send {
        self()
    }
}

/// Run `op` alone, each call after `idle` with nothing in flight, for
/// `win`: the store's round trip in the conditions a handoff starts from
/// (every contender asleep while the holder holds for [`HOLD`]), when an
/// idle machine is slower to wake than a busy one. Only the call is timed,
/// not the idle time before it.
///
/// [`HOLD`]: crate::coord_ops::HOLD
pub async fn after_idle<O: Op>(mut op: O, win: Window, idle: Duration) -> Stats {
    let warm = Instant::now();
    while warm.elapsed() < win.warm_up {
        tokio::time::sleep(idle).await;
        op.call().await;
    }
    let mut hist = Histogram::new();
    let start = Instant::now();
    while start.elapsed() < win.measure {
        tokio::time::sleep(idle).await;
        let t = Instant::now();
        op.call().await;
        hist.add(t.elapsed());
    }
    Stats {
        hist,
        elapsed: start.elapsed(),
    }
}

/// Run every op of `ops` on its own task, all at once, for `win`; count
/// the operations that finish inside the measured part.
pub async fn throughput<O: Op>(ops: Vec<O>, win: Window) -> Stats {
    let phase = Arc::new(AtomicU8::new(WARM_UP));
    let tasks: Vec<_> = ops
        .into_iter()
        .map(|mut op| {
            let phase = phase.clone();
            tokio::spawn(async move {
                let mut hist = Histogram::new();
                let mut i: u32 = 0;
                loop {
                    let p = phase.load(Relaxed);
                    if p == STOP {
                        break;
                    }
                    let t = Instant::now();
                    op.call().await;
                    if p == MEASURE && phase.load(Relaxed) == MEASURE {
                        hist.add(t.elapsed());
                    }
                    // In-memory ops never wait, so give the timer a chance.
                    i = i.wrapping_add(1);
                    if i % 16 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                hist
            })
        })
        .collect();
    run_phases(&phase, win, tasks).await
}

/// Drive `phase` through warm-up, measurement and stop, then merge what
/// the tasks recorded.
async fn run_phases(
    phase: &AtomicU8,
    win: Window,
    tasks: Vec<tokio::task::JoinHandle<Histogram>>,
) -> Stats {
    tokio::time::sleep(win.warm_up).await;
    phase.store(MEASURE, Relaxed);
    let start = Instant::now();
    tokio::time::sleep(win.measure).await;
    phase.store(STOP, Relaxed);
    let elapsed = start.elapsed();
    let mut hist = Histogram::new();
    for t in tasks {
        hist.merge(&t.await.expect("benchmark task panicked"));
    }
    Stats { hist, elapsed }
}

/// One waiter of a contended lock: its own handle on the store (its own
/// client, or a clone of a shared one).
pub trait Handoff: Send + 'static {
    /// What holding the lock is.
    type Held: Send;
    /// Wait for the lock; `None` if this wait gave up (the harness tries
    /// again).
    fn acquire(&mut self) -> impl Future<Output = Option<Self::Held>> + Send;
    /// Release what [`acquire`](Handoff::acquire) got.
    fn release(&mut self, held: Self::Held) -> impl Future<Output = ()> + Send;
}

/// State every waiter of one handoff measurement shares.
struct Baton {
    /// Measurement phase.
    phase: AtomicU8,
    /// When the last holder started its release, if nobody took it since.
    released_at: Mutex<Option<Instant>>,
    /// How many times the lock was taken; a holder that released waits for
    /// it to move before queueing again, so it never wins its own release.
    taken: watch::Sender<u64>,
}

/// Run the `waiters` against each other on one lock for `win`. Each holder
/// keeps the lock for `hold`, notes the time, releases, and queues again
/// only once somebody else has the lock, so with N + 1 waiters every
/// release has N waiting. A sample is the time from a release being
/// started to the next holder's acquire returning.
pub async fn handoff<H: Handoff>(waiters: Vec<H>, win: Window, hold: Duration) -> Stats {
    let baton = Arc::new(Baton {
        phase: AtomicU8::new(WARM_UP),
        released_at: Mutex::new(None),
        taken: watch::Sender::new(0),
    });
    let tasks: Vec<_> = waiters
        .into_iter()
        .map(|mut w| {
            let baton = baton.clone();
            tokio::spawn(async move {
                let mut hist = Histogram::new();
                while baton.phase.load(Relaxed) != STOP {
                    let Some(held) = w.acquire().await else {
                        continue;
                    };
                    let now = Instant::now();
                    let since = baton.released_at.lock().unwrap().take();
                    match since {
                        Some(t) if baton.phase.load(Relaxed) == MEASURE => hist.add(now - t),
                        _ => {}
                    }
                    baton.taken.send_modify(|n| *n += 1);
                    let mine = *baton.taken.borrow();
                    let mut taken = baton.taken.subscribe();
                    tokio::time::sleep(hold).await;
                    *baton.released_at.lock().unwrap() = Some(Instant::now());
                    w.release(held).await;
                    while baton.phase.load(Relaxed) != STOP {
                        let moved = taken.wait_for(|n| *n != mine);
                        if let Ok(r) = tokio::time::timeout(Duration::from_millis(50), moved).await
                        {
                            r.expect("baton sender lives");
                            break;
                        }
                    }
                }
                hist
            })
        })
        .collect();
    run_phases(&baton.phase, win, tasks).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_keep_values_within_two_percent() {
        for ns in [
            0u64,
            1,
            63,
            64,
            65,
            127,
            128,
            1_000,
            65_432,
            1_234_567_890,
            u64::MAX / 3,
        ] {
            let v = Histogram::value(Histogram::bucket(ns));
            let err = (v as f64 - ns as f64).abs() / (ns.max(1) as f64);
            assert!(err <= 0.02, "{ns} -> {v}");
        }
    }

    #[test]
    fn quantiles_of_a_uniform_spread() {
        let mut h = Histogram::new();
        for us in 1..=1000 {
            h.add(Duration::from_micros(us));
        }
        let p50 = h.quantile(0.5).as_secs_f64() * 1e6;
        let p99 = h.quantile(0.99).as_secs_f64() * 1e6;
        assert!((p50 - 500.0).abs() < 10.0, "{p50}");
        assert!((p99 - 990.0).abs() < 20.0, "{p99}");
        assert_eq!(Histogram::new().quantile(0.5), Duration::ZERO);
    }
}
