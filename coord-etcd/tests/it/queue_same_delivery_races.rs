//! Concurrent calls on ONE delivery (or of one consumer) of the etcd work
//! queue through ONE client, through the raw `coord_core::Queue` trait.
//! This happens in normal use: a watchdog (or a user's own task) extends a
//! delivery while the user acks or nacks it, a user retries an ack whose
//! reply was slow, two tasks share a consumer token and pop together.
//!
//! The etcd client keeps records of the deliveries it made (`Local::mine`
//! in `work_queue.rs`: the record and its mod revision, written after each
//! pop and extend answered, removed after each ack and nack and whenever a
//! read finds the message no longer held) and of the groups its last pop
//! saw (`Local::seen`); concurrent calls write them in any order. These
//! tests look for an answer, or a state in etcd, that a stale or
//! overwritten record could cause. The scenarios and what each checks are
//! in `conformance::queue_race` (shared with coord-redis and
//! coord-postgres); here the store is read straight: every key of the
//! queue that names the message (record, payload, group member and ready
//! entries, candidate index entries, timeline entries).
//!
//! What keeps these races safe: every `Local::mine` record pairs a record
//! with the mod revision it was written at (the pop's and the extend's
//! transaction revision), and every one-transaction path compares that
//! revision, so a stale record (an extend's written after a racing ack or
//! nack removed it) only costs a failed transaction and a read; the calls
//! themselves are single compare-guarded transactions.
//!
//! What each scenario guards (each of these changes to the source made
//! it fail when tried): an extend without its compare of the record's mod
//! revision (`work_queue/ops.rs`, `queue_extend`) fails (a) (the acked record and
//! its timeline entry written back, late extends and acks answering true)
//! and (d); an ack's one-transaction path without that compare
//! (`queue_ack`) fails (c) (both acks true) and (b) (ack and nack both
//! true); a pop level without its compares (`work_queue/pop.rs`, `level_txn`)
//! fails (e) (one message delivered to both racing pops, two of one
//! ordered group in flight); an extend recording its new revision with
//! the record it replaced (a mispaired `Local::mine`) fails (a) rarely,
//! about one round in 160 (the ack's one-transaction path deletes the old
//! timeline entry, leaving the new one).

use crate::claim_support;
use claim_support::{client, raw_etcd, unique};
use conformance::queue_race::{Env, Probe, Q};
use coord_core::async_trait;
use etcd_client::GetOptions;

/// The keys of each queue, read straight from etcd.
struct Keys {
    p: String,
    raw: etcd_client::Client,
}

impl Keys {
    async fn keys(&self, q: &str) -> Vec<String> {
        let dir = format!("{}wq/{q}/", self.p);
        self.raw
            .clone()
            .get(dir.as_bytes(), Some(GetOptions::new().with_prefix()))
            .await
            .unwrap()
            .take_kvs()
            .iter()
            .map(|kv| kv.key_str().unwrap()[dir.len()..].to_string())
            .collect()
    }
}

#[async_trait]
impl Probe for Keys {
    /// The keys of `q` with a segment that is `id` (20 digits).
    async fn of(&self, q: &str, id: u64) -> Vec<String> {
        let n = format!("{id:020}");
        self.keys(q)
            .await
            .into_iter()
            .filter(|k| k.split('/').any(|s| s == n))
            .collect()
    }

    async fn all(&self, q: &str) -> Vec<String> {
        self.keys(q).await
    }
}

async fn env(tag: &str) -> Env {
    let p = unique(tag);
    let c: Q = client(&p).await;
    let c0: Q = client(&p).await;
    let c2: Q = client(&p).await;
    let probe = Box::new(Keys {
        raw: raw_etcd().await,
        p,
    });
    Env { c, c0, c2, probe }
}

conformance::queue_race_tests!(env);
