//! Metrics, through the [`metrics`](https://docs.rs/metrics) crate's facade:
//! coord records them, and whichever recorder the application installed
//! (a Prometheus exporter, StatsD, none) receives them. Without a recorder
//! they cost almost nothing. coord chooses no exporter.
//!
//! Every metric carries `store` (the backend: `memory`, `redis`, `etcd`,
//! `postgres`) and, for claims, `kind` (`lock`, `lease`, `leadership`,
//! `permit`, `delivery`: a queue message in flight).
//! Owner tokens and passwords are never labels, and names are not either
//! (they would make the label set unbounded), with one exception: the
//! `queue` of `coord_queue_messages`, set only for the queues the
//! application samples.
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `coord_acquire_total` | counter | store, kind, outcome | acquire / grant / campaign calls by outcome: `granted`, `timeout` (not granted within the wait), `error` |
//! | `coord_acquire_wait_seconds` | histogram | store, kind | from the call to the grant, for granted ones |
//! | `coord_handoffs_total` | counter | store, kind | grants that came after waiting (at least one refused attempt) |
//! | `coord_hold_seconds` | histogram | store, kind | from the grant to the release (explicit or on drop) |
//! | `coord_lost_total` | counter | store, kind | ownership lost (the [`lost`](crate::Guard::lost) signal fired) |
//! | `coord_watchdog_renewals_total` | counter | store, kind, outcome | watchdog renewals: `ok`, `failed` (each failed try) |
//! | `coord_limiter_checks_total` | counter | store, outcome | rate-limit checks: `allowed`, `denied` |
//! | `coord_queue_ops_total` | counter | store, op | queue messages `push`ed, `deliver`ed, `ack`ed, `nack`ed |
//! | `coord_store_errors_total` | counter | store, kind | errors from the store by [`Error`] kind: `unavailable`, `store`, …; once per operation that returned one (acquires, extends, releases, inspects, force releases, fencing tokens, leader reads, barrier waits, limiter checks, every queue call), once per failed renewal of a watchdog or read of an election's observer, and once per release on drop that failed after its resends |
//! | `coord_cleanup_failures_total` | counter | store, what | a cleanup in the background that still failed after its resends, by what it undid: `end_claim` (a release, or leaving a queue, after a failed, timed-out or dropped call, and a release on drop), `barrier_withdraw` (a participant of a wait that ended without passing), `queue_give_back` (a delivery whose pop was dropped); what it would have removed ends with its TTL. The operation's own error, if any, is counted once in `coord_store_errors_total` |
//! | `coord_reconnects_total` | counter | store, what | a backend's connection or subscription re-established |
//! | `coord_held` | gauge | store, kind | claims this process holds now: guards granted and neither released, dropped nor found lost |
//! | `coord_waiting` | gauge | store, kind | acquires (and blocked queue pops, kind `delivery`) of this process waiting now, from their first refusal to their end |
//! | `coord_queue_messages` | gauge | store, queue, state | a queue's messages by state (`ready`, `delayed`, `in_flight`, `dead`), as the last [`Queues::stats`](crate::Queues::stats) of this process read them: sample by calling it (from a timer) for the queues to watch, no scan runs otherwise. The only metric labelled with a name: only the queues sampled get one |
//!
//! `coord_queue_ops_total` counts `give_back` too: a delivery whose guard
//! was dropped without ack or nack, given back for another consumer.
//!
//! ```
//! // With any recorder installed (here none), the calls are no-ops.
//! coord_core::metrics::reconnect("redis", "subscriber");
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::error::Error;
use crate::queue_backend::QueueStats;

/// One unit of a gauge: counted up when made, down once, at the first
/// [`Counted::end`] or when dropped.
pub(crate) struct Counted {
    gauge: metrics::Gauge,
    on: AtomicBool,
}

impl Counted {
    fn up(gauge: metrics::Gauge) -> Counted {
        gauge.increment(1.0);
        Counted {
            gauge,
            on: AtomicBool::new(true),
        }
    }

    /// `coord_held`: a claim granted to this process.
    pub(crate) fn held(store: &'static str, kind: &'static str) -> Counted {
        Counted::up(metrics::gauge!("coord_held", "store" => store, "kind" => kind))
    }

    /// `coord_waiting`: an acquire (or pop) of this process waiting.
    pub(crate) fn waiting(store: &'static str, kind: &'static str) -> Counted {
        Counted::up(metrics::gauge!("coord_waiting", "store" => store, "kind" => kind))
    }

    /// Count it down, once.
    pub(crate) fn end(&self) {
        if self.on.swap(false, Ordering::AcqRel) {
            self.gauge.decrement(1.0);
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.end();
    }
}

/// `coord_queue_messages`: `queue`'s counts as `stats` just read them.
pub(crate) fn queue_stats(store: &'static str, queue: &str, s: &QueueStats) {
    for (state, n) in [
        ("ready", s.ready),
        ("delayed", s.delayed),
        ("in_flight", s.in_flight),
        ("dead", s.dead),
    ] {
        metrics::gauge!("coord_queue_messages", "store" => store, "queue" => queue.to_string(), "state" => state)
            .set(n as f64);
    }
}

/// `coord_acquire_total`: one acquire, grant or campaign call ended.
pub(crate) fn acquire(store: &'static str, kind: &'static str, outcome: &'static str) {
    metrics::counter!("coord_acquire_total", "store" => store, "kind" => kind, "outcome" => outcome)
        .increment(1);
}

/// `coord_acquire_wait_seconds` and, after waiting, `coord_handoffs_total`.
pub(crate) fn granted(store: &'static str, kind: &'static str, waited: Duration, after_wait: bool) {
    acquire(store, kind, "granted");
    metrics::histogram!("coord_acquire_wait_seconds", "store" => store, "kind" => kind)
        .record(waited.as_secs_f64());
    if after_wait {
        metrics::counter!("coord_handoffs_total", "store" => store, "kind" => kind).increment(1);
    }
}

/// `coord_hold_seconds`: a claim was released after `held`.
pub(crate) fn released(store: &'static str, kind: &'static str, held: Duration) {
    metrics::histogram!("coord_hold_seconds", "store" => store, "kind" => kind)
        .record(held.as_secs_f64());
}

/// `coord_lost_total`.
pub(crate) fn lost(store: &'static str, kind: &'static str) {
    metrics::counter!("coord_lost_total", "store" => store, "kind" => kind).increment(1);
}

/// `coord_watchdog_renewals_total`.
pub(crate) fn renewal(store: &'static str, kind: &'static str, ok: bool) {
    let outcome = if ok { "ok" } else { "failed" };
    metrics::counter!("coord_watchdog_renewals_total", "store" => store, "kind" => kind, "outcome" => outcome)
        .increment(1);
}

/// `coord_limiter_checks_total`.
pub(crate) fn limiter_check(store: &'static str, allowed: bool) {
    let outcome = if allowed { "allowed" } else { "denied" };
    metrics::counter!("coord_limiter_checks_total", "store" => store, "outcome" => outcome)
        .increment(1);
}

/// `coord_queue_ops_total`: a queue message was pushed, delivered, acked
/// or nacked (`op`).
pub(crate) fn queue_op(store: &'static str, op: &'static str) {
    metrics::counter!("coord_queue_ops_total", "store" => store, "op" => op).increment(1);
}

/// `coord_store_errors_total`, for an error that came from (or on the way
/// to) the store; bad input and timeouts of a wait are not store errors.
pub(crate) fn error(store: &'static str, e: &Error) {
    let kind = match e {
        Error::Unavailable { .. } => "unavailable",
        Error::Store { .. } => "store",
        Error::Lost { .. } | Error::ArrivalLost { .. } => "lost",
        Error::Config(_) => "config",
        Error::Unsupported { .. } => "unsupported",
        Error::InvalidArgument { .. }
        | Error::Timeout { .. }
        | Error::NotHeld { .. }
        | Error::Payload { .. } => return,
    };
    metrics::counter!("coord_store_errors_total", "store" => store, "kind" => kind).increment(1);
}

/// `coord_cleanup_failures_total`: a background cleanup (`what`) gave up.
pub(crate) fn cleanup_failed(store: &'static str, what: &'static str) {
    metrics::counter!("coord_cleanup_failures_total", "store" => store, "what" => what)
        .increment(1);
}

/// Record the outcome of a store call: an error is counted by kind.
pub(crate) fn observe<T>(store: &'static str, r: &crate::Result<T>) {
    if let Err(e) = r {
        error(store, e);
    }
}

/// `coord_reconnects_total`: a backend re-established `what` (its
/// connection, its subscription, a watch) after losing it. For backends.
pub fn reconnect(store: &'static str, what: &'static str) {
    metrics::counter!("coord_reconnects_total", "store" => store, "what" => what).increment(1);
}
