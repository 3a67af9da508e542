//! Deliveries (see `work_queue.rs`): a pop reads the timeline and the
//! first entries of the candidate index, then the record and first ready
//! messages of each group found there, and from these predicts the next
//! few deliveries (the rule applied to what it read). It sends one
//! transaction holding each of them as a level: level 1 delivers the next
//! message if the queue is still as read; if not, level 2 delivers the one
//! after it if exactly that one is next now (another consumer took the
//! first), and so on; the last level's else branch reads the queue again.
//! So consumers racing for one queue do not all lose to the one that wins
//! (up to [`LEVELS`] of them win each round), and a loser has what it needs
//! for its next try without reading.
//!
//! A level's compares hold exactly what its delivery relies on: the
//! group's record has the value predicted, the candidate index's first key
//! is the message's entry, and the message and the next ready message of
//! its group are unchanged (a ready message's list entry carries its
//! record, so the record itself needs no read).

use std::collections::HashMap;
use std::time::Duration;

use coord_core::queue_state::{dead_letters, serve_turn};
use coord_core::{FencingToken, Lane, OwnerToken, PopAttempt, QueueConfig, Result};
use etcd_client::{CompareOp, KeyValue, Txn, TxnOp, TxnOpResponse};

use crate::client::corrupt;
use crate::client::header_rev;
use crate::client::keys::prefix_end;
use crate::work_queue::WorkQueues;
use crate::work_queue::due::{advance, dead_letter, due_of};
use crate::work_queue::group::id_in;
use crate::work_queue::keys::{Group, Meta, QKeys, State, id_of, pair_of, with_id};
use crate::work_queue::plan::{
    Plan, Retry, Snap, deadline_ms, get, landed, now_ms, range, read, until_ms,
};
use crate::work_queue::{Mine, message_of};

/// How many timeline entries a pop reads (and makes ready at most, when
/// due) at a time.
const TIMELINE_READ: i64 = 8;

/// How many deliveries one pop transaction offers (its levels).
pub(crate) const LEVELS: usize = 8;

/// The reads a pop starts from: the timeline's first entries, the
/// candidate index's first [`LEVELS`] keys and the lane's clock.
fn scan_ops(k: &QKeys, l: Lane, ordered: bool) -> Vec<TxnOp> {
    let t = k.timeline(l);
    let i = k.index(l, ordered);
    vec![
        range(t.clone(), prefix_end(&t), TIMELINE_READ),
        range(i.clone(), prefix_end(&i), LEVELS as i64),
        get(k.clock(l)),
    ]
}

/// How many reads [`scan_ops`] makes.
const SCAN: usize = 3;

/// The reads of a group a pop needs: its record and its first ready
/// messages.
fn detail_ops(k: &QKeys, l: Lane, g: &str) -> [TxnOp; 2] {
    let r = k.readies(l, g);
    let end = prefix_end(&r);
    [get(k.group(l, g)), range(r, end, LEVELS as i64 + 1)]
}

/// What a pop read of one group: its record (turn, lowest ready id) and
/// its first ready messages.
struct Detail {
    turn: u64,
    ready_id: u64,
    /// Its first ready messages (keys with the records).
    ready: Vec<KeyValue>,
    /// Whether that is all of them.
    complete: bool,
}

/// One predicted delivery: message `id`, the lowest ready one of group `g`
/// at `turn`, after which the group's lowest ready one is `next` (0: none);
/// the lane's clock goes from `clock` (`None`: no clock key) to `max(clock,
/// turn)`, and the group's turn to one more than that.
struct Step {
    g: String,
    turn: u64,
    id: u64,
    next: u64,
    clock: Option<u64>,
    /// The message's ready entry, and the group's next one if any.
    ready: Vec<KeyValue>,
    meta: Meta,
}

/// The next deliveries, in order, as far as the reads tell (`entries`: the
/// index keys read as (turn, id, group), `more`: whether the index may hold
/// more). `None`: the reads disagree (the queue changed between them).
fn predict(
    entries: &[(u64, u64, String)],
    clock: Option<u64>,
    more: bool,
    details: &HashMap<String, Detail>,
    ordered: bool,
    op: &'static str,
) -> Result<Option<Vec<Step>>> {
    struct Cand<'a> {
        g: &'a str,
        turn: u64,
        id: u64,
        pos: usize,
        original: bool,
    }
    let mut cands: Vec<Cand<'_>> = Vec::new();
    for (turn, id, g) in entries {
        let Some(d) = details.get(g) else {
            return Ok(None);
        };
        let first = d.ready.first().and_then(|kv| id_of(kv.key()));
        if (d.turn, d.ready_id) != (*turn, *id)
            || first != Some(*id)
            || cands.iter().any(|c| c.g == g)
        {
            return Ok(None);
        }
        cands.push(Cand {
            g,
            turn: *turn,
            id: *id,
            pos: 0,
            original: true,
        });
    }
    let mut out = Vec::new();
    let mut clock = clock;
    while out.len() < LEVELS {
        // Keys not read sort after every key read: the lowest candidate is
        // known while one read from the index is left.
        if more && !cands.iter().any(|c| c.original) {
            break;
        }
        let Some(best) = (0..cands.len()).min_by_key(|&i| (cands[i].turn, cands[i].id)) else {
            break;
        };
        let c = &cands[best];
        let Some(d) = details.get(c.g) else {
            return Ok(None);
        };
        let Some(rkv) = d.ready.get(c.pos) else {
            break;
        };
        if id_of(rkv.key()) != Some(c.id) {
            return Ok(None);
        }
        let meta = Meta::decode(rkv.value()).ok_or_else(|| corrupt(op, "work queue message"))?;
        if meta.group != c.g || !meta.ready() {
            return Ok(None);
        }
        let (next, ready) = match d.ready.get(c.pos + 1) {
            Some(n) => (id_in(n, op)?, vec![rkv.clone(), n.clone()]),
            None if d.complete => (0, vec![rkv.clone()]),
            None => break,
        };
        out.push(Step {
            g: c.g.to_string(),
            turn: c.turn,
            id: c.id,
            next,
            clock,
            ready,
            meta,
        });
        let (now, turn) = serve_turn(clock.unwrap_or(0), c.turn);
        clock = Some(now);
        // Ordered, the group's head is in flight now: it has no candidate.
        if ordered || next == 0 {
            cands.swap_remove(best);
        } else if let Some(c) = cands.get_mut(best) {
            c.turn = turn;
            c.id = next;
            c.pos += 1;
            c.original = false;
        }
    }
    Ok(Some(out))
}

/// What every level of one pop transaction shares.
struct Take<'a> {
    k: &'a QKeys,
    lane: Lane,
    ordered: bool,
    /// The revision of the details read.
    rev: i64,
    deadline: u64,
    consumer: &'a OwnerToken,
}

/// The transaction of one level: deliver `st` if the queue is exactly as
/// predicted for it, else `failure`. It compares the group's record, not
/// its head: the head is older than or the message itself, and either way
/// its ordered entry (if any) is this message's, which goes.
fn level_txn(t: &Take<'_>, st: &Step, failure: Vec<TxnOp>) -> Txn {
    let (k, l, ordered) = (t.k, t.lane, t.ordered);
    let id = st.id;
    let index = k.index(l, ordered);
    let entry = k.index_entry(l, ordered, st.turn, id);
    let readies = k.readies(l, &st.g);
    let mut p = Plan::new();
    // An abandoned consumer's attempt (a copy landing late) delivers
    // nothing (`queue_abandon`).
    p.absent(k.abandoned(t.consumer));
    p.value_cmp(
        k.group(l, &st.g),
        CompareOp::Equal,
        Group::record(st.turn, id),
    );
    p.none_in(&index, &entry);
    p.exists(entry);
    let start = with_id(&readies, id);
    p.still(&start, &prefix_end(&readies), 2, &st.ready, t.rev);
    let mut m = st.meta.clone();
    m.attempts = m.attempts.saturating_add(1);
    m.state = State::InFlight(t.deadline, *t.consumer);
    p.put(k.meta(l, id), m.encode());
    p.del(start);
    p.put(k.time_entry(l, t.deadline, id), m.time_value());
    // The clock moves to the turn served, never back; the group queues
    // behind it (a group that fell behind gets one delivery, no burst).
    let clock = k.clock(l);
    match st.clock {
        Some(v) => p.value_cmp(clock.clone(), CompareOp::Equal, v.to_string().into_bytes()),
        None => p.absent(clock.clone()),
    }
    let (now, turn) = serve_turn(st.clock.unwrap_or(0), st.turn);
    p.put(clock, now.to_string());
    p.put(k.group(l, &st.g), Group::record(turn, st.next));
    p.del(k.index_entry(l, false, st.turn, id));
    p.del(k.index_entry(l, true, st.turn, id));
    if st.next != 0 {
        p.put(
            k.index_entry(l, false, turn, st.next),
            st.g.as_bytes().to_vec(),
        );
    }
    p.into_txn(vec![get(k.payload(l, id))], failure)
}

impl WorkQueues {
    pub(crate) async fn queue_pop(
        &self,
        queue: &str,
        lane: Lane,
        consumer: &OwnerToken,
        visibility: Duration,
        config: &QueueConfig,
    ) -> Result<PopAttempt> {
        let op = "queue pop";
        let k = self.qkeys(queue);
        let ordered = config.ordered_groups;
        let scan = scan_ops(&k, lane, ordered);
        let mut retry = Retry::new(&self.etcd, op);
        // A lost delivery's fresh reads: the scan, then the details of
        // these groups.
        let mut carried: Option<(Snap, Vec<String>)> = None;
        // The groups likely to be found: their details are read with the
        // scan.
        let mut hint = self.local.seen(queue, lane, ordered);
        loop {
            let (s1, known) = match carried.take() {
                Some(c) => c,
                None => {
                    let mut ops = scan.clone();
                    for g in &hint {
                        ops.extend(detail_ops(&k, lane, g));
                    }
                    (read(&self.etcd, op, ops).await?, std::mem::take(&mut hint))
                }
            };
            let (due, next_at) = due_of(&s1, now_ms(), op)?;
            if !due.is_empty() {
                if advance(&self.etcd, &k, lane, &due, op).await? {
                    retry.within("making due messages ready")?;
                } else {
                    retry.again().await?;
                }
                continue;
            }
            let mut entries = Vec::new();
            for kv in s1.list(1) {
                let (turn, id) =
                    pair_of(kv.key()).ok_or_else(|| corrupt(op, "work queue index"))?;
                let g =
                    std::str::from_utf8(kv.value()).map_err(|_| corrupt(op, "work queue index"))?;
                entries.push((turn, id, g.to_string()));
            }
            if entries.is_empty() {
                self.local.set_seen(queue, lane, ordered, &[]);
                return Ok(PopAttempt::Empty {
                    next_in: next_at.map(until_ms),
                });
            }
            let clock = match s1.one(2) {
                Some(kv) => Some(
                    std::str::from_utf8(kv.value())
                        .ok()
                        .and_then(|v| v.parse::<u64>().ok())
                        .ok_or_else(|| corrupt(op, "work queue clock"))?,
                ),
                None => None,
            };
            let more = entries.len() >= LEVELS;
            let mut groups: Vec<String> = Vec::new();
            for (_, _, g) in &entries {
                if !groups.contains(g) {
                    groups.push(g.clone());
                }
            }
            hint.clone_from(&groups);
            // The details: from the lost transaction if it read them all.
            let (ds, at) = if groups.iter().all(|g| known.contains(g)) {
                (s1, SCAN)
            } else {
                let ops = groups
                    .iter()
                    .flat_map(|g| detail_ops(&k, lane, g))
                    .collect();
                (read(&self.etcd, op, ops).await?, 0)
            };
            let names = if at == SCAN { &known } else { &groups };
            let mut details = HashMap::new();
            for (i, g) in names.iter().enumerate() {
                let Some(gkv) = ds.one(at + 2 * i) else {
                    continue;
                };
                let (turn, ready_id) = Group::parse_record(gkv.value())
                    .ok_or_else(|| corrupt(op, "work queue group"))?;
                let ready = ds.list(at + 2 * i + 1).to_vec();
                let complete = ready.len() <= LEVELS;
                details.insert(
                    g.clone(),
                    Detail {
                        turn,
                        ready_id,
                        ready,
                        complete,
                    },
                );
            }
            let mut steps = match predict(&entries, clock, more, &details, ordered, op)? {
                Some(s) if !s.is_empty() => s,
                _ => {
                    retry.again().await?;
                    continue;
                }
            };
            let dead = |s: &Step| dead_letters(lane, config, s.meta.attempts);
            if let Some(pos) = steps.iter().position(dead) {
                if let Some((st, rkv)) = steps
                    .first()
                    .filter(|_| pos == 0)
                    .and_then(|st| Some((st, st.ready.first()?)))
                {
                    if !dead_letter(&self.etcd, &k, st.id, &st.meta, rkv, op).await? {
                        retry.again().await?;
                    }
                    continue;
                }
                steps.truncate(pos);
            }
            let take = Take {
                k: &k,
                lane,
                ordered,
                rev: ds.rev,
                deadline: deadline_ms(visibility),
                consumer,
            };
            let mut reread = scan.clone();
            for g in &groups {
                reread.extend(detail_ops(&k, lane, g));
            }
            // Last: whether this consumer was abandoned (every level then
            // fails on it).
            let mark_at = reread.len();
            reread.push(get(k.abandoned(consumer)));
            let mut txn: Option<Txn> = None;
            for st in steps.iter().rev() {
                let failure = match txn.take() {
                    Some(t) => vec![TxnOp::txn(t)],
                    None => std::mem::take(&mut reread),
                };
                txn = Some(level_txn(&take, st, failure));
            }
            let Some(txn) = txn else {
                retry.again().await?;
                continue;
            };
            let resp = self.etcd.txn(op, txn).await?;
            let rev = header_rev(&resp);
            let (level, inner) = landed(resp, steps.len());
            let Some(level) = level else {
                let fresh = Snap::at(&inner, rev);
                if fresh.one(mark_at).is_some() {
                    return Ok(PopAttempt::Empty { next_in: None });
                }
                carried = Some((fresh, groups));
                retry.at_once()?;
                continue;
            };
            let st = &steps[level];
            let payload = match inner.op_responses().into_iter().next() {
                Some(TxnOpResponse::Get(mut g)) => g.take_kvs().into_iter().next(),
                _ => None,
            }
            .map(|kv| kv.value().to_vec())
            .ok_or_else(|| corrupt(op, "work queue payload"))?;
            let token = u64::try_from(rev)
                .ok()
                .filter(|t| *t > 0)
                .ok_or_else(|| corrupt(op, "revision"))?;
            let mut meta = st.meta.clone();
            meta.attempts = meta.attempts.saturating_add(1);
            self.local.set_seen(queue, lane, ordered, &groups);
            let mut mine = st.meta.clone();
            mine.attempts = mine.attempts.saturating_add(1);
            mine.state = State::InFlight(take.deadline, *consumer);
            let rev = i64::try_from(token).unwrap_or(0);
            self.local
                .set_mine(queue, lane, st.id, Some(Mine { rev, meta: mine }));
            return Ok(PopAttempt::Delivered {
                message: message_of(st.id, &meta, payload),
                token: FencingToken(token),
            });
        }
    }
}
