//! Concurrent calls on ONE delivery (or of one consumer) of the PostgreSQL
//! work queue through ONE client, through the raw `coord_core::Queue`
//! trait: an ack racing an extend, an ack racing a nack, two acks, a nack
//! (with and without a delay) racing an extend, pops of one consumer
//! racing, an ack racing the owner's next pop in an ordered group. The
//! scenarios are `conformance::queue_race`'s (where each says what it
//! checks); here what the store holds is read with `peek` (both lanes) and
//! `stats`. Every step is one statement that locks the rows it changes
//! and the client keeps no record of its deliveries, so these guard the
//! contract against a change that would break it.

use crate::support;
use conformance::queue_race::{Env, PeekProbe, Q};
use support::{direct, unique};

async fn env(tag: &str) -> Env {
    let schema = unique(tag);
    let c2: Q = direct(&schema).await;
    Env {
        c: direct(&schema).await,
        c0: direct(&schema).await,
        probe: Box::new(PeekProbe(c2.clone())),
        c2,
    }
}

conformance::queue_race_tests!(env);
