//! The sliding log: an exact count of the cost admitted in the trailing
//! window, one entry per admitted request.

use std::collections::VecDeque;
use std::time::Duration;

use super::nanos;
use crate::types::Decision;

/// Exact sliding log of (time, cost) entries, one per admitted request
/// (so time and memory grow with the number of requests, never with their
/// cost). The caller has dropped the entries past the retention window;
/// those older than `w` are kept (a larger quota may still count them) but
/// not counted here.
pub(super) fn sliding_log(
    log: &mut VecDeque<(u128, u64)>,
    now: u128,
    w: u128,
    limit: u64,
    cost: u64,
) -> Decision {
    let first = log.len() - log.iter().rev().take_while(|(t, _)| t + w > now).count();
    // Every entry was admitted within a limit, so the sum fits; saturate
    // anyway rather than trust it.
    let used: u64 = log
        .range(first..)
        .fold(0u64, |a, (_, c)| a.saturating_add(*c));
    if cost <= limit.saturating_sub(used) {
        log.push_back((now, cost));
        return Decision {
            allowed: true,
            remaining: limit - used - cost,
            retry_after: Duration::ZERO,
            reset_after: nanos(w),
        };
    }
    // Denied: wait until enough of the oldest entries fall out.
    let mut freed = 0u64;
    let mut retry_after = nanos(w);
    for (t, c) in log.range(first..) {
        freed = freed.saturating_add(*c);
        if cost <= limit.saturating_sub(used.saturating_sub(freed)) {
            retry_after = nanos((t + w).saturating_sub(now));
            break;
        }
    }
    let reset_after = log
        .back()
        .map_or(Duration::ZERO, |(t, _)| nanos((t + w).saturating_sub(now)));
    Decision {
        allowed: false,
        remaining: limit.saturating_sub(used),
        retry_after: retry_after.max(Duration::from_millis(1)),
        reset_after,
    }
}
