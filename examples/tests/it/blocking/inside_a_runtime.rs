//! The blocking API inside an async runtime: calls are refused with a
//! clear error, and a guard dropped there is released in the background.

use coord::Error;
use coord::blocking::*;

use super::{S, eventually, memory};

fn is_runtime_refusal(e: &Error) -> bool {
    matches!(e, Error::InvalidArgument { field: "runtime", reason }
        if reason.contains("Use the async API inside a runtime"))
}

#[test]
fn calls_inside_a_runtime_are_refused_with_a_clear_error() {
    let outside = memory();
    let locks = outside.locks().unwrap();
    let mut held = locks.try_acquire("blk-in-rt", 60 * S).unwrap().unwrap();
    for multi_thread in [false, true] {
        let rt = if multi_thread {
            tokio::runtime::Builder::new_multi_thread()
        } else {
            tokio::runtime::Builder::new_current_thread()
        }
        .enable_all()
        .build()
        .unwrap();
        rt.block_on(async {
            let e = connect("memory://").unwrap_err();
            assert!(is_runtime_refusal(&e), "{e}");
            let e = locks.try_acquire("blk-in-rt-2", 60 * S).unwrap_err();
            assert!(is_runtime_refusal(&e), "{e}");
            let e = held.extend(60 * S).unwrap_err();
            assert!(is_runtime_refusal(&e), "{e}");
            let e = outside.queues().unwrap().stats("blk-in-rt").unwrap_err();
            assert!(is_runtime_refusal(&e), "{e}");
            let mut changes = outside.elections().unwrap().observe("blk-in-rt").unwrap();
            assert!(is_runtime_refusal(&changes.next().unwrap().unwrap_err()));
            // What does not wait works anywhere.
            held.keep_alive();
            assert!(held.has_watchdog() && held.is_valid());
        });
    }
    // Nothing was done: the lock stayed free, the guard held.
    assert!(locks.try_acquire("blk-in-rt-2", 60 * S).unwrap().is_some());
    held.extend(60 * S).unwrap();
    held.release().unwrap();
}

#[test]
fn a_guard_dropped_inside_a_runtime_is_released_in_the_background() {
    let (a, b) = (memory(), memory());
    let g = a
        .locks()
        .unwrap()
        .try_acquire("blk-drop-in-rt", 60 * S)
        .unwrap()
        .unwrap();
    let g2 = a
        .locks()
        .unwrap()
        .try_acquire("blk-release-in-rt", 60 * S)
        .unwrap()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        drop(g);
        let e = g2.release().unwrap_err();
        assert!(is_runtime_refusal(&e), "{e}");
    });
    let other = b.locks().unwrap();
    for name in ["blk-drop-in-rt", "blk-release-in-rt"] {
        assert!(
            eventually(5 * S, || other.try_acquire(name, 60 * S).unwrap().is_some()),
            "{name} stayed held"
        );
    }
    // The client's last handle, dropped inside a runtime: its runtime
    // stops without waiting for its thread, and without a panic.
    rt.block_on(async move { drop(a) });
}
