//! One store call made as an operation of the API (an inspect, a fencing
//! token, a queue's stats, ...): it runs in its own span, whose `outcome`
//! it records, and a store error it returns is counted once
//! (`coord_store_errors_total`). Spans are made here, in core, never by
//! the backends, and carry the store (`store`, as the metrics label it), the `name` acted on and
//! the `outcome`: never an owner token, a payload or metadata.

use std::future::Future;

use tracing::Instrument;

use crate::error::Result;
use crate::metrics;

/// `op!("coord.lock.inspect", store, name, future)` runs `future` in a
/// debug span of that name with `store`, `name` and `outcome`
/// (`ok`, or `error`); `op!(..., future, |value| "outcome")` names the
/// outcome of a success.
macro_rules! op {
    ($span:literal, $store:expr, $name:expr, $fut:expr) => {
        op!($span, $store, $name, $fut, |_| "ok")
    };
    ($span:literal, $store:expr, $name:expr, $fut:expr, $ok:expr) => {{
        let store: &'static str = $store;
        let span = tracing::debug_span!(
            $span,
            store = store,
            name = $name,
            outcome = tracing::field::Empty
        );
        $crate::op::run(store, span, $fut, $ok).await
    }};
}

/// Run `fut` in `span` (which has an empty `outcome` field), record the
/// outcome (`ok(value)` on success, `error` otherwise) and count a store
/// error once.
pub(crate) async fn run<T, F>(
    store: &'static str,
    span: tracing::Span,
    fut: F,
    ok: impl FnOnce(&T) -> &'static str,
) -> Result<T>
where
    F: Future<Output = Result<T>>,
{
    let r = fut.instrument(span.clone()).await;
    span.record(
        "outcome",
        match &r {
            Ok(v) => ok(v),
            Err(_) => "error",
        },
    );
    metrics::observe(store, &r);
    r
}
