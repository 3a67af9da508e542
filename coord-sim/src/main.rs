//! `coord-sim`: run seeds of the simulator and report violations.
//!
//! ```text
//! coord-sim [--seeds N | --minutes M] [--start S]   run seeds S, S+1, ...
//! coord-sim --seed S [--trace]                      replay one seed
//! ```
//!
//! Ends with `sim: N seeds, V violations, R seeds/s`. A failing seed is
//! printed with the command that replays it and the tail of its trace.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use coord_sim::{Options, run_seed};

struct Args {
    seeds: Option<u64>,
    minutes: Option<f64>,
    start: u64,
    seed: Option<u64>,
    trace: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        seeds: None,
        minutes: None,
        start: 0,
        seed: None,
        trace: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |what: &str| it.next().ok_or(format!("{what} needs a value"));
        match arg.as_str() {
            "--seeds" => {
                a.seeds = Some(
                    val("--seeds")?
                        .parse()
                        .map_err(|e| format!("--seeds: {e}"))?,
                )
            }
            "--minutes" => {
                a.minutes = Some(
                    val("--minutes")?
                        .parse()
                        .map_err(|e| format!("--minutes: {e}"))?,
                )
            }
            "--start" => {
                a.start = val("--start")?
                    .parse()
                    .map_err(|e| format!("--start: {e}"))?
            }
            "--seed" => a.seed = Some(val("--seed")?.parse().map_err(|e| format!("--seed: {e}"))?),
            "--trace" => a.trace = true,
            "-h" | "--help" => {
                return Err(
                    "usage: coord-sim [--seeds N | --minutes M] [--start S] | --seed S [--trace]"
                        .into(),
                );
            }
            other => return Err(format!("unknown argument `{other}` (try --help)")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let opts = Options::default();
    if let Some(seed) = args.seed {
        let r = run_seed(
            seed,
            Options {
                keep_trace: true,
                ..opts
            },
        );
        if args.trace || !r.violations.is_empty() {
            for l in &r.trace {
                println!("{l}");
            }
        }
        for v in &r.violations {
            println!("VIOLATION seed {seed}: {v}");
        }
        println!(
            "seed {seed}: digest {:016x}, {} events, {} grants, {:?} simulated, {} violations",
            r.digest,
            r.events,
            r.grants,
            r.simulated,
            r.violations.len()
        );
        return if r.violations.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let budget = args.minutes.map(|m| Duration::from_secs_f64(m * 60.0));
    let count = args
        .seeds
        .unwrap_or(if budget.is_some() { u64::MAX } else { 100 });
    let began = Instant::now();
    let (mut ran, mut violations) = (0u64, 0usize);
    let mut seed = args.start;
    while ran < count && budget.is_none_or(|b| began.elapsed() < b) {
        let r = run_seed(seed, opts);
        ran += 1;
        if !r.violations.is_empty() {
            violations += r.violations.len();
            let again = run_seed(
                seed,
                Options {
                    keep_trace: true,
                    ..opts
                },
            );
            let tail = again.trace.len().saturating_sub(60);
            println!(
                "--- seed {seed}: {} violations (found after {:.1?})",
                r.violations.len(),
                began.elapsed()
            );
            for l in &again.trace[tail..] {
                println!("  {l}");
            }
            for v in &r.violations {
                println!("VIOLATION seed {seed}: {v}");
            }
            println!("replay: scripts/sim --seed {seed} --trace");
        }
        seed += 1;
    }
    let secs = began.elapsed().as_secs_f64().max(1e-9);
    println!(
        "sim: {ran} seeds, {violations} violations, {:.1} seeds/s",
        ran as f64 / secs
    );
    if violations == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
