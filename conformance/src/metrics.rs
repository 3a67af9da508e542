//! Reading what coord recorded through `metrics`, for the backends' tests
//! that install `metrics_util`'s debugging recorder.

use metrics_util::debugging::{DebugValue, Snapshotter};

/// `coord_reconnects_total{store=<store>,what=<what>}` since the last
/// snapshot (the debugging recorder hands out increments since then).
/// Panics if the metric is not a counter.
pub fn reconnects(snapshotter: &Snapshotter, store: &str, what: &str) -> u64 {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, _, _, _)| {
            let has = |l: &str, v: &str| k.key().labels().any(|x| x.key() == l && x.value() == v);
            k.key().name() == "coord_reconnects_total" && has("store", store) && has("what", what)
        })
        .map(|(_, _, _, v)| match v {
            DebugValue::Counter(n) => n,
            other => panic!("not a counter: {other:?}"),
        })
        .sum()
}
