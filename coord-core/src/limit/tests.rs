//! Unit tests of the rate limiting algorithms: admissions, retry and
//! reset times, quota changes carried over, encoding.

mod properties;

use super::*;

const S: u128 = 1_000_000_000;

#[test]
fn every_algorithm_admits_limit_then_recovers_after_retry_after() {
    for alg in Algorithm::ALL {
        let q = Quota::new(5, Duration::from_secs(10), alg);
        let mut st = LimitState::new(&q);
        let t0 = 1000 * S + 1;
        let admitted = (0..15).filter(|_| st.check(t0, &q, 1).allowed).count();
        assert_eq!(admitted, 5, "{alg:?}");
        let d = st.check(t0, &q, 1);
        assert!(
            !d.allowed && d.retry_after > Duration::ZERO && d.remaining == 0,
            "{alg:?}"
        );
        let later = t0 + d.retry_after.as_nanos();
        assert!(st.check(later, &q, 1).allowed, "{alg:?} after retry_after");
        let round = LimitState::decode(alg, &st.encode()).unwrap();
        assert_eq!(round, st, "{alg:?} encode/decode");
        assert!(st.is_idle(later + 30 * S), "{alg:?}");
        assert!(!st.is_idle(later), "{alg:?}");
    }
}

#[test]
fn an_idle_key_takes_a_new_quota_at_once() {
    for alg in Algorithm::ALL {
        let big = Quota::new(1000, Duration::from_secs(1), alg);
        let small = Quota::new(10, Duration::from_secs(1), alg);
        let mut st = LimitState::new(&big);
        let t0 = 100 * S;
        assert!(st.check(t0, &big, 1000).allowed, "{alg:?}");
        // Long idle, then a smaller limit: admitted at once (GCRA's
        // scaled state must not lock the key out).
        let d = st.check(t0 + 10 * S, &small, 1);
        assert!(d.allowed && d.remaining == 9, "{alg:?}: {d:?}");
    }
}

#[test]
fn alternating_quotas_never_reset_each_other() {
    for alg in Algorithm::ALL {
        let a = Quota::new(10, Duration::from_secs(600), alg);
        let b = Quota::new(11, Duration::from_secs(600), alg);
        let mut st = LimitState::new(&a);
        let t0 = 1000 * S + 7;
        let admitted = (0..1000u128)
            .filter(|i| {
                let q = if i % 2 == 0 { &a } else { &b };
                st.check(t0 + i * 1_000_000, q, 1).allowed
            })
            .count();
        assert!(admitted <= 11, "{alg:?}: {admitted} admitted");
        assert!(admitted >= 10, "{alg:?}: {admitted} admitted");
    }
}

#[test]
fn a_lowered_limit_counts_what_was_admitted() {
    for alg in Algorithm::ALL {
        let big = Quota::new(20, Duration::from_secs(600), alg);
        let small = Quota::new(10, Duration::from_secs(600), alg);
        let mut st = LimitState::new(&big);
        let t0 = 1000 * S + 7;
        for i in 0..15 {
            assert!(st.check(t0 + i, &big, 1).allowed, "{alg:?}");
        }
        let d = st.check(t0 + 20, &small, 1);
        assert!(!d.allowed && d.remaining == 0, "{alg:?}: {d:?}");
        // And the larger quota still sees its 15.
        let admitted = (0..10)
            .filter(|i| st.check(t0 + 30 + i, &big, 1).allowed)
            .count();
        assert_eq!(admitted, 5, "{alg:?}");
    }
}

#[test]
fn a_changed_window_carries_the_count() {
    for alg in Algorithm::ALL {
        let long = Quota::new(10, Duration::from_secs(600), alg);
        let short = Quota::new(10, Duration::from_secs(60), alg);
        let mut st = LimitState::new(&long);
        let t0 = 6000 * S + 7;
        for i in 0..10 {
            assert!(st.check(t0 + i, &long, 1).allowed, "{alg:?}");
        }
        // Alternating windows with the same limit: nothing more within
        // the short window of the burst.
        let extra = (0..100u128)
            .filter(|i| {
                let q = if i % 2 == 0 { &short } else { &long };
                st.check(t0 + 100 + i, q, 1).allowed
            })
            .count();
        assert_eq!(extra, 0, "{alg:?}");
    }
}

#[test]
fn a_sliding_log_keeps_entries_for_the_largest_window() {
    let long = Quota::new(10, Duration::from_secs(600), Algorithm::SlidingLog);
    let short = Quota::new(10, Duration::from_secs(60), Algorithm::SlidingLog);
    let mut st = LimitState::new(&long);
    let t0 = 6000 * S;
    for i in 0..10 {
        assert!(st.check(t0 + i, &long, 1).allowed);
    }
    // Past the short window: the short quota admits afresh...
    let t1 = t0 + 61 * S;
    assert!(st.check(t1, &short, 1).allowed);
    // ...but the long quota still counts the first ten.
    assert!(!st.check(t1 + 1, &long, 1).allowed);
    let round = LimitState::decode(Algorithm::SlidingLog, &st.encode()).unwrap();
    assert_eq!(round, st);
}

#[test]
fn a_sliding_window_carries_its_weighted_estimate_into_a_new_window() {
    let long = Quota::new(10, Duration::from_secs(600), Algorithm::SlidingWindow);
    let short = Quota::new(10, Duration::from_secs(60), Algorithm::SlidingWindow);
    let mut st = LimitState::new(&long);
    let w = 600 * S;
    let k = 7;
    for i in 0..10 {
        assert!(st.check(k * w + 500 * S + i, &long, 1).allowed);
    }
    // 60 s into the next long window: the estimate is 10 x 540/600 = 9,
    // carried as the short window's count: one more fits, then none.
    let t = (k + 1) * w + 60 * S;
    let admitted = (0..5)
        .filter(|i| st.check(t + i, &short, 1).allowed)
        .count();
    assert_eq!(admitted, 1);
    // 61 s later the short window has moved on: its previous window (the
    // carried 10) weighs (60 - 1) / 60, so nothing fits yet...
    assert!(!st.check(t + 61 * S, &short, 1).allowed);
    // ...and a full short window later everything has aged out.
    let later = t + 200 * S;
    let admitted = (0..12)
        .filter(|i| st.check(later + i, &short, 1).allowed)
        .count();
    assert_eq!(admitted, 10);
}

#[test]
fn a_raised_limit_counts_what_was_admitted() {
    for alg in Algorithm::ALL {
        let small = Quota::new(10, Duration::from_secs(600), alg);
        let big = Quota::new(20, Duration::from_secs(600), alg);
        let mut st = LimitState::new(&small);
        let t0 = 6000 * S + 7;
        for i in 0..10 {
            assert!(st.check(t0 + i, &small, 1).allowed, "{alg:?}");
        }
        let more = (0..30)
            .filter(|i| st.check(t0 + 20 + i, &big, 1).allowed)
            .count();
        assert_eq!(more, 10, "{alg:?}: the raised limit forgot the first 10");
    }
}

#[test]
fn admissions_report_a_reset_time() {
    for alg in Algorithm::ALL {
        let q = Quota::new(5, Duration::from_secs(10), alg);
        let mut st = LimitState::new(&q);
        let d = st.check(1000 * S + 1, &q, 1);
        assert!(
            d.allowed && d.reset_after > Duration::ZERO,
            "{alg:?}: {d:?}"
        );
        assert!(d.reset_after <= Duration::from_secs(20), "{alg:?}: {d:?}");
    }
}

#[test]
fn a_sliding_window_decays_the_previous_window_and_stays_busy_through_it() {
    let q = Quota::new(10, Duration::from_secs(60), Algorithm::SlidingWindow);
    let w = 60 * S;
    let k = 100;
    let mut st = LimitState::new(&q);
    for i in 0..10 {
        assert!(st.check(k * w + 50 * S + i, &q, 1).allowed);
    }
    // The previous window still counts in the next one: not idle.
    assert!(!st.is_idle((k + 1) * w + S));
    // 7 s in: 10 x 53/60 = 8.83 weighs, one fits.
    let t = (k + 1) * w + 7 * S;
    assert_eq!((0..5).filter(|i| st.check(t + i, &q, 1).allowed).count(), 1);
    // The next fits once 10 x (60 - x)/60 <= 10 - 1 - 1, at x = 12 s.
    let d = st.check(t + 10, &q, 1);
    assert!(!d.allowed);
    let want = Duration::from_secs(5) - Duration::from_nanos(10);
    assert_eq!(d.retry_after, want, "{d:?}");
    assert!(!st.check(t + 5 * S - 1_000_000, &q, 1).allowed);
    assert!(st.check(t + 5 * S, &q, 1).allowed);
    // 30 s in: 10 x 30/60 = 5 weighs, plus the 2: three more fit.
    let t = (k + 1) * w + 30 * S;
    assert_eq!((0..8).filter(|i| st.check(t + i, &q, 1).allowed).count(), 3);
    assert!(st.is_idle((k + 3) * w));
}

#[test]
fn a_sliding_log_entry_ages_out_exactly_one_window_later() {
    let q = Quota::new(5, Duration::from_secs(10), Algorithm::SlidingLog);
    let mut st = LimitState::new(&q);
    let t0 = 1000 * S;
    for _ in 0..5 {
        assert!(st.check(t0, &q, 1).allowed);
    }
    assert!(!st.check(t0 + 10 * S - 1, &q, 1).allowed);
    assert!(!st.is_idle(t0 + 10 * S - 1));
    assert!(st.is_idle(t0 + 10 * S));
    assert!(
        st.check(t0 + 10 * S, &q, 1).allowed,
        "an entry exactly one window old still counted"
    );
}

#[test]
fn a_denied_sliding_log_check_says_exactly_when_to_retry() {
    let q = Quota::new(5, Duration::from_secs(10), Algorithm::SlidingLog);
    let mut st = LimitState::new(&q);
    let t0 = 1000 * S;
    assert!(st.check(t0, &q, 3).allowed);
    assert!(st.check(t0 + S, &q, 2).allowed);
    // Cost 3 fits once the first entry (3) ages out at t0 + 10 s; cost
    // 1 too; the whole log is gone at t0 + 11 s.
    let d = st.check(t0 + 2 * S, &q, 3);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Duration::from_secs(8));
    assert_eq!(d.reset_after, Duration::from_secs(9));
    assert_eq!(d.remaining, 0);
    let d = st.check(t0 + 2 * S, &q, 1);
    assert_eq!(d.retry_after, Duration::from_secs(8));
}

#[test]
fn exact_decisions_at_the_edges() {
    let w = 60 * S;
    let k = 100;
    // Sliding window, full in this window: the next fits 6 s into the
    // next window (10 x (60 - x)/60 <= 9), the state resets in 110 s.
    let q = Quota::new(10, Duration::from_secs(60), Algorithm::SlidingWindow);
    let mut st = LimitState::new(&q);
    for i in 0..10 {
        assert!(st.check(k * w + 10 * S + i, &q, 1).allowed);
    }
    let d = st.check(k * w + 10 * S + 10, &q, 1);
    assert!(!d.allowed);
    assert_eq!(
        d.retry_after,
        Duration::from_secs(56) - Duration::from_nanos(10)
    );
    assert_eq!(
        d.reset_after,
        Duration::from_secs(110) - Duration::from_nanos(10)
    );
    // Fixed window: retry and reset at the window's end.
    let q = Quota::new(2, Duration::from_secs(60), Algorithm::FixedWindow);
    let mut st = LimitState::new(&q);
    let t = k * w + 15 * S;
    assert_eq!(st.check(t, &q, 1).remaining, 1);
    assert!(st.check(t, &q, 1).allowed);
    let d = st.check(t, &q, 1);
    assert!(!d.allowed);
    assert_eq!(
        (d.retry_after, d.reset_after),
        (Duration::from_secs(45), Duration::from_secs(45))
    );
    // Every algorithm counts `remaining` down by the cost.
    for alg in Algorithm::ALL {
        let q = Quota::new(5, Duration::from_secs(10), alg);
        let mut st = LimitState::new(&q);
        assert_eq!(st.check(k * w + 1, &q, 2).remaining, 3, "{alg:?}");
        assert_eq!(st.check(k * w + 2, &q, 1).remaining, 2, "{alg:?}");
    }
    // GCRA, full: the next request fits one emission interval later.
    let q = Quota::new(10, Duration::from_secs(600), Algorithm::Gcra);
    let mut st = LimitState::new(&q);
    let t = k * w;
    for _ in 0..10 {
        assert!(st.check(t, &q, 1).allowed);
    }
    let d = st.check(t, &q, 1);
    assert_eq!((d.allowed, d.retry_after), (false, Duration::from_secs(60)));
    assert_eq!(d.reset_after, Duration::from_secs(600));
    // Sliding window with only the previous window counting: it resets
    // at this window's end.
    let q = Quota::new(10, Duration::from_secs(60), Algorithm::SlidingWindow);
    let mut st = LimitState::new(&q);
    for _ in 0..10 {
        assert!(st.check(k * w + 50 * S, &q, 1).allowed);
    }
    let d = st.check((k + 1) * w + S, &q, 1);
    assert!(!d.allowed);
    assert_eq!(d.reset_after, Duration::from_secs(59));
}

#[test]
fn a_sliding_log_counts_only_its_own_window_of_a_longer_retention() {
    let long = Quota::new(10, Duration::from_secs(20), Algorithm::SlidingLog);
    let short = Quota::new(5, Duration::from_secs(10), Algorithm::SlidingLog);
    let mut st = LimitState::new(&long);
    let t0 = 1000 * S;
    for _ in 0..5 {
        assert!(st.check(t0, &long, 1).allowed);
    }
    // Exactly one short window later the five are out of it (but kept
    // for the long quota).
    assert!(st.check(t0 + 10 * S, &short, 1).allowed);
    assert!(!st.check(t0 + 10 * S, &long, 5).allowed);
}

#[test]
fn a_sliding_log_drops_entries_past_its_retention() {
    let q = Quota::new(3, Duration::from_secs(1), Algorithm::SlidingLog);
    let mut st = LimitState::new(&q);
    for i in 0..1000u128 {
        st.check(1000 * S + i * S, &q, 1);
    }
    assert!(st.encode().len() < 100, "{}", st.encode());
}

#[test]
fn gcra_rescales_its_backlog_to_a_new_window() {
    let long = Quota::new(10, Duration::from_secs(600), Algorithm::Gcra);
    let short = Quota::new(10, Duration::from_secs(60), Algorithm::Gcra);
    let mut st = LimitState::new(&long);
    let t0 = 6000 * S;
    for i in 0..10 {
        assert!(st.check(t0 + i, &long, 1).allowed);
    }
    // 61 s later 539 s of the 600 s backlog are owed: 8.98 requests, at
    // 6 s each under the short quota: one more fits, then none.
    let t = t0 + 61 * S;
    assert!(st.check(t, &short, 1).allowed);
    assert!(!st.check(t + 1, &short, 1).allowed);
}

#[test]
fn huge_limits_and_costs_do_not_overflow() {
    for alg in Algorithm::ALL {
        let q = Quota::new(u64::MAX, Duration::from_secs(1), alg);
        let mut st = LimitState::new(&q);
        assert!(st.check(5 * S, &q, u64::MAX).allowed, "{alg:?}");
        let d = st.check(5 * S, &q, u64::MAX);
        assert!(!d.allowed && d.remaining == 0, "{alg:?}: {d:?}");
    }
}

#[test]
fn corrupt_text_is_none() {
    assert!(LimitState::decode(Algorithm::FixedWindow, "x").is_none());
    assert!(LimitState::decode(Algorithm::FixedWindow, "5 10|x").is_none());
    assert!(LimitState::decode(Algorithm::SlidingWindow, "5 10|1 2").is_none());
    assert!(LimitState::decode(Algorithm::SlidingLog, "5 10|1:2,zz").is_none());
    let empty = LimitState::new(&Quota::new(
        5,
        Duration::from_nanos(10),
        Algorithm::SlidingLog,
    ));
    assert_eq!(
        LimitState::decode(Algorithm::SlidingLog, "5 10|"),
        Some(empty)
    );
}
