//! Work queue operations on a whole queue (peek, redrive, stats,
//! purge); see `work_queue.rs`.

use std::collections::HashMap;

use coord_core::{Lane, Message, QueueStats, Result};
use etcd_client::{DeleteOptions, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};

use super::ops::meta_of;
use crate::client::header_rev;
use crate::client::keys::prefix_end;
use crate::client::{corrupt, first_page, is_compacted};
use crate::work_queue::WorkQueues;
use crate::work_queue::group::{
    AROUND, Around, Landing, around_ops, id_in, insert, landing_ops, remove,
};
use crate::work_queue::keys::{Meta, QKeys, State, after, pair_of, parse_time_value};
use crate::work_queue::message_of;
use crate::work_queue::plan::{Plan, Retry, apply_first, get, now_ms, read};

/// At most this many payload bytes per read of a peek.
const PEEK_BYTES: u64 = 2 * 1024 * 1024;

/// Dead letters read per page by a redrive.
const REDRIVE_PAGE: i64 = 64;

fn count_only(prefix: Vec<u8>) -> TxnOp {
    let end = prefix_end(&prefix);
    TxnOp::get(
        prefix,
        Some(GetOptions::new().with_range(end).with_count_only()),
    )
}

fn count_in(r: Option<&TxnOpResponse>) -> u64 {
    match r {
        Some(TxnOpResponse::Get(g)) => u64::try_from(g.count()).unwrap_or(0),
        _ => 0,
    }
}

impl WorkQueues {
    /// Up to `limit` messages of `lane`, lowest id first. The payloads are
    /// read after the records, a few at a time (a message acked between the
    /// two reads is left out).
    pub(crate) async fn queue_peek(
        &self,
        queue: &str,
        lane: Lane,
        limit: usize,
    ) -> Result<Vec<Message>> {
        let op = "queue peek";
        let k = self.qkeys(queue);
        let m = k.metas(lane);
        let opts = GetOptions::new()
            .with_range(prefix_end(&m))
            .with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
        let mut metas = Vec::new();
        for kv in self.etcd.get(op, m, Some(opts)).await? {
            metas.push((id_in(&kv, op)?, meta_of(&kv, op)?));
        }
        let mut out = Vec::with_capacity(metas.len());
        let mut i = 0;
        while i < metas.len() {
            let mut j = i;
            let mut bytes = 0u64;
            while j < metas.len() && (j == i || bytes.saturating_add(metas[j].1.len) <= PEEK_BYTES)
            {
                bytes = bytes.saturating_add(metas[j].1.len);
                j += 1;
            }
            let start = k.payload(lane, metas[i].0);
            let end = after(&k.payload(lane, metas[j - 1].0));
            let got = self
                .etcd
                .get(op, start, Some(GetOptions::new().with_range(end)))
                .await?;
            let mut payloads = HashMap::new();
            for kv in got {
                payloads.insert(id_in(&kv, op)?, kv.value().to_vec());
            }
            for (id, meta) in &metas[i..j] {
                if let Some(p) = payloads.remove(id) {
                    out.push(message_of(*id, meta, p));
                }
            }
            i = j;
        }
        Ok(out)
    }

    /// Move up to `limit` dead letters that are not in flight back to the
    /// main lane, lowest id first, one transaction each.
    pub(crate) async fn queue_redrive(&self, queue: &str, limit: usize) -> Result<u64> {
        let op = "queue redrive";
        let k = self.qkeys(queue);
        let dead = k.metas(Lane::Dead);
        let end = prefix_end(&dead);
        let mut from = dead;
        let mut moved = 0usize;
        'pages: while moved < limit {
            let opts = GetOptions::new()
                .with_range(end.clone())
                .with_limit(REDRIVE_PAGE);
            let page = self.etcd.get(op, from.clone(), Some(opts)).await?;
            for kv in &page {
                if moved >= limit {
                    break 'pages;
                }
                from = after(kv.key());
                if self.redrive_one(&k, id_in(kv, op)?, kv.clone(), op).await? {
                    moved += 1;
                }
            }
            if (page.len() as i64) < REDRIVE_PAGE {
                break;
            }
        }
        Ok(moved as u64)
    }

    /// Move dead letter `id` (its record as read: `kv`) to the main lane,
    /// ready with attempts reset, unless it is in flight. `Ok(false)`: not
    /// moved.
    async fn redrive_one(
        &self,
        k: &QKeys,
        id: u64,
        mut kv: KeyValue,
        op: &'static str,
    ) -> Result<bool> {
        let mut retry = Retry::new(&self.etcd, op);
        loop {
            let meta = meta_of(&kv, op)?;
            if matches!(meta.state, State::InFlight(t, _) if t > now_ms()) {
                return Ok(false);
            }
            let g = meta.group.as_str();
            let mut ops = around_ops(k, Lane::Dead, g, id);
            ops.push(get(k.payload(Lane::Dead, id)));
            ops.extend(landing_ops(k, Lane::Main, g));
            let s = read(&self.etcd, op, ops).await?;
            if let Some(payload) = s.one(AROUND) {
                let mut p = Plan::new();
                p.same(&kv);
                let a = Around::of(&s, 0);
                if let Some(mut levels) = remove(p, k, Lane::Dead, id, &meta, &a, op)? {
                    let back = Meta {
                        attempts: 0,
                        state: State::Ready,
                        ..meta.clone()
                    };
                    let v = Landing::of(&s, AROUND + 1);
                    for p in &mut levels {
                        insert(p, k, Lane::Main, id, &back, payload.value(), &v, op)?;
                    }
                    if apply_first(&self.etcd, op, levels).await? {
                        return Ok(true);
                    }
                }
            }
            retry.again().await?;
            match self.etcd.get(op, k.meta(Lane::Dead, id), None).await?.pop() {
                Some(fresh) => kv = fresh,
                None => return Ok(false),
            }
        }
    }

    /// Counts by state, in one snapshot: the main lane's ready lists, its
    /// timeline (due entries count as ready), the dead lane's records.
    /// Only counts are read, except for the timeline's entries not yet
    /// due (whether each is in flight is in its value): read in pages at
    /// the snapshot's revision.
    pub(crate) async fn queue_stats(&self, queue: &str) -> Result<QueueStats> {
        let op = "queue stats";
        let k = self.qkeys(queue);
        let t = k.timeline(Lane::Main);
        let t_end = prefix_end(&t);
        let mut tries = 0;
        loop {
            let now = now_ms();
            // Timeline keys are ordered by their time: those before this
            // one are due.
            let later = k.time_entry(Lane::Main, now.saturating_add(1), 0);
            let ops = vec![
                count_only(k.readies_all(Lane::Main)),
                TxnOp::get(
                    t.clone(),
                    Some(
                        GetOptions::new()
                            .with_range(later.clone())
                            .with_count_only(),
                    ),
                ),
                count_only(k.metas(Lane::Dead)),
                first_page(later, &t_end, false),
            ];
            let resp = self.etcd.txn(op, Txn::new().and_then(ops)).await?;
            let rev = header_rev(&resp);
            let mut rs = resp.op_responses().into_iter();
            let (ready, due, dead) = (
                count_in(rs.next().as_ref()),
                count_in(rs.next().as_ref()),
                count_in(rs.next().as_ref()),
            );
            let Some(TxnOpResponse::Get(first)) = rs.next() else {
                return Err(corrupt(op, "work queue timeline"));
            };
            let pending = match self.etcd.rest_of(op, first, &t_end, rev, false).await {
                Ok(kvs) => kvs,
                Err(e) if is_compacted(&e) && tries < 3 => {
                    tries += 1;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mut s = QueueStats {
                ready: ready + due,
                dead,
                ..QueueStats::default()
            };
            for kv in pending {
                let (at, _) =
                    pair_of(kv.key()).ok_or_else(|| corrupt(op, "work queue timeline"))?;
                let (in_flight, _) = parse_time_value(kv.value())
                    .ok_or_else(|| corrupt(op, "work queue timeline"))?;
                match (at > now, in_flight) {
                    (false, _) => s.ready += 1,
                    (true, true) => s.in_flight += 1,
                    (true, false) => s.delayed += 1,
                }
            }
            return Ok(s);
        }
    }

    /// Delete every key of the queue in one transaction; returns how many
    /// messages there were.
    pub(crate) async fn queue_purge(&self, queue: &str) -> Result<u64> {
        let op = "queue purge";
        let k = self.qkeys(queue);
        let (start, end) = k.all();
        let ops = vec![
            count_only(k.metas_both()),
            TxnOp::delete(start, Some(DeleteOptions::new().with_range(end))),
        ];
        let resp = self.etcd.txn(op, Txn::new().and_then(ops)).await?;
        Ok(count_in(resp.op_responses().first()))
    }
}
