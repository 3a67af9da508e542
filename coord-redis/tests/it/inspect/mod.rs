//! Holder metadata and inspection on Redis, beyond the shared cases: where
//! the metadata lives (in the claim's own value, or the PHP layout's
//! grant key; a semaphore grant's holder entry), that it ends with its
//! grant (release, expiry, force release; the key count comes back), that
//! extend keeps it exactly as long as the claim, that a retry by the
//! holder never replaces it, that no key is written for it, that foreign
//! values are store errors that never show them, that the request and
//! server command counts of a cycle without metadata did not change (and
//! one with it costs no more), and the shared inspect cases in the PHP
//! layout.
//!
//! This file holds the helpers the files below share (backends, reading
//! keys and their expiry) and runs the shared inspect cases in the PHP
//! layout (`php_layout`).

use crate::common;
use std::time::Duration;

use common::SEC;
use conformance::testkit::redis::{self as kit, RedisServer};
use coord_core::PermitRequest;
use coord_core::inspect::ClaimRecord;
use coord_redis::{Layout, RedisBackend, RedisOptions};
use tokio::time::sleep;

mod costs;
mod lock_metadata;
mod php_grant_key;
mod semaphore_holders;

/// The semaphore trait, out of scope for method calls (its methods share
/// names with `Lock`'s): called as `sem::Sem::release(&b, ...)`.
mod sem {
    pub use coord_core::Semaphore as Sem;
}

const MS: Duration = Duration::from_millis(1);

async fn backend_on(url: &str, layout: Layout) -> RedisBackend {
    RedisBackend::connect(RedisOptions::new(url).layout(layout))
        .await
        .expect("connect to the test redis-server")
}

fn dbsize(server: &RedisServer) -> i64 {
    server.command(&["DBSIZE"]).as_int().unwrap()
}

/// The key count, once Redis has reclaimed the keys that expired (an
/// expired key is gone for every reader at once, but `DBSIZE` counts it
/// until the server's expiry cycle removes it): polls up to 3 s for `want`.
async fn dbsize_settles_at(server: &RedisServer, want: i64) -> i64 {
    let deadline = std::time::Instant::now() + 3 * SEC;
    loop {
        let n = dbsize(server);
        if n == want || std::time::Instant::now() > deadline {
            return n;
        }
        sleep(Duration::from_millis(20)).await;
    }
}

fn get(server: &RedisServer, key: &str) -> Option<String> {
    server.command(&["GET", key]).as_str().map(str::to_string)
}

fn pttl(server: &RedisServer, key: &str) -> i64 {
    server.command(&["PTTL", key]).as_int().unwrap()
}

fn one_holder(r: &ClaimRecord) -> &coord_core::inspect::HolderRecord {
    assert_eq!(r.holders.len(), 1, "expected one holder");
    &r.holders[0]
}

fn req(permits: u32, total: u32, ttl: Duration, queue: bool) -> PermitRequest {
    PermitRequest {
        permits,
        total,
        ttl,
        queue,
    }
}

async fn php_coord() -> coord_core::Coord {
    RedisBackend::connect(RedisOptions::new(&kit::url()).layout(Layout::Php))
        .await
        .expect("connect")
        .into_coord()
}

/// The shared inspect cases in the PHP layout too.
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
    inspect_lock_shows_the_holder_and_its_metadata,
    inspect_semaphore_lists_each_grant,
    inspect_lease_shows_the_holder,
    inspect_oversized_metadata_is_rejected_and_writes_nothing,
);
