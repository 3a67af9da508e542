//! Redis semaphores under races: many clients with cancellations, lost
//! replies, cancelled queue heads, the total binding while only waiters
//! are queued, tokens across a restart without persistence, grant expiry
//! racing other attempts, names with braces, and a writer taking every
//! permit while readers stream in.
//!
//! This file holds the helpers the files below share: requests, attempts
//! and backends, reading the server's state, and a small PRNG.

use std::time::Duration;

use conformance::testkit::redis::RedisServer;
use coord_core::{Attempt, OwnerToken, PermitRequest, Semaphore};
use coord_redis::{RedisBackend, RedisOptions};

mod contention;
mod lost_replies;
mod lost_state;
mod queued_waiters;
mod reference_model;

const MS: Duration = Duration::from_millis(1);

fn req(permits: u32, total: u32, ttl: Duration, queue: bool) -> PermitRequest {
    PermitRequest {
        permits,
        total,
        ttl,
        queue,
    }
}

fn is_held(a: &Attempt) -> bool {
    matches!(a, Attempt::Held { .. })
}

/// `b.try_acquire` with everything owned or borrowed from outside (for
/// retry closures).
async fn att(
    b: &RedisBackend,
    name: &str,
    o: OwnerToken,
    r: PermitRequest,
) -> coord_core::Result<Attempt> {
    b.try_acquire(name, o.step(), &r).await
}

async fn backend(url: &str) -> RedisBackend {
    RedisBackend::connect(RedisOptions::new(url))
        .await
        .expect("connect")
}

fn hget(server: &RedisServer, key: &str, field: &str) -> Option<String> {
    server
        .command(&["HGET", key, field])
        .as_str()
        .map(str::to_string)
}

/// A tiny deterministic PRNG (no `rand` among the dev-dependencies).
struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
