//! The blocking API, called the way it is meant to be: from plain threads
//! with no runtime (`#[test]`, not `#[tokio::test]`).
//!
//! `memory://` is one store per process, shared by every test of this
//! binary: each test uses names of its own. These tests live beside the
//! example programs (not in the `coord` crate) because they call the API
//! only as a user's program does.
//!
//! This file holds the helpers the files below share.

use std::thread;
use std::time::{Duration, Instant};

use coord::blocking::*;

mod dropped_guards_and_watchdog;
mod inside_a_runtime;
mod locks_and_leadership;
mod other_primitives;

const S: Duration = Duration::from_secs(1);

fn memory() -> Coord {
    connect("memory://").expect("memory:// connects")
}

/// Whether `f` turns true within `within`, checked every 10 ms.
fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        thread::sleep(Duration::from_millis(10));
    }
}
