//! Work queue operations on one delivered message (ack, nack, extend,
//! abandon); see `work_queue.rs`. A whole queue's are in `manage`.

use std::time::Duration;

use coord_core::{Lane, OwnerToken, Result};
use etcd_client::{CompareOp, KeyValue, PutOptions, Txn, TxnOp};

use crate::client::header_rev;
use crate::client::keys::prefix_end;
use crate::client::{corrupt, secs};
use crate::work_queue::Mine;
use crate::work_queue::WorkQueues;
use crate::work_queue::group::{Around, around_ops, remove};
use crate::work_queue::keys::{Group, Meta, QKeys, State, after, id_of, parse_time_value, with_id};
use crate::work_queue::plan::{
    Plan, Retry, Snap, apply_first, deadline_ms, get, now_ms, range, read,
};

pub(super) fn meta_of(kv: &KeyValue, op: &'static str) -> Result<Meta> {
    Meta::decode(kv.value()).ok_or_else(|| corrupt(op, "work queue message"))
}

/// What [`WorkQueues::held`] found.
struct Held {
    kv: KeyValue,
    meta: Meta,
    deadline: u64,
    /// The reads of `around_ops` for the message's group, and where they
    /// start.
    around: Option<(Snap, usize)>,
}

/// The deadline of `meta` if it is in flight to `consumer` and its
/// deadline has not passed on this client's clock.
fn held_by(meta: &Meta, consumer: &OwnerToken) -> Option<u64> {
    match meta.state {
        State::InFlight(t, o) if o == *consumer && t > now_ms() => Some(t),
        _ => None,
    }
}

impl WorkQueues {
    /// Message `id`'s record, if it is in flight to `consumer` and its
    /// deadline has not passed on this client's clock; with `around`, also
    /// the reads of [`around_ops`] for its group (made with the record's
    /// read when this client made the delivery).
    #[allow(clippy::too_many_arguments)]
    async fn held(
        &self,
        k: &QKeys,
        queue: &str,
        lane: Lane,
        id: u64,
        consumer: &OwnerToken,
        around: bool,
        op: &'static str,
    ) -> Result<Option<Held>> {
        let hint = match around {
            true => self.local.mine(queue, lane, id).map(|m| m.meta.group),
            false => None,
        };
        let mut ops = vec![get(k.meta(lane, id))];
        if let Some(g) = &hint {
            ops.extend(around_ops(k, lane, g, id));
        }
        let s = read(&self.etcd, op, ops).await?;
        let found = match s.one(0) {
            Some(kv) => Some((kv.clone(), meta_of(kv, op)?)),
            None => None,
        };
        let Some((kv, meta, deadline)) =
            found.and_then(|(kv, m)| held_by(&m, consumer).map(|t| (kv, m, t)))
        else {
            self.local.set_mine(queue, lane, id, None);
            return Ok(None);
        };
        let around = match hint {
            _ if !around => None,
            Some(g) if g == meta.group => Some((s, 1)),
            _ => {
                let ops = around_ops(k, lane, &meta.group, id);
                Some((read(&self.etcd, op, ops).await?, 0))
            }
        };
        Ok(Some(Held {
            kv,
            meta,
            deadline,
            around,
        }))
    }

    /// This client's delivery `id` if it is still held by `consumer` as
    /// far as this client knows: (its record's mod revision, the record,
    /// the deadline).
    fn mine_held(
        &self,
        queue: &str,
        lane: Lane,
        id: u64,
        consumer: &OwnerToken,
    ) -> Option<(i64, Meta, u64)> {
        let m = self.local.mine(queue, lane, id)?;
        let t = held_by(&m.meta, consumer)?;
        Some((m.rev, m.meta, t))
    }

    /// Delete message `id` iff held by `consumer`. A delivery this client
    /// made that is not its group's head (the common case) goes in one
    /// transaction that touches nothing shared.
    pub(crate) async fn queue_ack(
        &self,
        queue: &str,
        lane: Lane,
        id: u64,
        consumer: &OwnerToken,
    ) -> Result<bool> {
        let op = "queue ack";
        let k = self.qkeys(queue);
        if let Some((rev, meta, deadline)) = self.mine_held(queue, lane, id, consumer) {
            let mut p = Plan::new();
            p.rev_is(k.meta(lane, id), rev);
            let head = Group::head_value(id);
            p.value_cmp(k.head(lane, &meta.group), CompareOp::NotEqual, head);
            p.del(k.meta(lane, id));
            p.del(k.payload(lane, id));
            p.del(with_id(&k.members(lane, &meta.group), id));
            p.del(k.time_entry(lane, deadline, id));
            if self
                .etcd
                .txn(op, p.into_txn(vec![], vec![]))
                .await?
                .succeeded()
            {
                self.local.set_mine(queue, lane, id, None);
                return Ok(true);
            }
        }
        let mut retry = Retry::new(&self.etcd, op);
        loop {
            let Some(h) = self.held(&k, queue, lane, id, consumer, true, op).await? else {
                return Ok(false);
            };
            let Some((s, at)) = &h.around else {
                return Ok(false);
            };
            let mut p = Plan::new();
            p.same(&h.kv);
            if let Some(levels) = remove(p, &k, lane, id, &h.meta, &Around::of(s, *at), op)? {
                if apply_first(&self.etcd, op, levels).await? {
                    self.local.set_mine(queue, lane, id, None);
                    return Ok(true);
                }
            }
            retry.again().await?;
        }
    }

    /// Give message `id` back iff held by `consumer`, due again after
    /// `delay` (one transaction for a delivery this client made). A message
    /// given back without delay is due at once: on the lane's timeline,
    /// made ready by the next pop before it delivers (as a lapsed delivery
    /// is), so that giving it back touches none of its group's keys, which
    /// the group's other deliveries keep changing.
    pub(crate) async fn queue_give_back(
        &self,
        queue: &str,
        lane: Lane,
        id: u64,
        consumer: &OwnerToken,
        delay: Duration,
    ) -> Result<bool> {
        self.give_back(queue, lane, id, consumer, delay, false)
            .await
    }

    /// [`queue_give_back`](Self::queue_give_back); `uncount`: the delivery
    /// is taken back from the attempt count too (nobody saw it).
    async fn give_back(
        &self,
        queue: &str,
        lane: Lane,
        id: u64,
        consumer: &OwnerToken,
        delay: Duration,
        uncount: bool,
    ) -> Result<bool> {
        let at = |m: &mut Meta| {
            if uncount {
                m.attempts = m.attempts.saturating_sub(1);
            }
            // Without delay: due now, never a millisecond later.
            let at = match delay.is_zero() {
                true => now_ms(),
                false => deadline_ms(delay),
            };
            m.state = State::Delayed(at);
            at
        };
        let moved = self
            .retime(queue, lane, id, consumer, "queue nack", at)
            .await?;
        if moved.is_some() {
            self.local.set_mine(queue, lane, id, None);
        }
        Ok(moved.is_some())
    }

    /// Abandon the pop attempts of `consumer` (see
    /// `coord_core::Queue::abandon`): its mark first, on a lease of its own
    /// (a pop transaction of it landing after the mark delivers nothing),
    /// then a message in flight to it, found on the lane's timeline, given
    /// back at once and uncounted. The timeline is read a page at a time.
    pub(crate) async fn queue_abandon(
        &self,
        queue: &str,
        lane: Lane,
        consumer: &OwnerToken,
    ) -> Result<()> {
        let op = "queue abandon";
        const PAGE: i64 = 256;
        let k = self.qkeys(queue);
        let keep = coord_core::ABANDONED_POP_MEMORY.max(self.etcd.timeout.saturating_mul(2));
        let lease = self.etcd.grant_lease(secs(keep) + 1, op).await?;
        let mark = TxnOp::put(
            k.abandoned(consumer),
            Vec::new(),
            Some(PutOptions::new().with_lease(lease)),
        );
        self.etcd.txn(op, Txn::new().and_then(vec![mark])).await?;
        let timeline = k.timeline(lane);
        let end = prefix_end(&timeline);
        let mut from = timeline;
        loop {
            let s = read(&self.etcd, op, vec![range(from.clone(), end.clone(), PAGE)]).await?;
            let page = s.list(0);
            let mut ids = Vec::new();
            for kv in page {
                let (in_flight, _) = parse_time_value(kv.value())
                    .ok_or_else(|| corrupt(op, "work queue timeline"))?;
                if in_flight {
                    ids.push(id_of(kv.key()).ok_or_else(|| corrupt(op, "work queue timeline"))?);
                }
            }
            if !ids.is_empty() {
                let metas = read(
                    &self.etcd,
                    op,
                    ids.iter().map(|id| get(k.meta(lane, *id))).collect(),
                )
                .await?;
                for (i, id) in ids.iter().enumerate() {
                    let Some(kv) = metas.one(i) else { continue };
                    if held_by(&meta_of(kv, op)?, consumer).is_some() {
                        self.give_back(queue, lane, *id, consumer, Duration::ZERO, true)
                            .await?;
                        return Ok(());
                    }
                }
            }
            match page.last() {
                Some(last) if page.len() as i64 >= PAGE => from = after(last.key()),
                _ => return Ok(()),
            }
        }
    }

    /// Move message `id`'s deadline to now + `visibility` iff held by
    /// `consumer` (one transaction for a delivery this client made).
    pub(crate) async fn queue_extend(
        &self,
        queue: &str,
        lane: Lane,
        id: u64,
        consumer: &OwnerToken,
        visibility: Duration,
    ) -> Result<bool> {
        let at = |m: &mut Meta| {
            let at = deadline_ms(visibility);
            m.state = State::InFlight(at, *consumer);
            at
        };
        let moved = self
            .retime(queue, lane, id, consumer, "queue extend", at)
            .await?;
        let Some((rev, meta)) = moved else {
            return Ok(false);
        };
        self.local
            .set_mine(queue, lane, id, Some(Mine { rev, meta }));
        Ok(true)
    }

    /// Move message `id`, iff held by `consumer`, to the place on the
    /// lane's timeline that `to` gives it (`to` sets its record's state and
    /// returns the time): one transaction for a delivery this client made,
    /// comparing only the record, so that the group's other steps cannot
    /// make it lose. `None`: not held. Else the transaction's revision and
    /// the record written.
    async fn retime(
        &self,
        queue: &str,
        lane: Lane,
        id: u64,
        consumer: &OwnerToken,
        op: &'static str,
        to: impl Fn(&mut Meta) -> u64,
    ) -> Result<Option<(i64, Meta)>> {
        let k = self.qkeys(queue);
        let mut known = self.mine_held(queue, lane, id, consumer);
        let mut retry = Retry::new(&self.etcd, op);
        loop {
            let (rev, mut m, deadline) = match known.take() {
                Some(k) => k,
                None => {
                    let Some(h) = self.held(&k, queue, lane, id, consumer, false, op).await? else {
                        return Ok(None);
                    };
                    (h.kv.mod_revision(), h.meta, h.deadline)
                }
            };
            let mut p = Plan::new();
            p.rev_is(k.meta(lane, id), rev);
            p.del(k.time_entry(lane, deadline, id));
            let at = to(&mut m);
            p.put(k.time_entry(lane, at, id), m.time_value());
            p.put(k.meta(lane, id), m.encode());
            let resp = self.etcd.txn(op, p.into_txn(vec![], vec![])).await?;
            if resp.succeeded() {
                return Ok(Some((header_rev(&resp), m)));
            }
            retry.again().await?;
        }
    }
}
