//! The properties, as functions (rustfmt formats them; the
//! `proptest!` block in `properties.rs` only draws their inputs).

use super::*;

pub(super) fn sliding_log_never_admits_more_than_the_limit_in_any_window(
    t0: u128,
    limit: u64,
    window_ms: u64,
    steps: Vec<Step>,
) -> Result<(), TestCaseError> {
    let w = u128::from(window_ms) * MS;
    let steps: Vec<Step> = steps
        .into_iter()
        .map(|s| Step {
            limit,
            window_ms,
            cost: s.cost.min(limit),
            ..s
        })
        .collect();
    let (_, log, admitted) = run(Algorithm::SlidingLog, t0, &steps);
    let mut before: Vec<Admitted> = Vec::new();
    for (now, step, d) in log {
        let used: u64 = before
            .iter()
            .filter(|a| a.at + w > now)
            .map(|a| a.cost)
            .sum();
        prop_assert_eq!(
            d.allowed,
            used + step.cost <= limit,
            "used {} at {}",
            used,
            now
        );
        let left = if d.allowed {
            limit - used - step.cost
        } else {
            limit - used
        };
        prop_assert_eq!(d.remaining, left);
        if d.allowed {
            before.push(Admitted {
                at: now,
                cost: step.cost,
                quota: step.quota(Algorithm::SlidingLog),
            });
        }
    }
    for a in &admitted {
        let in_window = cost_in(&admitted, (a.at + 1).saturating_sub(w), a.at);
        prop_assert!(
            in_window <= limit,
            "{} admitted in the window ending at {}",
            in_window,
            a.at
        );
    }
    Ok(())
}

pub(super) fn window_counters_decide_by_the_aligned_windows_whatever_the_limit(
    sliding: bool,
    t0: u128,
    window_ms: u64,
    steps: Vec<Step>,
) -> Result<(), TestCaseError> {
    let algorithm = if sliding {
        Algorithm::SlidingWindow
    } else {
        Algorithm::FixedWindow
    };
    let w = u128::from(window_ms) * MS;
    let steps: Vec<Step> = steps.into_iter().map(|s| Step { window_ms, ..s }).collect();
    let (_, log, _) = run(algorithm, t0, &steps);
    let mut before: Vec<(u128, u64)> = Vec::new();
    for (now, step, d) in log {
        let index = now / w;
        let count = |i: u128| -> u128 {
            before
                .iter()
                .filter(|(t, _)| t / w == i)
                .map(|(_, c)| u128::from(*c))
                .sum()
        };
        let (curr, limit, cost) = (count(index), u128::from(step.limit), u128::from(step.cost));
        let fits = if sliding {
            let prev = if index > 0 { count(index - 1) } else { 0 };
            prev * (w - now % w) + (curr + cost) * w <= limit * w
        } else {
            curr + cost <= limit
        };
        prop_assert_eq!(
            d.allowed,
            fits,
            "{:?} at {} (window {}), {} in it",
            step,
            now,
            index,
            curr
        );
        if d.allowed {
            prop_assert!(curr + cost <= limit);
            before.push((now, step.cost));
        }
    }
    Ok(())
}

pub(super) fn quota_changes_grant_no_fresh_allowance(
    algorithm: Algorithm,
    t0: u128,
    steps: Vec<Step>,
) -> Result<(), TestCaseError> {
    let (_, _, admitted) = run(algorithm, t0, &steps);
    let shortest = u128::from(WINDOWS_MS[0]) * MS;
    let unbroken = |from: u128, to: u128| match algorithm {
        Algorithm::SlidingLog => to - from < shortest,
        Algorithm::FixedWindow | Algorithm::SlidingWindow => WINDOWS_MS
            .iter()
            .all(|ms| from / (u128::from(*ms) * MS) == to / (u128::from(*ms) * MS)),
        Algorithm::Gcra => true,
    };
    for (j, a) in admitted.iter().enumerate() {
        for earlier in &admitted[..=j] {
            if !unbroken(earlier.at, a.at) {
                continue;
            }
            let sum = u128::from(cost_in(&admitted[..=j], earlier.at, a.at));
            let limit = u128::from(a.quota.limit);
            let bound = match algorithm {
                // Freed at the fastest rate, MAX_LIMIT per shortest window.
                Algorithm::Gcra => limit * shortest + u128::from(MAX_LIMIT) * (a.at - earlier.at),
                _ => limit * shortest,
            };
            prop_assert!(
                sum * shortest <= bound,
                "{:?}: {} admitted from {} to {}, checked with {:?}",
                algorithm,
                sum,
                earlier.at,
                a.at,
                a.quota
            );
        }
    }
    Ok(())
}

pub(super) fn a_sliding_log_counts_what_it_keeps_for_the_largest_window(
    t0: u128,
    steps: Vec<Step>,
) -> Result<(), TestCaseError> {
    let (_, log, _) = run(Algorithm::SlidingLog, t0, &steps);
    let ns = |s: &Step| u128::from(s.window_ms) * MS;
    let kept = |i: usize, j: usize| {
        let (t_i, step_i, _) = &log[i];
        let mut longest = ns(step_i);
        for (t_k, step_k, _) in &log[i + 1..=j] {
            if t_k - t_i >= longest {
                return false;
            }
            longest = longest.max(ns(step_k));
        }
        true
    };
    for (j, (t_j, step_j, d)) in log.iter().enumerate() {
        if !d.allowed {
            continue;
        }
        let counted: u64 = (0..j)
            .filter(|&i| log[i].2.allowed && t_j - log[i].0 < ns(step_j) && kept(i, j))
            .map(|i| log[i].1.cost)
            .sum();
        prop_assert!(
            counted + step_j.cost <= step_j.limit,
            "{:?} admitted at {} over {} kept in its window",
            step_j,
            t_j,
            counted
        );
    }
    Ok(())
}

pub(super) fn a_denied_request_fits_exactly_at_retry_after(
    algorithm: Algorithm,
    t0: u128,
    steps: Vec<Step>,
) -> Result<(), TestCaseError> {
    let mut st = LimitState::new(&steps[0].quota(algorithm));
    let mut now = t0;
    for step in &steps {
        now += step.advance;
        let quota = step.quota(algorithm);
        let d = st.check(now, &quota, step.cost);
        if d.allowed {
            prop_assert_eq!(d.retry_after, Duration::ZERO);
            continue;
        }
        let r = d.retry_after.as_nanos();
        prop_assert!(r > 0, "{:?}", d);
        let at = st.clone().check(now + r, &quota, step.cost);
        prop_assert!(
            at.allowed,
            "{:?} denied at {} + retry_after {:?}",
            step,
            now,
            d.retry_after
        );
        if r > 1 && r != MS {
            let sooner = st.clone().check(now + r - 1, &quota, step.cost);
            prop_assert!(
                !sooner.allowed,
                "{:?} admitted 1 ns before retry_after {:?}",
                step,
                d.retry_after
            );
        }
    }
    Ok(())
}

pub(super) fn a_check_behind_the_state_clock_is_no_more_lenient(
    algorithm: Algorithm,
    t0: u128,
    steps: Vec<Step>,
    backs: Vec<u128>,
) -> Result<(), TestCaseError> {
    let mut st = LimitState::new(&steps[0].quota(algorithm));
    let mut latest = t0;
    for (step, back) in steps.iter().zip(backs) {
        latest += step.advance;
        let now = latest - back;
        let quota = step.quota(algorithm);
        let at_latest = st.clone().check(latest, &quota, step.cost);
        let d = st.check(now, &quota, step.cost);
        prop_assert!(
            !d.allowed || at_latest.allowed,
            "{:?} admitted {} ns behind the state's clock, refused at it",
            step,
            back
        );
    }
    Ok(())
}

pub(super) fn an_idle_state_decides_as_a_fresh_one(
    algorithm: Algorithm,
    t0: u128,
    steps: Vec<Step>,
    gap: u128,
    next: (u64, u64, u64),
) -> Result<(), TestCaseError> {
    let (st, log, _) = run(algorithm, t0, &steps);
    let last = log.last().unwrap().0;
    let longest = u128::from(WINDOWS_MS[2]) * MS;
    prop_assert!(st.is_idle(last + (u128::from(MAX_LIMIT) + 2) * longest));
    let (limit, window_ms, cost) = next;
    let quota = Quota::new(limit, Duration::from_millis(window_ms), algorithm);
    let t = last + gap;
    if st.is_idle(t) {
        let cost = cost.min(limit);
        let fresh = LimitState::new(&quota).check(t, &quota, cost);
        prop_assert_eq!(st.clone().check(t, &quota, cost), fresh);
    }
    Ok(())
}
