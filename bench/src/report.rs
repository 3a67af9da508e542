//! Rows of results: one human-readable line each as they are measured, and
//! one `BENCH` line each at the end for machines.
//!
//! Throughput rows (`cycle`, `check`, `queue`, `queue_many`): `coord` and
//! `raw` (and the peer) are operations per second over all tasks; `ratio`
//! = coord / raw and `peer_ratio` = coord / peer, so above 1 means coord
//! is faster. `floor` (Redis cycle rows) is the least work coord's
//! fencing guarantee needs, in operations per second, and `floor_ratio`
//! = coord / floor.
//!
//! Handoff rows (`handoff_separate`, `handoff_shared`): `coord` is the
//! p50 handoff latency and `raw` the store's round-trip time (p50 of one
//! trivial request); `ratio` = raw / coord (the handoff rate relative to
//! the round-trip rate, below 1), `rtt_ratio` = coord / rtt (the handoff
//! in round trips) and `peer_ratio` = peer p50 / coord p50 (coord's
//! handoff rate over the peer's: above 1 means coord hands over faster).
//! `idle_rtt` is the same trivial request made after the holder's hold
//! time with nothing in flight, as every handoff starts (on a VM an idle
//! machine is slower to wake), and `idle_rtt_ratio` = coord / idle_rtt.

use std::fmt::Write as _;
use std::time::Duration;

use crate::measure::Stats;

/// A peer library's result on the same row.
#[derive(Clone, Debug)]
pub struct Peer {
    /// The peer's name (`rslock`, `etcd-lock`, `pg-advisory`, ...).
    pub name: &'static str,
    /// What it measured.
    pub stats: Stats,
}

/// What a row compares.
#[derive(Clone, Debug)]
pub enum Kind {
    /// Operations per second: coord against the raw store operation.
    Throughput {
        /// coord's numbers.
        coord: Stats,
        /// The raw operation's numbers.
        raw: Stats,
    },
    /// Lock handoff latency against the store's round-trip time.
    Handoff {
        /// coord's handoff latencies.
        coord: Stats,
        /// Round-trip time of a trivial request, back to back.
        rtt: Stats,
        /// The same request, each after [`HOLD`](crate::coord_ops::HOLD)
        /// with nothing in flight ([`after_idle`](crate::measure::after_idle)),
        /// as a handoff starts.
        idle_rtt: Stats,
    },
}

/// One result row.
#[derive(Clone, Debug)]
pub struct Row {
    /// Store name.
    pub store: &'static str,
    /// Operation: `cycle`, `check`, `handoff_separate`, `handoff_shared`.
    pub op: &'static str,
    /// Concurrent tasks (for handoff: waiters at each release).
    pub tasks: usize,
    /// The measurements.
    pub kind: Kind,
    /// A peer library measured on the same row, if there is one.
    pub peer: Option<Peer>,
    /// The least work coord's guarantee needs, measured on the same row
    /// (throughput rows of a store that has one: the Redis cycle).
    pub floor: Option<Stats>,
}

/// Microseconds of `d`, for printing.
fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

impl Row {
    /// The machine-readable line.
    pub fn bench_line(&self) -> String {
        let mut s = format!(
            "BENCH store={} op={} tasks={}",
            self.store, self.op, self.tasks
        );
        match &self.kind {
            Kind::Throughput { coord, raw } => {
                let _ = write!(
                    s,
                    " coord={:.0}ops/s raw={:.0}ops/s ratio={:.3}",
                    coord.per_sec(),
                    raw.per_sec(),
                    coord.per_sec() / raw.per_sec()
                );
                if let Some(p) = &self.peer {
                    let _ = write!(
                        s,
                        " peer={} peer_ratio={:.3} peer_value={:.0}ops/s peer_p50={:.1}us",
                        p.name,
                        coord.per_sec() / p.stats.per_sec(),
                        p.stats.per_sec(),
                        us(p.stats.p50())
                    );
                }
                if let Some(f) = &self.floor {
                    let _ = write!(
                        s,
                        " floor={:.0}ops/s floor_ratio={:.3}",
                        f.per_sec(),
                        coord.per_sec() / f.per_sec()
                    );
                }
                let _ = write!(
                    s,
                    " p50={:.1}us raw_p50={:.1}us",
                    us(coord.p50()),
                    us(raw.p50())
                );
            }
            Kind::Handoff {
                coord,
                rtt,
                idle_rtt,
            } => {
                let (p50, rtt50) = (us(coord.p50()), us(rtt.p50()));
                let idle50 = us(idle_rtt.p50());
                let _ = write!(
                    s,
                    " coord={p50:.1}us raw={rtt50:.1}us ratio={:.3}",
                    rtt50 / p50
                );
                if let Some(p) = &self.peer {
                    let _ = write!(
                        s,
                        " peer={} peer_ratio={:.3} peer_value={:.1}us peer_p99={:.1}us",
                        p.name,
                        us(p.stats.p50()) / p50,
                        us(p.stats.p50()),
                        us(p.stats.p99())
                    );
                }
                let _ = write!(
                    s,
                    " p99={:.1}us rtt={rtt50:.1}us rtt_ratio={:.2} idle_rtt={idle50:.1}us \
                     idle_rtt_ratio={:.2} handoffs={}",
                    us(coord.p99()),
                    p50 / rtt50,
                    p50 / idle50,
                    coord.count()
                );
            }
        }
        s
    }

    /// The human-readable line (see [`header`]).
    pub fn human_line(&self) -> String {
        let head = format!("{:<9} {:<17} {:>5}", self.store, self.op, self.tasks);
        match &self.kind {
            Kind::Throughput { coord, raw } => {
                let peer = self.peer.as_ref().map_or(String::new(), |p| {
                    format!(
                        "{:<11} {:>10.0}/s {:>6.2}x",
                        p.name,
                        p.stats.per_sec(),
                        coord.per_sec() / p.stats.per_sec()
                    )
                });
                let floor = self.floor.as_ref().map_or(String::new(), |f| {
                    format!(
                        "  floor {:.0}/s {:.2}x",
                        f.per_sec(),
                        coord.per_sec() / f.per_sec()
                    )
                });
                format!(
                    "{head} {:>10.0}/s {:>8.1}us {:>10.0}/s {:>8.1}us {:>6.2}x  {peer}{floor}",
                    coord.per_sec(),
                    us(coord.p50()),
                    raw.per_sec(),
                    us(raw.p50()),
                    coord.per_sec() / raw.per_sec(),
                )
            }
            Kind::Handoff {
                coord,
                rtt,
                idle_rtt,
            } => {
                let peer = self.peer.as_ref().map_or(String::new(), |p| {
                    format!(
                        "{:<11} {:>10.1}us {:>6.2}x",
                        p.name,
                        us(p.stats.p50()),
                        us(p.stats.p50()) / us(coord.p50())
                    )
                });
                format!(
                    "{head} {:>10.1}us {:>8.1}us {:>10.1}us {:>8.1}us {:>6.1}R  {peer}  ({:.1}R of the idle RTT)",
                    us(coord.p50()),
                    us(coord.p99()),
                    us(rtt.p50()),
                    us(idle_rtt.p50()),
                    us(coord.p50()) / us(rtt.p50()),
                    us(coord.p50()) / us(idle_rtt.p50()),
                )
            }
        }
    }
}

/// The human table's header and a legend.
pub fn header() -> String {
    format!(
        "{:<9} {:<17} {:>5} {:>12} {:>10} {:>12} {:>10} {:>7}  {:<11} {:>12} {:>7}\n\
         (cycle/check/queue: coord ops/s and p50, raw ops/s and p50, coord/raw; peer ops/s, coord/peer; \
         floor ops/s, coord/floor)\n\
         (handoff: coord p50 and p99, store RTT back to back and after the hold time idle, p50 in RTTs (R); peer p50, peer/coord)",
        "store",
        "op",
        "tasks",
        "coord",
        "p50|p99",
        "raw|rtt",
        "p50",
        "ratio",
        "peer",
        "peer",
        "ratio"
    )
}

/// Where rows go: each is printed for humans as it arrives, and kept for
/// the `BENCH` lines at the end.
#[derive(Default)]
pub struct Sink {
    /// Every row so far.
    pub rows: Vec<Row>,
}

impl Sink {
    /// Print `row` for humans and keep it.
    pub fn push(&mut self, row: Row) {
        println!("{}", row.human_line());
        self.rows.push(row);
    }

    /// A throughput row (`cycle`, `check`, `queue`, `queue_many`).
    pub fn throughput(
        &mut self,
        store: &'static str,
        op: &'static str,
        tasks: usize,
        measured: (Stats, Stats),
        peer: Option<Peer>,
    ) {
        self.throughput_row(store, op, tasks, measured, peer, None);
    }

    /// A throughput row with the least work coord's guarantee needs
    /// measured beside it.
    pub fn throughput_with_floor(
        &mut self,
        store: &'static str,
        op: &'static str,
        tasks: usize,
        (coord, raw, floor): (Stats, Stats, Stats),
        peer: Option<Peer>,
    ) {
        self.throughput_row(store, op, tasks, (coord, raw), peer, Some(floor));
    }

    fn throughput_row(
        &mut self,
        store: &'static str,
        op: &'static str,
        tasks: usize,
        (coord, raw): (Stats, Stats),
        peer: Option<Peer>,
        floor: Option<Stats>,
    ) {
        self.push(Row {
            store,
            op,
            tasks,
            kind: Kind::Throughput { coord, raw },
            peer,
            floor,
        });
    }

    /// A handoff row: coord's latencies beside the store's round trip
    /// (back to back, and after the hold time idle).
    pub fn handoff(
        &mut self,
        store: &'static str,
        op: &'static str,
        (coord, (rtt, idle_rtt)): (Stats, (Stats, Stats)),
        peer: Option<Peer>,
    ) {
        self.push(Row {
            store,
            op,
            tasks: crate::coord_ops::WAITERS,
            kind: Kind::Handoff {
                coord,
                rtt,
                idle_rtt,
            },
            peer,
            floor: None,
        });
    }
}
