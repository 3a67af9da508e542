//! The sliding-window counter: this window's count plus the previous
//! window's, weighted by its overlap with the trailing window.

use std::time::Duration;

use super::nanos;
use crate::types::Decision;

/// Sliding window counter: current count plus the previous window's count
/// weighted by its remaining overlap with the trailing window.
pub(super) fn sliding_window(
    curr: &mut u64,
    prev: u64,
    into: u128,
    w: u128,
    limit: u64,
    cost: u64,
) -> Decision {
    // estimate = prev * (w - into) / w + curr, kept exact in units of 1/w.
    let weighted = u128::from(prev) * (w - into);
    let est_w = weighted + u128::from(*curr) * w;
    let allowed = est_w + u128::from(cost) * w <= u128::from(limit) * w;
    if allowed {
        *curr += cost;
    }
    let est_w = weighted + u128::from(*curr) * w;
    let remaining = (u128::from(limit) * w).saturating_sub(est_w) / w;
    let to_end = w - into;
    let retry_after = if allowed {
        Duration::ZERO
    } else if cost <= limit.saturating_sub(*curr) {
        // Within this window, once the previous window's weight drops
        // enough: prev * (w - x) / w <= limit - curr - cost.
        let room = u128::from(limit - *curr - cost) * w;
        let x = w - room / u128::from(prev.max(1));
        nanos(x.saturating_sub(into).max(1)).max(Duration::from_millis(1))
    } else {
        // In the next window this window's count becomes the weighted one.
        let room = u128::from(limit - cost) * w;
        let x = w - room / u128::from((*curr).max(1));
        nanos(to_end + x).max(Duration::from_millis(1))
    };
    let reset_after = if *curr > 0 {
        nanos(to_end + w)
    } else if prev > 0 {
        nanos(to_end)
    } else {
        Duration::ZERO
    };
    Decision {
        allowed,
        remaining: remaining as u64,
        retry_after,
        reset_after,
    }
}
