//! Whoever wakes from `lost()` sees the lost token cancelled, however the
//! loss was noticed and however slow the log sink is.
//!
//! Found by CI (the conformance case `queue_stale_consumer_is_refused_and_fenced_out`
//! on Redis, 1 run in many): the deadline timer that `lost_token()` starts
//! and the caller's own `lost()` both notice the deadline. The first one to
//! set the lost flag logs the loss and then cancels the token; the second
//! found the flag already set and returned at once, before the token was
//! cancelled. A subscriber that takes a while per event (a file or network
//! log sink) widens that window; this test installs one on every thread of
//! its runtime (not process-wide: the other tests of the binary keep their
//! speed) so the race shows every time it exists.

use std::time::Duration;

use coord_memory::MemoryBackend;
use tracing::{Dispatch, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

use crate::support::scoped_tracing;

/// A log sink that takes 20 ms per event.
struct SlowSink;

impl<S: Subscriber> Layer<S> for SlowSink {
    fn on_event(&self, _event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn whoever_wakes_from_lost_sees_the_token_cancelled() {
    let slow = Dispatch::new(tracing_subscriber::registry().with(SlowSink));
    let runtime = scoped_tracing::runtime_with(&slow, 2);
    tracing::dispatcher::with_default(&slow, || runtime.block_on(lapses_cancel_the_token_first()));
}

async fn lapses_cancel_the_token_first() {
    let coord = MemoryBackend::coord();
    let locks = coord.locks().unwrap();
    let mut late = 0;
    for i in 0..20 {
        let g = locks
            .acquire(&format!("l{i}"), Duration::from_millis(30), Duration::ZERO)
            .await
            .unwrap();
        // Starts the deadline timer task; then this task waits on its own
        // `lost()`, so two waiters notice the same deadline.
        let token = g.lost_token();
        tokio::time::timeout(Duration::from_secs(5), g.lost())
            .await
            .expect("the lost signal of a lapsed lock fired");
        if !token.is_cancelled() {
            late += 1;
        }
        assert!(!g.is_valid());
    }
    assert_eq!(
        late, 0,
        "lost() returned before the lost token was cancelled in {late} of 20 lapses"
    );
}
