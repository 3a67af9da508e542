//! Work queues on the real server: what they leave in the store (nothing
//! once a queue is acked or purged and its dedup ids expired), pops that
//! find nothing write nothing, payloads as they are, wake-ups from other
//! clients, the exact delivery order against a model of the rule,
//! messages and tokens through a crash, and the upgrade of a layout 7
//! schema. The cases run one after the other (one counts transaction ids
//! server-wide, one crashes the cluster).
//!
//! This file holds the helpers the files below share: clients on schemas
//! of their own, counting a queue's rows, messages.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use coord_core::NewMessage;
use coord_postgres::PostgresBackend;

mod crash;
mod deliveries;
mod rows_left;
mod wakeups;

const LONG: Duration = Duration::from_secs(60);

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A client on a schema of its own (so its rows can be counted), without
/// the background sweep.
async fn backend(url: &str, schema: &str, grace: Duration) -> Arc<PostgresBackend> {
    coord_postgres::builder(url)
        .schema(schema)
        .idle_grace(grace)
        .sweep_every(None)
        .connect_backend()
        .await
        .expect("connect to the test cluster")
}

/// Rows of (queue_messages, queue_groups, queue_dedup).
async fn rows(b: &PostgresBackend) -> [i64; 3] {
    let c = b.pool().get().await.unwrap();
    let s = b.schema();
    let row = c
        .query_one(
            &format!(
                "SELECT (SELECT count(*) FROM \"{s}\".queue_messages), \
                        (SELECT count(*) FROM \"{s}\".queue_groups), \
                        (SELECT count(*) FROM \"{s}\".queue_dedup)"
            ),
            &[],
        )
        .await
        .unwrap();
    [row.get(0), row.get(1), row.get(2)]
}

fn msg<'a>(payload: &'a [u8], group: Option<&'a str>) -> NewMessage<'a> {
    NewMessage::new(payload).in_group(group)
}
