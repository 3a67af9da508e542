//! Redis work queues beyond the shared cases: what stays in Redis (nothing
//! once acked or purged), the request count of an uncontended push, pop
//! and ack, binary payloads, names with braces, a pop woken by another
//! client's push (and no `PUBLISH` while nobody waits), fencing tokens and
//! ids after the server lost its data, a mass lapse larger than one step's
//! batch, lost keys, the delivery rule against a model of it, and some
//! shared queue cases in the PHP layout.
//!
//! This file holds the helpers the files below share and runs the shared
//! queue cases in the PHP layout (`php_layout`).

use std::time::Duration;

use conformance::testkit::redis::{self as kit};
use coord_core::{NewMessage, PopAttempt};
use coord_redis::{RedisBackend, RedisOptions};

mod deliveries;
mod keys;
mod requests_and_wakeups;

const MS: Duration = Duration::from_millis(1);
const LONG: Duration = Duration::from_secs(60);

async fn backend(url: &str) -> RedisBackend {
    RedisBackend::connect(RedisOptions::new(url))
        .await
        .expect("connect")
}

fn msg<'a>(payload: &'a [u8], group: Option<&'a str>) -> NewMessage<'a> {
    NewMessage::new(payload).in_group(group)
}

/// The id and token of a delivery; panics on an empty attempt.
fn delivered(a: PopAttempt) -> (coord_core::Message, u64) {
    match a {
        PopAttempt::Delivered { message, token } => (message, token.get()),
        other => panic!("expected a delivery, got {other:?}"),
    }
}

async fn php_coord() -> coord_core::Coord {
    RedisBackend::connect(RedisOptions::new(&kit::url()).layout(coord_redis::Layout::Php))
        .await
        .expect("connect")
        .into_coord()
}

/// Queues are offered in [`Layout::Php`](coord_redis::Layout::Php) too
/// (the PHP key names include no queue keys; they live under the prefix,
/// as leases do): some of the shared queue cases run there as well.
macro_rules! php_layout_cases {
    ($($case:ident),* $(,)?) => {
        mod php_layout {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let f = conformance::Factory::new(super::php_coord);
                    conformance::cases::$case(&f).await;
                }
            )*
        }
    };
}

php_layout_cases!(
    queue_stale_consumer_is_refused_and_fenced_out,
    queue_fifo_within_a_group_and_ordered_groups_one_at_a_time,
    queue_dead_letters_after_max_deliveries_and_redrive,
    queue_binary_payloads_round_trip,
    queue_blocked_pop_is_woken_by_a_push,
);
