//! Property tests: random histories of checks (clock steps of zero,
//! a fraction of a window, a few windows and many windows; limits and
//! windows changing between checks) held to the rules in the module
//! docs and `docs/guarantees.md`.

mod check;

use super::*;
use proptest::prelude::*;

const MS: u128 = 1_000_000;
/// The window lengths quotas are drawn from (ms).
const WINDOWS_MS: [u64; 3] = [10, 25, 60];
const MAX_LIMIT: u64 = 6;

/// One check: how far the clock moves before it (ns), then the
/// quota's limit, window (ms) and the request's cost.
#[derive(Debug, Clone, Copy)]
struct Step {
    advance: u128,
    limit: u64,
    window_ms: u64,
    cost: u64,
}

impl Step {
    fn quota(&self, algorithm: Algorithm) -> Quota {
        Quota::new(self.limit, Duration::from_millis(self.window_ms), algorithm)
    }
}

/// Clock steps: none (checks at one instant), under 2 ms, up to
/// about a window, and jumps of up to 100 windows.
fn advance() -> impl Strategy<Value = u128> {
    prop_oneof![
        3 => Just(0u128),
        3 => 0..2 * MS,
        2 => 0..70 * MS,
        1 => 0..6000 * MS,
    ]
}

/// Checks whose limit and window are drawn per check from
/// `limits` and `windows` (ms), cost at most the limit.
fn steps(
    limits: std::ops::RangeInclusive<u64>,
    windows: Vec<u64>,
) -> impl Strategy<Value = Vec<Step>> {
    let step = (
        advance(),
        limits,
        prop::sample::select(windows),
        1..=MAX_LIMIT,
    )
        .prop_map(|(advance, limit, window_ms, cost)| Step {
            advance,
            limit,
            window_ms,
            cost: cost.min(limit),
        });
    prop::collection::vec(step, 1..60)
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(Algorithm::ALL.to_vec())
}

/// The epoch offset of the first check (not aligned to any window).
fn start() -> impl Strategy<Value = u128> {
    0..1_000_000 * MS
}

/// One admitted request: when, its cost, the quota it was checked
/// with.
struct Admitted {
    at: u128,
    cost: u64,
    quota: Quota,
}

/// Run `steps` on a fresh state from `t0`, checking that the state
/// survives encode and decode after each; the decisions with their
/// times, and the admitted requests.
fn run(
    algorithm: Algorithm,
    t0: u128,
    steps: &[Step],
) -> (LimitState, Vec<(u128, Step, Decision)>, Vec<Admitted>) {
    let mut st = LimitState::new(&steps[0].quota(algorithm));
    let (mut now, mut log, mut admitted) = (t0, Vec::new(), Vec::new());
    for step in steps {
        now += step.advance;
        let quota = step.quota(algorithm);
        let d = st.check(now, &quota, step.cost);
        assert_eq!(
            LimitState::decode(algorithm, &st.encode()),
            Some(st.clone())
        );
        if d.allowed {
            admitted.push(Admitted {
                at: now,
                cost: step.cost,
                quota,
            });
        }
        log.push((now, *step, d));
    }
    (st, log, admitted)
}

fn cost_in(admitted: &[Admitted], from: u128, to: u128) -> u64 {
    admitted
        .iter()
        .filter(|a| a.at >= from && a.at <= to)
        .map(|a| a.cost)
        .sum()
}

proptest! {
    /// Sliding log, one quota: a request is admitted exactly when
    /// it fits with the cost admitted in the trailing window, so no
    /// window ever holds more than `limit`; `remaining` is what is
    /// left of it.
    #[test]
    fn sliding_log_never_admits_more_than_the_limit_in_any_window(
        t0 in start(),
        limit in 1..=MAX_LIMIT,
        window_ms in prop::sample::select(WINDOWS_MS.to_vec()),
        steps in steps(1..=MAX_LIMIT, WINDOWS_MS.to_vec()),
    ) {
        check::sliding_log_never_admits_more_than_the_limit_in_any_window(
            t0, limit, window_ms, steps,
        )?;
    }

    /// Fixed and sliding window with one window length and limits
    /// changing between checks: each check decides on its own limit
    /// by the counts of the epoch-aligned windows, exactly (fixed:
    /// this window's count; sliding: the previous window's count
    /// weighted by its overlap with the trailing window, plus this
    /// window's), so no aligned window admits more than the limit of
    /// any check admitted in it.
    #[test]
    fn window_counters_decide_by_the_aligned_windows_whatever_the_limit(
        sliding in any::<bool>(),
        t0 in start(),
        window_ms in prop::sample::select(WINDOWS_MS.to_vec()),
        steps in steps(1..=MAX_LIMIT, WINDOWS_MS.to_vec()),
    ) {
        check::window_counters_decide_by_the_aligned_windows_whatever_the_limit(
            sliding, t0, window_ms, steps,
        )?;
    }

    /// Quotas changing (limits and windows) never grant a fresh
    /// allowance: for every admitted request, the cost admitted
    /// since any earlier admission, while no window of any quota in
    /// use ended (for the sliding log: within the shortest window),
    /// is within the checking quota's limit; GCRA admits at most
    /// its limit plus what the fastest quota's rate frees in that
    /// time.
    #[test]
    fn quota_changes_grant_no_fresh_allowance(
        algorithm in algorithm(),
        t0 in start(),
        steps in steps(1..=MAX_LIMIT, WINDOWS_MS.to_vec()),
    ) {
        check::quota_changes_grant_no_fresh_allowance(algorithm, t0, steps)?;
    }

    /// Sliding log, windows changing: entries are kept for the
    /// largest window the key was checked with while they were in
    /// it, and a check counts every kept entry within its own
    /// window. An admitted request at `t` with window `w` is within
    /// its limit together with every earlier admission less than
    /// `w` before it that no check since could have dropped (none
    /// came a full window after it, by the largest window checked
    /// between the two).
    #[test]
    fn a_sliding_log_counts_what_it_keeps_for_the_largest_window(
        t0 in start(),
        steps in steps(1..=MAX_LIMIT, WINDOWS_MS.to_vec()),
    ) {
        check::a_sliding_log_counts_what_it_keeps_for_the_largest_window(t0, steps)?;
    }

    /// A denied check says when the same request fits: retried
    /// `retry_after` later (nothing else checked meanwhile) it is
    /// admitted, and 1 ns sooner it is not (unless `retry_after`
    /// is 1 ms, the floor of the algorithms other than the fixed
    /// window). Quotas change along the way.
    #[test]
    fn a_denied_request_fits_exactly_at_retry_after(
        algorithm in algorithm(),
        t0 in start(),
        steps in steps(1..=MAX_LIMIT, WINDOWS_MS.to_vec()),
    ) {
        check::a_denied_request_fits_exactly_at_retry_after(algorithm, t0, steps)?;
    }

    /// Clock steps back (another client's clock behind, a stepped
    /// clock): a check behind the latest time the state has seen is
    /// never admitted where the same check at that latest time would
    /// be refused, for every algorithm, quotas changing along the
    /// way.
    #[test]
    fn a_check_behind_the_state_clock_is_no_more_lenient(
        algorithm in algorithm(),
        t0 in 1_000 * MS..1_000_000 * MS,
        steps in steps(1..=MAX_LIMIT, WINDOWS_MS.to_vec()),
        backs in prop::collection::vec(prop_oneof![2 => Just(0u128), 1 => 0..70 * MS], 60),
    ) {
        check::a_check_behind_the_state_clock_is_no_more_lenient(algorithm, t0, steps, backs)?;
    }

    /// A state is idle once the largest window (times the largest
    /// ratio of limits, for GCRA's backlog) has passed since its
    /// last check, and an idle state decides as a fresh one.
    #[test]
    fn an_idle_state_decides_as_a_fresh_one(
        algorithm in algorithm(),
        t0 in start(),
        steps in steps(1..=MAX_LIMIT, WINDOWS_MS.to_vec()),
        gap in 0..7_000 * MS,
        next in (1..=MAX_LIMIT, prop::sample::select(WINDOWS_MS.to_vec()), 1..=MAX_LIMIT),
    ) {
        check::an_idle_state_decides_as_a_fresh_one(algorithm, t0, steps, gap, next)?;
    }
}
