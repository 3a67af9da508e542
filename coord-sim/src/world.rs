//! What every simulated client and the simulated store share: the seeded
//! generator, the trace, the fault switch and the store's late-copy marks.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use coord_core::{LeaderInfo, OwnerToken};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

/// How often each fault strikes a request, while faults are on.
#[derive(Debug, Clone, Copy)]
pub struct FaultRates {
    /// A request's reply is awaited this long before the caller gets
    /// [`coord_core::Error::Unavailable`] (a network backend's call
    /// timeout).
    pub call_timeout: Duration,
    /// Chance a request is delayed (up to half the call timeout).
    pub delay: f64,
    /// Chance a request never reaches the store.
    pub lose_request: f64,
    /// Chance the store applies a request but its reply is lost.
    pub lose_reply: f64,
    /// Chance a request reaches the store only after its caller gave up
    /// (a late copy): delayed past the call timeout.
    pub late: f64,
    /// Chance a request freezes its client (every call of it stalls)
    /// for a while, long enough to outlive TTLs.
    pub pause: f64,
    /// Chance a request cuts its client off for a while (0.5–4 s): every
    /// request it sends meanwhile is lost on the way, as behind a dead
    /// link (its local timers keep running).
    pub cut: f64,
    /// Chance a leader read is served by a lagging replica: it shows the
    /// state before the newest change the store has shown for that name.
    pub stale_read: f64,
    /// At most this many store restarts per run, at random moments while
    /// faults are on: the store is down for 0.2–2.5 s, every request on
    /// the wire dies with its connection (unapplied, or applied with its
    /// reply lost) and requests reaching it while down are lost. A
    /// durable store's restart: what it committed survives (the in-memory
    /// state is kept), as on PostgreSQL and etcd.
    pub restarts: u64,
    /// Whether the store keeps the marks releases and extends leave
    /// against late copies of attempts (`coord_core::late`). `false`
    /// plants a defect, to show the checkers catch what it lets through.
    pub marks_kept: bool,
}

impl Default for FaultRates {
    fn default() -> Self {
        FaultRates {
            call_timeout: Duration::from_millis(300),
            delay: 0.10,
            lose_request: 0.03,
            lose_reply: 0.05,
            late: 0.04,
            pause: 0.005,
            cut: 0.003,
            stale_read: 0.1,
            restarts: 2,
            marks_kept: true,
        }
    }
}

/// What the store has shown of an election: the state before the newest
/// change, and the newest.
type Shown = (Option<LeaderInfo>, Option<LeaderInfo>);

/// The shared state of one simulation run (one seed).
pub struct World {
    rng: Mutex<StdRng>,
    trace: Mutex<Vec<String>>,
    faults: AtomicBool,
    /// The fault rates in force while faults are on.
    pub rates: FaultRates,
    start: Instant,
    /// The store's marks against late copies: the stamp of the last
    /// marking release or extend of an owner on a name.
    marks: Mutex<HashMap<(String, OwnerToken), u64>>,
    /// Whether to keep every trace line (else only the digest is kept).
    keep: bool,
    digest: AtomicU64,
    events: AtomicUsize,
    /// Store restarts so far: a request sent in one and reaching the store
    /// (or replied to) in another died with its connection.
    restarts: AtomicU64,
    down_until: Mutex<Option<Instant>>,
    /// Per election: the leader state shown before the newest one, and
    /// the newest (what a lagging replica may still show).
    leaders: Mutex<HashMap<String, Shown>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl World {
    /// A world for `seed`, with faults on. `keep`: keep the trace's lines
    /// (for printing), not only their digest.
    pub fn new(seed: u64, rates: FaultRates, keep: bool) -> Self {
        World {
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            trace: Mutex::new(Vec::new()),
            faults: AtomicBool::new(true),
            rates,
            start: Instant::now(),
            marks: Mutex::new(HashMap::new()),
            keep,
            digest: AtomicU64::new(0xcbf2_9ce4_8422_2325),
            events: AtomicUsize::new(0),
            restarts: AtomicU64::new(0),
            down_until: Mutex::new(None),
            leaders: Mutex::new(HashMap::new()),
        }
    }

    /// Simulated time since the run began.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// The run's start, on tokio's (paused) clock.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// Record one event, stamped with the simulated time.
    pub fn log(&self, line: impl AsRef<str>) {
        let t = self.elapsed();
        let mut s = String::new();
        let _ = write!(
            s,
            "{:>6}.{:03} {}",
            t.as_millis(),
            t.subsec_micros() % 1000,
            line.as_ref()
        );
        // FNV-1a over every line, newline-separated.
        let mut h = self.digest.load(Ordering::Relaxed);
        for b in s.bytes().chain(std::iter::once(b'\n')) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.digest.store(h, Ordering::Relaxed);
        self.events.fetch_add(1, Ordering::Relaxed);
        if self.keep {
            lock(&self.trace).push(s);
        }
    }

    /// The digest of every line logged so far.
    pub fn digest(&self) -> u64 {
        self.digest.load(Ordering::Relaxed)
    }

    /// How many lines were logged.
    pub fn events(&self) -> usize {
        self.events.load(Ordering::Relaxed)
    }

    /// The lines logged so far (empty unless the world keeps them).
    pub fn lines(&self) -> Vec<String> {
        lock(&self.trace).clone()
    }

    /// Whether faults are on.
    pub fn faults_on(&self) -> bool {
        self.faults.load(Ordering::Relaxed)
    }

    /// Stop injecting faults (requests already on their way keep theirs).
    pub fn heal(&self) {
        self.faults.store(false, Ordering::Relaxed);
        self.log("faults off");
    }

    /// Restart the store: down for `len`, every connection reset.
    pub fn restart(&self, len: Duration) {
        self.restarts.fetch_add(1, Ordering::Relaxed);
        *lock(&self.down_until) = Some(Instant::now() + len);
        self.log(format!("store restart, down {}ms", len.as_millis()));
    }

    /// How many times the store restarted so far.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Whether the store is down (restarting) now.
    pub fn down(&self) -> bool {
        lock(&self.down_until).is_some_and(|t| Instant::now() < t)
    }

    /// Store side: `now` is the leader of `name`; the answer to give,
    /// which may be the state before it when faults are on (a read served
    /// by a lagging replica).
    pub fn leader_read(&self, name: &str, now: Option<LeaderInfo>) -> Option<LeaderInfo> {
        let stale = self.faults_on() && self.chance(self.rates.stale_read);
        let mut leaders = lock(&self.leaders);
        let (before, newest) = leaders.entry(name.to_string()).or_insert((None, None));
        if *newest != now {
            *before = std::mem::replace(newest, now.clone());
        }
        if stale {
            self.log(format!("stale read of {name}"));
            before.clone()
        } else {
            now
        }
    }

    /// True with probability `p`.
    pub fn chance(&self, p: f64) -> bool {
        lock(&self.rng).random_bool(p.clamp(0.0, 1.0))
    }

    /// A uniform integer in `lo..=hi`.
    pub fn range(&self, lo: u64, hi: u64) -> u64 {
        lock(&self.rng).random_range(lo..=hi)
    }

    /// A uniform duration in `lo..=hi`, whole milliseconds.
    pub fn millis(&self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo, hi))
    }

    /// One of `items`, uniformly.
    pub fn pick<T: Copy>(&self, items: &[T]) -> T {
        items[self.range(0, items.len() as u64 - 1) as usize]
    }

    /// Store side: whether an attempt of `owner` on `name` stamped `stamp`
    /// is a late copy to refuse (a marking release or extend of that owner
    /// was sent after it).
    pub fn refused(&self, name: &str, owner: &OwnerToken, stamp: u64) -> bool {
        lock(&self.marks)
            .get(&(name.to_string(), *owner))
            .is_some_and(|m| stamp < *m)
    }

    /// Store side: leave a mark of `owner` on `name` at `stamp`.
    pub fn mark(&self, name: &str, owner: &OwnerToken, stamp: u64) {
        if !self.rates.marks_kept {
            return;
        }
        let mut marks = lock(&self.marks);
        let m = marks.entry((name.to_string(), *owner)).or_insert(0);
        *m = (*m).max(stamp);
    }
}

/// A short, deterministic label for an owner token in the trace.
pub fn short(owner: &OwnerToken) -> String {
    owner.to_hex()[26..].to_string()
}
