//! Work queues on etcd: [`coord_core::Queue`] for [`EtcdBackend`],
//! following the delivery rule of `coord_core::queue_backend` (the model
//! is `coord_core::queue_state`, which coord-memory runs; the turn step, a
//! group's candidate and the dead-letter decision are its functions).
//!
//! # Keys
//!
//! Under `<prefix>wq/<escaped queue>/` (`L`: the lane, `M` or `D`; `G`: the
//! group as `_<escaped group>`; numbers are 20-digit decimals):
//!
//! - `m/L/<id>`: the message's record (group, attempts, enqueue time,
//!   payload length, state: ready, delayed until T, or in flight to an
//!   owner until T); `p/L/<id>`: its payload, as it is;
//! - `g/L/G` and `h/L/G`, while the group has messages in the lane: its
//!   record (its turn and lowest ready id: what deliveries change) and its
//!   head (its lowest id: what acks of its oldest message change), apart
//!   so that an ack and a delivery in one group do not collide;
//! - `a/L/G/<id>`: the group's messages by id; `r/L/G/<id>`: its ready
//!   ones, each with a copy of its record (which does not change while it
//!   is ready);
//! - `i/L/u/<turn>/<id>` and `i/L/o/<turn>/<id>` (value: the group): the
//!   candidate indexes, one entry per group with a candidate: its lowest
//!   ready message, and (for ordered groups) its head if that is ready. The
//!   first key of an index is the next delivery (lowest turn, then lowest
//!   id);
//! - `i/L/t/<unix ms>/<id>` (value: `D` or `F`, then the group): the
//!   timeline of delayed messages and delivery deadlines;
//! - `c/L`: the lane's virtual clock, while the lane has groups;
//! - `d/<dedup id>`: the first message's id and when the window ends, on a
//!   lease that outlives the window by the write's call timeout: its life
//!   counted from before its grant was sent, the window from after the
//!   lease was taken (a lease is reused while it has that much left).
//!
//! # Steps
//!
//! Every operation reads (one read-only transaction, or two when the
//! second depends on the first) and then sends one transaction whose
//! compares hold what it read still true (`work_queue/plan.rs`); one that lost a
//! race changes nothing and is tried again on fresh reads, with a random
//! backoff, for up to the call timeout (then `Error::Unavailable`).
//!
//! - **push**: a put to the fencing key with the reads of the group record
//!   (and the dedup key) in one transaction; **the message id is its
//!   revision**. Then the insert: record, payload, the group's lists and
//!   (when its candidate changes) its index entries, comparing the group
//!   record unchanged (or absent, then the lane clock). A push behind an
//!   older ready message of its group (the common case on a busy queue)
//!   changes nothing the record holds, so it compares only that the group
//!   is the same (the record's create revision) and that the highest of
//!   the older ready messages it read (of the group's first 16) is
//!   unchanged, so still ready and none above it delivered: deliveries
//!   of the group change the record, and a push comparing it lost to
//!   every one of them. A delayed push, or one with no older ready
//!   message read, compares the record unchanged. A push whose id is
//!   below its group's head (a later push of the group landed first) takes
//!   a new id, so a message never overtakes its group's in-flight head.
//!   Ids rise in push order across the whole store, purges included.
//! - **pop** (`work_queue/pop.rs`): the timeline and the index's first keys, the
//!   groups found there, then one transaction offering the next few
//!   deliveries as nested levels, so racing consumers do not all lose to
//!   the winner; it compares the group's record and the lane's clock, not
//!   the group's head. A delivery moves the message in flight (attempts +
//!   1, deadline, owner), the lane's clock to `max(clock, turn)` and the
//!   group to the turn after that with its next ready message (its index
//!   entries move with it), and reads the payload; **its
//!   revision is the fencing token**, so tokens rise over every delivery
//!   of both lanes (and across restarts). Due timeline entries (delayed
//!   messages, lapsed deliveries) are made ready first, up to 8 per
//!   transaction; a candidate delivered `max_deliveries` times moves to
//!   the dead lane in a transaction of its own.
//! - **ack, nack, extend**: for a delivery this client made, one
//!   transaction comparing the record's mod revision as the delivery left
//!   it (an ack also compares that the message is not its group's head,
//!   and then deletes only its own keys); otherwise, or if that fails, the
//!   record (owner and deadline checked on this client's clock) and the
//!   group's keys, then one transaction comparing what it relies on. The
//!   ack of a group's head offers one nested level per message read
//!   behind it (`remove` in `work_queue/group.rs`): those are the messages
//!   the group's other consumers ack next, and a single guess of the next
//!   head kept losing to them. A nack puts the message back on the
//!   timeline, due after its delay (without delay: due at once, made
//!   ready by the next pop like a lapsed delivery), so it touches none of
//!   its group's keys, which the group's deliveries keep changing.
//! - **peek** reads records then payloads; **redrive** moves one dead
//!   letter per transaction; **stats** is one read (counts of the ready
//!   lists and dead records, the timeline); **purge** one transaction.
//!
//! # Visibility: a deadline in the record, not a lease
//!
//! A delivery's visibility is a deadline in its record (in flight to an
//! owner until T, Unix ms) with an entry in the lane's timeline, not an
//! etcd lease:
//!
//! - a lease's expiry can only delete the keys put on it, and a lapsed
//!   delivery must not vanish: it becomes ready again, its attempts kept,
//!   back in its group's place in the candidate index. That takes a
//!   transaction however the lapse is noticed; the next step of the lane
//!   runs it when it reads the due timeline entry, so a deadline is all a
//!   lapse needs;
//! - a lease per delivery would cost a lease grant per pop, a round trip
//!   that cannot be part of the pop's transaction; and a lease's TTL is
//!   fixed when it is granted, so an extend to another visibility would
//!   need a new lease and the delivery's keys put on it again, where with
//!   a deadline it is one more compare-and-put in the extend's
//!   transaction.
//!
//! # Clocks
//!
//! etcd has no clock for data without a TTL, and visibility is not a
//! lease, so delays, visibility deadlines and dedup windows are measured
//! on the **clients' clocks**
//! ([`Capabilities::server_clock`](coord_core::Capabilities) is false): a
//! deadline is the popping client's clock plus the visibility, and other
//! consumers judge it by their own clocks. So skew between clients shifts
//! redelivery time: a consumer whose clock runs ahead by `d` takes over a
//! lapsed delivery `d` early, while its owner (whose guard and lost signal
//! run on its own monotonic clock) may still count itself valid (fencing
//! tokens still order the two consumers); one whose clock runs behind by
//! `d` takes it over up to `d` late; an owner whose clock runs behind may
//! ack up to `d` late. Delays and dedup windows shift the same way. Keep
//! clocks in sync (NTP).
//!
//! # Wake-ups
//!
//! One shared watch per queue, lane and client on `i/L/` wakes the
//! client's waiters when a key is put into a candidate index (a push, a
//! redrive, an ack letting an ordered group go on, a lapsed, nacked or
//! delayed message made ready) and when a message joins the timeline
//! as delayed (a delayed push, a nack: the waiters learn when it is due).
//! A lapsing delivery wakes nobody: an empty pop reports when the next
//! timeline entry is due (`next_in`).
//!
//! # State
//!
//! An acked message leaves nothing; a lane without messages leaves
//! nothing (its groups and clock go with their last message); dedup ids
//! stay until their lease ends (after their push: at least the window
//! plus a call timeout, at most the window plus two call timeouts plus
//! 3 s). So an idle
//! queue holds no keys once its dedup windows passed. `purge` deletes
//! every key of the queue in one transaction.

pub(crate) mod due;
pub(crate) mod group;
pub(crate) mod keys;
mod manage;
pub(crate) mod ops;
pub(crate) mod plan;
pub(crate) mod pop;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use coord_core::util::Kind;
use coord_core::wake::Waiter;
use coord_core::{Lane, Message, MessageId, NewMessage, Pushed, Result};
use etcd_client::{Txn, TxnOp};
use tokio::time::Instant;

use crate::client::corrupt;
use crate::client::keys::prefix_end;
use crate::client::watch::WatchKind;
use crate::client::{Etcd, is_lease_not_found, lock, secs};
use crate::work_queue::group::{LANDING, Landing, insert, landing_ops};
use crate::work_queue::keys::{Meta, QKeys, State};
use crate::work_queue::plan::{Plan, Retry, Snap, deadline_ms, get, now_ms};

/// How many entries each map of [`Local`] holds at most (it is emptied
/// when it would hold more: only hints are lost).
const LOCAL_CAP: usize = 4096;

/// This client's work queue state: the leases dedup ids go on, what it
/// knows of each delivery it made (so an ack, nack or extend is one
/// transaction, or reads the message and its group at once), and the
/// groups its last pop of each lane saw (so the next pop reads them with
/// its first read). Only hints: a wrong one costs a read.
#[derive(Default)]
pub(crate) struct Local {
    /// Per TTL (seconds): (lease id, the earliest instant the server may
    /// expire it: the send instant of its grant plus its TTL).
    leases: Mutex<HashMap<u64, (i64, Instant)>>,
    /// (queue, lane, id) -> the delivery.
    mine: Mutex<HashMap<(String, Lane, u64), Mine>>,
    /// (queue, lane, ordered) -> groups.
    seen: Mutex<HashMap<(String, Lane, bool), Vec<String>>>,
}

/// A delivery this client made, as it left it: the message's record and
/// that record's mod revision.
#[derive(Clone)]
pub(crate) struct Mine {
    pub(crate) rev: i64,
    pub(crate) meta: Meta,
}

fn capped<K: std::hash::Hash + Eq, V>(m: &mut HashMap<K, V>) {
    if m.len() >= LOCAL_CAP {
        m.clear();
    }
}

impl Local {
    /// What this client knows of its delivery `id`.
    pub(crate) fn mine(&self, queue: &str, lane: Lane, id: u64) -> Option<Mine> {
        lock(&self.mine)
            .get(&(queue.to_string(), lane, id))
            .cloned()
    }

    /// Remember (`Some`) or forget delivery `id`.
    pub(crate) fn set_mine(&self, queue: &str, lane: Lane, id: u64, mine: Option<Mine>) {
        let mut m = lock(&self.mine);
        let key = (queue.to_string(), lane, id);
        match mine {
            Some(d) => {
                capped(&mut m);
                m.insert(key, d);
            }
            None => {
                m.remove(&key);
            }
        }
    }

    /// The groups the last pop of this lane saw.
    pub(crate) fn seen(&self, queue: &str, lane: Lane, ordered: bool) -> Vec<String> {
        lock(&self.seen)
            .get(&(queue.to_string(), lane, ordered))
            .cloned()
            .unwrap_or_default()
    }

    pub(crate) fn set_seen(&self, queue: &str, lane: Lane, ordered: bool, groups: &[String]) {
        let mut m = lock(&self.seen);
        capped(&mut m);
        m.insert((queue.to_string(), lane, ordered), groups.to_vec());
    }
}

/// The work queues of one backend.
pub(crate) struct WorkQueues {
    pub(crate) etcd: Arc<Etcd>,
    /// This client's work queue state (dedup leases, hints).
    pub(crate) local: Local,
}

impl WorkQueues {
    pub(crate) fn new(etcd: Arc<Etcd>) -> Self {
        WorkQueues {
            etcd,
            local: Local::default(),
        }
    }

    pub(crate) fn qkeys(&self, queue: &str) -> QKeys {
        QKeys::new(self.etcd.keys.wq(queue))
    }

    /// The lease a dedup key of `window` goes on, for a write sent now:
    /// one the server keeps at least `window` past the moment that write
    /// could land (now plus one call timeout). A lease's life is counted
    /// from before its grant was sent (the server starts it later, never
    /// earlier), so a slow grant shortens it, never lengthens it. One is
    /// kept per TTL and reused while it has that much left; else a new one
    /// of the window plus two call timeouts plus 2 s, which has that much
    /// left when its grant answers (within one call timeout).
    async fn dedup_lease(&self, window: Duration) -> Result<i64> {
        let ttl = secs(window.saturating_add(self.etcd.timeout.saturating_mul(2))) + 2;
        let now = Instant::now();
        let need = now + self.etcd.timeout + window;
        {
            let mut leases = lock(&self.local.leases);
            leases.retain(|_, (_, ends)| *ends > now);
            if let Some((id, ends)) = leases.get(&ttl) {
                if *ends >= need {
                    return Ok(*id);
                }
            }
        }
        let sent = Instant::now();
        let id = self.etcd.grant_lease(ttl, "queue push").await?;
        lock(&self.local.leases).insert(ttl, (id, sent + Duration::from_secs(ttl)));
        Ok(id)
    }

    /// Stop using dedup lease `id` (the server no longer has it).
    fn forget_dedup_lease(&self, id: i64) {
        lock(&self.local.leases).retain(|_, (l, _)| *l != id);
    }
}

pub(crate) fn message_of(id: u64, meta: &Meta, payload: Vec<u8>) -> Message {
    Message {
        id: MessageId(id),
        payload,
        group: (!meta.group.is_empty()).then(|| meta.group.clone()),
        attempts: meta.attempts,
        enqueued_at: UNIX_EPOCH + Duration::from_millis(meta.enqueued_ms),
    }
}

impl WorkQueues {
    pub(crate) async fn queue_push(&self, queue: &str, msg: &NewMessage<'_>) -> Result<Pushed> {
        let op = "queue push";
        let k = self.qkeys(queue);
        let g = msg.group.unwrap_or("");
        // The id is this put's revision; the reads see the group then.
        let mut alloc = vec![TxnOp::put(
            self.etcd.keys.single(Kind::Fence, ""),
            Vec::new(),
            None,
        )];
        alloc.extend(landing_ops(&k, Lane::Main, g));
        if let Some(d) = msg.dedup_id {
            alloc.push(get(k.dedup(d)));
        }
        let mut retry = Retry::new(&self.etcd, op);
        let mut s = Snap::of(
            &self
                .etcd
                .txn(op, Txn::new().and_then(alloc.clone()))
                .await?,
        );
        loop {
            let id = u64::try_from(s.rev)
                .ok()
                .filter(|r| *r > 0)
                .ok_or_else(|| corrupt(op, "revision"))?;
            let now = now_ms();
            let dedup = msg.dedup_id.and_then(|_| s.one(1 + LANDING));
            if let Some(kv) = dedup {
                let v = std::str::from_utf8(kv.value()).ok();
                let parsed = v
                    .and_then(|v| v.split_once(' '))
                    .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)));
                if let Some((first, until)) = parsed {
                    if until > now {
                        return Ok(Pushed {
                            id: MessageId(first),
                            duplicate: true,
                        });
                    }
                }
            }
            // Taken for the write that follows (a duplicate needs none).
            let lease = match msg.dedup_id {
                Some(_) => Some(self.dedup_lease(msg.dedup_window).await?),
                None => None,
            };
            let state = if msg.delay.is_zero() {
                State::Ready
            } else {
                State::Delayed(deadline_ms(msg.delay))
            };
            let meta = Meta {
                group: g.to_string(),
                attempts: 0,
                enqueued_ms: now,
                len: msg.payload.len() as u64,
                state,
            };
            let head = s.one(2).and_then(|kv| {
                let v = std::str::from_utf8(kv.value()).ok()?;
                v.parse::<u64>().ok()
            });
            if head.is_some_and(|h| h > id) {
                // A later id of the group landed first: this one would
                // overtake a message that may be in flight in an ordered
                // group. Take a new id.
                retry.again().await?;
                s = Snap::of(
                    &self
                        .etcd
                        .txn(op, Txn::new().and_then(alloc.clone()))
                        .await?,
                );
                continue;
            }
            let mut p = Plan::new();
            insert(
                &mut p,
                &k,
                Lane::Main,
                id,
                &meta,
                msg.payload,
                &Landing::of(&s, 1),
                op,
            )?;
            if let (Some(d), Some(lease)) = (msg.dedup_id, lease) {
                match dedup {
                    Some(kv) => p.same(kv),
                    None => p.absent(k.dedup(d)),
                }
                // Measured after the lease was taken: the lease outlives
                // the window by the write's call timeout.
                let until = deadline_ms(msg.dedup_window);
                p.put_leased(k.dedup(d), format!("{id} {until}"), lease);
            }
            let resp = match self.etcd.txn(op, p.into_txn(vec![], alloc.clone())).await {
                Ok(r) => r,
                Err(e) if lease.is_some() && is_lease_not_found(&e) => {
                    // The lease ended (the server lost it): a new one, and
                    // a new id.
                    if let Some(l) = lease {
                        self.forget_dedup_lease(l);
                    }
                    retry.again().await?;
                    s = Snap::of(
                        &self
                            .etcd
                            .txn(op, Txn::new().and_then(alloc.clone()))
                            .await?,
                    );
                    continue;
                }
                Err(e) => return Err(e),
            };
            if resp.succeeded() {
                return Ok(Pushed {
                    id: MessageId(id),
                    duplicate: false,
                });
            }
            s = Snap::of(&resp);
            retry.at_once()?;
        }
    }
}

/// The wake-up key of a lane's local waiters.
fn wake(queue: &str, lane: Lane) -> String {
    format!("wq\u{0}{}\u{0}{queue}", lane.as_str())
}

impl WorkQueues {
    /// Register a local waiter of `lane` of `queue`: a shared watch on
    /// the lane's candidate indexes (see the module doc) wakes it.
    pub(crate) async fn subscribe(&self, queue: &str, lane: Lane) -> Result<Waiter> {
        let start = self.qkeys(queue).indexes(lane);
        let end = prefix_end(&start);
        self.etcd
            .subscribe_watch(wake(queue, lane), start, Some(end), WatchKind::Puts(wakes))
            .await
    }
}

/// Whether a put under a lane's `i/<lane>/` (`rest`: the key past it)
/// wakes the lane's waiters: a key put into a candidate index (a message
/// became deliverable), or a delayed message joining the timeline (the
/// waiters learn when it comes due); not a delivery deadline.
fn wakes(rest: &[u8], value: &[u8]) -> bool {
    !rest.starts_with(b"t/") || value.first() == Some(&b'D')
}
