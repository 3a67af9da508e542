//! The simulator's own guarantees: one seed gives one history, a small
//! fixed budget of seeds breaks no rule, and the checkers can fail.

use coord_sim::{Options, run_seed};

/// The same seed twice in one process: the same trace, line for line.
#[test]
fn one_seed_one_history() {
    let opts = Options {
        keep_trace: true,
        ..Options::default()
    };
    for seed in [1, 7, 42] {
        let a = run_seed(seed, opts);
        let b = run_seed(seed, opts);
        assert!(
            a.events > 100,
            "seed {seed} did too little: {} events",
            a.events
        );
        assert_eq!(a.trace, b.trace, "seed {seed} ran two ways");
        assert_eq!(a.digest, b.digest);
    }
    assert_ne!(run_seed(1, opts).digest, run_seed(2, opts).digest);
}

/// A seed's history does not depend on what ran before it in the process
/// (no state carried over in statics, thread-locals or the runtime).
#[test]
fn history_does_not_depend_on_earlier_seeds() {
    let first = run_seed(42, Options::default()).digest;
    for seed in 0..5 {
        run_seed(seed, Options::default());
    }
    assert_eq!(run_seed(42, Options::default()).digest, first);
}

/// A fixed budget of 2,000 seeds, every rule kept, on every core (each
/// seed runs on a runtime of its own, on one thread). Longer runs:
/// `scripts/sim --minutes M`.
#[test]
fn fixed_budget_has_no_violations() {
    const SEEDS: u64 = 2_000;
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get() as u64);
    let failed: Vec<String> = std::thread::scope(|s| {
        let lanes: Vec<_> = (0..threads)
            .map(|lane| {
                s.spawn(move || {
                    (lane..SEEDS)
                        .step_by(threads as usize)
                        .filter_map(|seed| {
                            let r = run_seed(seed, Options::default());
                            (!r.violations.is_empty()).then(|| {
                                format!(
                                    "seed {seed}: {:?}\nreplay: scripts/sim --seed {seed} --trace",
                                    r.violations
                                )
                            })
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        lanes.into_iter().flat_map(|l| l.join().unwrap()).collect()
    });
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// A store that forgets the marks against late copies of attempts lets a
/// late attempt take a claim its owner gave up: the simulator catches it
/// within a few hundred seeds, so the checkers can fail.
#[test]
fn a_store_without_late_copy_marks_is_caught() {
    let mut opts = Options::default();
    opts.rates.marks_kept = false;
    let found = (0..600).find(|&seed| !run_seed(seed, opts).violations.is_empty());
    assert!(found.is_some(), "no seed of 600 caught it");
}
