//! The semaphore grant rule, for backend authors: one rule for every
//! store that decides grants in Rust (the Lua and SQL of other stores
//! follow it too).
//!
//! Waiters are served in arrival order and nobody overtakes: a request is
//! granted when it and every request queued ahead of it fit into the free
//! permits together ([`admits`]). So a release lets in the longest prefix
//! of the queue that fits ([`grantable`]), possibly several waiters at
//! once, and a large request at the head holds up smaller ones behind it
//! until it fits.
//!
//! ```
//! use coord_core::permits::{admits, free, grantable};
//!
//! let free = free(5, [2, 1]); // 5 permits, 3 held
//! assert_eq!(free, 2);
//! assert!(admits(free, 1, 1)); // 1 queued ahead, 1 asked: 2 fit
//! assert!(!admits(free, 1, 2));
//! // A release wakes the waiters at the head that fit together.
//! assert_eq!(grantable(free, [("a", 1), ("b", 1), ("c", 1)]), ["a", "b"]);
//! assert_eq!(grantable(free, [("big", 3), ("small", 1)]), Vec::<&str>::new());
//! ```

/// The permits free out of `total` with `held` granted (none below zero).
pub fn free(total: u32, held: impl IntoIterator<Item = u32>) -> u32 {
    let held = held.into_iter().fold(0u32, u32::saturating_add);
    total.saturating_sub(held)
}

/// Whether a request for `permits` is granted now, with `ahead` permits
/// asked by the waiters queued before it and `free` permits free.
pub fn admits(free: u32, ahead: u32, permits: u32) -> bool {
    u64::from(ahead) + u64::from(permits) <= u64::from(free)
}

/// The waiters of `queue` (in arrival order, each with the permits it
/// asks) that can be granted now with `free` permits free: the longest
/// prefix of the queue whose requests fit together.
pub fn grantable<T>(free: u32, queue: impl IntoIterator<Item = (T, u32)>) -> Vec<T> {
    let mut ahead = 0u64;
    let mut out = Vec::new();
    for (who, permits) in queue {
        ahead += u64::from(permits);
        if ahead > u64::from(free) {
            break;
        }
        out.push(who);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_behind_one_that_does_not_fit_waits_even_if_it_would_fit() {
        assert_eq!(grantable(2, [(1, 3), (2, 1)]), Vec::<i32>::new());
        assert_eq!(grantable(3, [(1, 3), (2, 1)]), vec![1]);
        assert_eq!(grantable(4, [(1, 3), (2, 1)]), vec![1, 2]);
    }

    #[test]
    fn sums_never_overflow() {
        assert_eq!(free(u32::MAX, [u32::MAX, u32::MAX]), 0);
        assert!(!admits(u32::MAX, u32::MAX, 1));
        assert_eq!(grantable(u32::MAX, [(1, u32::MAX), (2, 1)]), vec![1]);
    }
}
