//! Input validation, done once here before any I/O (docs/guarantees.md §3).

use std::time::Duration;

use crate::error::{Error, Result};
use crate::types::{Capabilities, Quota};

/// Longest accepted name, in bytes.
pub const MAX_NAME_BYTES: usize = 512;
/// Longest accepted TTL.
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Check a name (lock, lease, election, barrier, limiter key, fencing
/// resource, candidate, participant): UTF-8, 1..=512 bytes, no control
/// characters. Everything else (spaces, quotes, braces, `*`, unicode, SQL)
/// is an ordinary name.
pub fn name(field: &'static str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if value.len() > MAX_NAME_BYTES {
        return Err(Error::invalid(
            field,
            format!(
                "is {} bytes long; at most {MAX_NAME_BYTES} bytes are allowed",
                value.len()
            ),
        ));
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(Error::invalid(
            field,
            format!("contains the control character {c:?}; control characters are not allowed"),
        ));
    }
    Ok(())
}

/// The smallest TTL whose guard is usable: after the drift margin
/// ([`drift`](crate::drift): 1 % + 2 ms) is taken off, at least half of it
/// is left as validity. Below it a guard would be invalid at birth, or
/// nearly so.
pub const MIN_USABLE_TTL: Duration = Duration::from_millis(5);

/// The smallest TTL this backend accepts for a claim (lock, lease,
/// leadership): [`MIN_USABLE_TTL`] and the backend's minimum, rounded up
/// to its granularity.
pub fn min_usable_ttl(caps: &Capabilities) -> Duration {
    round_up(MIN_USABLE_TTL.max(caps.min_ttl), caps.ttl_granularity)
}

fn round_up(t: Duration, granularity: Duration) -> Duration {
    let g = granularity.as_nanos();
    if g <= 1 {
        return t;
    }
    let rounded = t.as_nanos().div_ceil(g) * g;
    Duration::from_nanos(rounded.min(u64::MAX as u128) as u64)
}

/// Check a TTL against the backend's capabilities and return it rounded UP
/// to the backend's granularity and minimum (never down).
///
/// A TTL that would still leave a guard (almost) no validity after the
/// drift margin, i.e. below [`min_usable_ttl`] once rounded, is
/// [`Error::InvalidArgument`] naming the smallest usable TTL.
pub fn ttl(field: &'static str, ttl: Duration, caps: &Capabilities) -> Result<Duration> {
    if ttl.is_zero() {
        return Err(Error::invalid(field, "must be greater than zero"));
    }
    if ttl > MAX_TTL {
        return Err(Error::invalid(
            field,
            format!("is {ttl:?}; at most one year ({MAX_TTL:?}) is allowed"),
        ));
    }
    let t = round_up(ttl.max(caps.min_ttl), caps.ttl_granularity);
    let usable = min_usable_ttl(caps);
    if t < usable {
        return Err(Error::invalid(
            field,
            format!(
                "is {ttl:?}; a guard needs at least {usable:?} on the {} backend \
                 (the drift margin of 1 % + 2 ms would leave it invalid at birth)",
                caps.backend
            ),
        ));
    }
    Ok(t)
}

/// Check a quota: limit >= 1, window > 0 (and at most a year).
pub fn quota(q: &Quota) -> Result<()> {
    if q.limit == 0 {
        return Err(Error::invalid("limit", "must be at least 1"));
    }
    if q.window.is_zero() {
        return Err(Error::invalid("window", "must be greater than zero"));
    }
    if q.window > MAX_TTL {
        return Err(Error::invalid("window", "at most one year is allowed"));
    }
    if q.window < Duration::from_millis(1) {
        return Err(Error::invalid("window", "must be at least 1 ms"));
    }
    Ok(())
}

/// Check a cost against a quota: cost >= 1, and cost <= limit (a cost above
/// the limit could never be admitted, so it is refused outright rather than
/// retried forever).
pub fn cost(q: &Quota, cost: u64) -> Result<()> {
    if cost == 0 {
        return Err(Error::invalid("cost", "must be at least 1"));
    }
    if cost > q.limit {
        return Err(Error::invalid(
            "cost",
            format!(
                "{cost} exceeds the quota's limit of {}; such a request can never be admitted",
                q.limit
            ),
        ));
    }
    Ok(())
}

/// The largest `permits_total` a semaphore may have: every store can keep
/// one record per holder, and a holder takes at least one permit, so this
/// bounds what a name can cost in the store.
///
/// ```
/// use coord_core::validate::{MAX_PERMITS, permits};
/// assert!(permits(1, MAX_PERMITS).is_ok());
/// assert!(permits(1, MAX_PERMITS + 1).is_err());
/// ```
pub const MAX_PERMITS: u32 = 1_000_000;

/// Check a semaphore request: `1 <= permits <= permits_total <=`
/// [`MAX_PERMITS`]. More permits than the total could never be granted, so
/// such a request is refused outright rather than waited on for ever.
///
/// ```
/// use coord_core::{Error, validate::permits};
/// assert!(permits(2, 4).is_ok());
/// assert!(matches!(permits(5, 4), Err(Error::InvalidArgument { field: "permits", .. })));
/// assert!(matches!(permits(1, 0), Err(Error::InvalidArgument { field: "permits_total", .. })));
/// ```
pub fn permits(permits: u32, permits_total: u32) -> Result<()> {
    if permits_total == 0 {
        return Err(Error::invalid("permits_total", "must be at least 1"));
    }
    if permits_total > MAX_PERMITS {
        return Err(Error::invalid(
            "permits_total",
            format!("is {permits_total}; at most {MAX_PERMITS} permits are allowed"),
        ));
    }
    if permits == 0 {
        return Err(Error::invalid("permits", "must be at least 1"));
    }
    if permits > permits_total {
        return Err(Error::invalid(
            "permits",
            format!(
                "{permits} exceeds permits_total {permits_total}; such a request can never be granted"
            ),
        ));
    }
    Ok(())
}

/// Check a barrier's party count.
pub fn parties(parties: u32) -> Result<()> {
    if parties == 0 {
        return Err(Error::invalid("parties", "must be at least 1"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Algorithm;

    #[test]
    fn names() {
        assert!(name("name", "").is_err());
        assert!(name("name", &"a".repeat(512)).is_ok());
        assert!(name("name", &"a".repeat(513)).is_err());
        assert!(name("name", "a\nb").is_err());
        assert!(name("name", "a\u{7f}").is_err());
        for ok in ["with space", "'; DROP TABLE x; --", "{tag}", "*", "ünï🦀"] {
            assert!(name("name", ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn ttls_round_up_never_down() {
        let mut caps = Capabilities::new("t");
        caps.min_ttl = Duration::from_secs(1);
        caps.ttl_granularity = Duration::from_secs(1);
        assert!(ttl("ttl", Duration::ZERO, &caps).is_err());
        assert!(ttl("ttl", MAX_TTL + Duration::from_secs(1), &caps).is_err());
        assert_eq!(
            ttl("ttl", Duration::from_millis(10), &caps).unwrap(),
            Duration::from_secs(1)
        );
        assert_eq!(
            ttl("ttl", Duration::from_millis(1500), &caps).unwrap(),
            Duration::from_secs(2)
        );
        assert_eq!(ttl("ttl", MAX_TTL, &caps).unwrap(), MAX_TTL);
    }

    #[test]
    fn the_longest_ttl_is_one_year() {
        let caps = Capabilities::new("t");
        let year = Duration::from_secs(365 * 86_400);
        assert_eq!(MAX_TTL, year);
        assert!(ttl("ttl", year, &caps).is_ok());
        assert!(ttl("ttl", year + Duration::from_millis(1), &caps).is_err());
        let q = Quota::new(10, year, Algorithm::FixedWindow);
        assert!(quota(&q).is_ok(), "a one-year window is allowed");
        let longer = Quota {
            window: year + Duration::from_millis(1),
            ..q
        };
        assert!(quota(&longer).is_err(), "a window over a year is refused");
    }

    #[test]
    fn quotas_and_costs() {
        let q = Quota::new(10, Duration::from_secs(1), Algorithm::Gcra);
        assert!(quota(&q).is_ok());
        assert!(quota(&Quota { limit: 0, ..q }).is_err());
        assert!(
            quota(&Quota {
                window: Duration::ZERO,
                ..q
            })
            .is_err()
        );
        assert!(cost(&q, 0).is_err());
        assert!(cost(&q, 10).is_ok());
        let e = cost(&q, 11).unwrap_err();
        assert!(e.to_string().contains("never be admitted"));
        assert!(parties(0).is_err());
        assert!(parties(1).is_ok());
    }

    #[test]
    fn semaphore_permits() {
        let field = |r: Result<()>| match r {
            Err(Error::InvalidArgument { field, .. }) => field,
            other => panic!("expected InvalidArgument, got {other:?}"),
        };
        assert!(permits(1, 1).is_ok());
        assert!(permits(MAX_PERMITS, MAX_PERMITS).is_ok());
        assert_eq!(field(permits(1, 0)), "permits_total");
        assert_eq!(field(permits(1, MAX_PERMITS + 1)), "permits_total");
        assert_eq!(field(permits(0, 3)), "permits");
        assert_eq!(field(permits(4, 3)), "permits");
        let e = permits(4, 3).unwrap_err();
        assert!(e.to_string().contains("never be granted"), "{e}");
    }
}
