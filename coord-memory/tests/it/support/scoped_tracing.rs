//! A `tracing` subscriber for one test's threads, in a binary whose other
//! tests run beside it.
//!
//! tracing caches each callsite's interest for the whole process. While
//! only one dispatcher is registered, tracing-core asks a callsite reached
//! for the first time only of the default of the thread that reached it: a
//! callsite first reached by another test's thread would be cached as of
//! no interest, and the test's own subscriber would miss its spans and
//! events. [`ask_every_dispatcher`] keeps a second, no-op dispatcher (the
//! global default, which records nothing) registered for good, so every
//! callsite's interest is asked of every registered dispatcher, the test's
//! own included.

use std::cell::RefCell;

use tracing::Dispatch;
use tracing::dispatcher::DefaultGuard;

/// Register the no-op global default (once per process; later calls do
/// nothing). Call before installing a thread's own subscriber.
pub fn ask_every_dispatcher() {
    let _ = tracing::subscriber::set_global_default(tracing::subscriber::NoSubscriber::default());
}

thread_local! {
    static RUNTIME_THREAD_DEFAULT: RefCell<Option<DefaultGuard>> = const { RefCell::new(None) };
}

/// A multi-thread runtime whose every thread (workers and blocking pool)
/// has `dispatch` as its default subscriber; the thread that calls
/// `block_on` needs it too (`tracing::dispatcher::with_default`).
pub fn runtime_with(dispatch: &Dispatch, workers: usize) -> tokio::runtime::Runtime {
    ask_every_dispatcher();
    let dispatch = dispatch.clone();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .on_thread_start(move || {
            let guard = tracing::dispatcher::set_default(&dispatch);
            RUNTIME_THREAD_DEFAULT.with(|d| *d.borrow_mut() = Some(guard));
        })
        .on_thread_stop(|| {
            RUNTIME_THREAD_DEFAULT.with(|d| d.borrow_mut().take());
        })
        .build()
        .expect("a multi-thread runtime")
}
