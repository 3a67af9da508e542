//! GCRA (the generic cell rate algorithm): a theoretical arrival time,
//! in exact integer units.

use std::time::Duration;

use super::nanos;
use crate::types::Decision;

/// GCRA in units of nanoseconds x limit, so the emission interval
/// (window / limit) is exact. Bursts of up to `limit`.
pub(super) fn gcra(tat: &mut u128, since: u128, w: u128, limit: u64, cost: u64) -> Decision {
    let l = u128::from(limit);
    let now = since * l;
    let window = w * l;
    let increment = u128::from(cost) * w;
    let new_tat = (*tat).max(now) + increment;
    let allowed = new_tat - now <= window;
    if allowed {
        *tat = new_tat;
    }
    let backlog = (*tat).max(now) - now;
    let remaining = (window - backlog.min(window)) / w;
    let retry_after = if allowed {
        Duration::ZERO
    } else {
        nanos((new_tat - now - window).div_ceil(l)).max(Duration::from_millis(1))
    };
    Decision {
        allowed,
        remaining: remaining as u64,
        retry_after,
        reset_after: nanos(backlog.div_ceil(l)),
    }
}
