//! The process's stamps (re-exported as `late::stamp`): kept apart from
//! `late` so that owner tokens (`types`) can carry one without `types`
//! and `late` importing each other.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A stamp for this process's attempts and releases: the wall clock in
/// µs since the Unix epoch, but strictly above every earlier stamp of the
/// process (so it rises even if the clock steps back).
pub fn stamp() -> i64 {
    static LAST: AtomicI64 = AtomicI64::new(0);
    if let Some(s) = crate::rng::seeded_stamp() {
        return s;
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    let mut prev = LAST.load(Ordering::Relaxed);
    loop {
        let next = now.max(prev.saturating_add(1));
        match LAST.compare_exchange_weak(prev, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(p) => prev = p,
        }
    }
}
