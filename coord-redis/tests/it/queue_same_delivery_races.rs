//! Concurrent calls on ONE delivery (or of one consumer) of the Redis work
//! queue through ONE client, through the raw `coord_core::Queue` trait: an
//! ack racing an extend, an ack racing a nack, two acks, a nack (with and
//! without a delay) racing an extend, pops of one consumer racing, an ack
//! racing the owner's next pop in an ordered group. The scenarios are
//! `conformance::queue_race`'s (where each says what it checks); here what
//! the store holds is read with `peek` (both lanes) and `stats`. Every
//! step is one script on the server and the client keeps no record of its
//! deliveries, so these guard the contract against a change that would
//! break it.

use std::sync::Arc;

use conformance::queue_race::{Env, PeekProbe, Q};
use conformance::testkit::redis as kit;
use coord_redis::{RedisBackend, RedisOptions};

async fn client(prefix: &str) -> Q {
    let b = RedisBackend::connect(RedisOptions::new(&kit::url()).prefix(prefix))
        .await
        .expect("connect to the test redis-server");
    Arc::new(b)
}

async fn env(tag: &str) -> Env {
    let p = format!("{}:", conformance::unique(tag));
    let c2 = client(&p).await;
    Env {
        c: client(&p).await,
        c0: client(&p).await,
        probe: Box::new(PeekProbe(c2.clone())),
        c2,
    }
}

conformance::queue_race_tests!(env);
