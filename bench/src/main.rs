//! coord-bench v2: coord's speed next to the raw store operation each
//! primitive is built on, and next to a peer library, all measured in the
//! same run, with the same concurrency, against real servers the
//! conformance test kit starts on loopback ports.
//!
//! ```sh
//! cargo run --release -p coord-bench                     # every store, full
//! cargo run --release -p coord-bench -- --quick          # CI smoke (< 2 min)
//! cargo run --release -p coord-bench -- redis etcd       # some stores
//! cargo run -p coord-bench -- --smoke                    # every row once, numbers meaningless
//! cargo run --release -p coord-bench -- --table run1.txt run2.txt run3.txt
//! ```
//!
//! `--table` prints the speed table of docs/benchmarks.md from saved full runs (min–max
//! over them; see `table`).
//!
//! Rows, for each store (memory, redis, postgres, etcd):
//! - `cycle`: uncontended `try_acquire` + `release`, each task on its own
//!   lock name, 1 and 32 tasks on one client; throughput over all tasks.
//! - `check`: limiter checks (GCRA, a quota so large every check is
//!   allowed), each task on its own key, 1 and 32 tasks.
//! - `queue`: work queue cycles (push + pop + ack), 1 and 16 tasks on one
//!   queue, on one client; `queue_many`: 16 tasks on 16 queues.
//! - `handoff_separate` / `handoff_shared`: 9 tasks contend for one lock
//!   (8 waiting at each release), each on its own client or all on one;
//!   the time from a release starting to the next holder's acquire
//!   returning, beside the store's round-trip time.
//!
//! Each module says what its raw operations and peers are; `report` says
//! what every field of the output means. Time windows, not fixed counts:
//! `--quick` warms up 0.2 s and measures 0.8 s per measurement, the full
//! mode 1 s and 5 s. `--smoke` 50 ms and 200 ms: it only shows that every
//! row runs and its checks hold; its numbers mean nothing. The test
//! `every_row_runs_on_every_store` runs the same in the workspace's test
//! build (so `cargo test` and CI run it). The runtime has two worker
//! threads.

mod coord_ops;
mod etcd;
mod measure;
mod memory;
mod postgres;
mod redis;
mod report;
mod table;

use std::time::Duration;

use measure::Window;
use report::Sink;

/// The stores, in the order they run.
const STORES: [&str; 4] = ["memory", "redis", "postgres", "etcd"];

/// The smoke window: every row runs once, its numbers mean nothing.
const SMOKE: Window = Window {
    warm_up: Duration::from_millis(50),
    measure: Duration::from_millis(200),
};

/// Parse the arguments, run the chosen stores, print the table and the
/// `BENCH` lines.
fn main() {
    let mut quick = false;
    let mut smoke = false;
    let mut only = Vec::new();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "--table") {
        let runs: Vec<String> = args[1..]
            .iter()
            .map(|f| {
                std::fs::read_to_string(f).unwrap_or_else(|e| {
                    eprintln!("coord-bench --table: cannot read {f}: {e}");
                    std::process::exit(2);
                })
            })
            .collect();
        if runs.is_empty() {
            eprintln!("usage: coord-bench --table RUN_OUTPUT...");
            std::process::exit(2);
        }
        print!("{}", table::table(&runs));
        return;
    }
    for arg in args {
        match arg.as_str() {
            "--quick" => quick = true,
            "--smoke" => smoke = true,
            s if STORES.contains(&s) => only.push(s.to_string()),
            other => {
                eprintln!(
                    "unknown argument `{other}`; usage: coord-bench [--quick|--smoke] [{}]... \
                     | --table RUN_OUTPUT...",
                    STORES.join("|")
                );
                std::process::exit(2);
            }
        }
    }
    let win = if smoke {
        SMOKE
    } else if quick {
        Window {
            warm_up: Duration::from_millis(200),
            measure: Duration::from_millis(800),
        }
    } else {
        Window {
            warm_up: Duration::from_secs(1),
            measure: Duration::from_secs(5),
        }
    };
    let sink = runtime().block_on(run(&only, win));
    println!();
    for row in &sink.rows {
        println!("{}", row.bench_line());
    }
}

/// Run every store in `only` (all if empty) for `win` per measurement.
async fn run(only: &[String], win: Window) -> Sink {
    let mut sink = Sink::default();
    println!("{}", report::header());
    for store in STORES {
        if !only.is_empty() && !only.iter().any(|o| o == store) {
            continue;
        }
        match store {
            "memory" => memory::run(win, &mut sink).await,
            "redis" => redis::run(win, &mut sink).await,
            "postgres" => postgres::run(win, &mut sink).await,
            "etcd" => etcd::run(win, &mut sink).await,
            _ => unreachable!("STORES lists every store"),
        }
    }
    sink
}

/// The benchmark's runtime: two worker threads.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--smoke` in the test build: every row of every store runs against
    /// the kit's real servers and the checks inside the rows hold (a
    /// store error or a wrong answer panics). Nothing is asserted on the
    /// numbers, which a debug build on a loaded machine makes meaningless.
    #[test]
    fn every_row_runs_on_every_store() {
        let sink = runtime().block_on(run(&[], SMOKE));
        for store in STORES {
            for op in [
                "cycle",
                "check",
                "queue",
                "queue_many",
                "handoff_separate",
                "handoff_shared",
            ] {
                assert!(
                    sink.rows.iter().any(|r| r.store == store && r.op == op),
                    "no `{op}` row for {store}"
                );
            }
        }
        let floors = sink.rows.iter().filter(|r| r.floor.is_some());
        let floors: Vec<_> = floors.map(|r| (r.store, r.op)).collect();
        assert_eq!(floors, [("redis", "cycle"), ("redis", "cycle")]);
    }
}
