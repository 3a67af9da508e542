//! The steps a pop takes before it delivers (see `work_queue/pop.rs`): making due
//! timeline entries ready (delayed messages, lapsed deliveries), and moving
//! a message delivered `max_deliveries` times to the dead lane.

use std::collections::HashMap;

use coord_core::{Lane, Result};
use etcd_client::{KeyValue, TxnOp};

use crate::client::{Etcd, corrupt};
use crate::work_queue::group::{
    AROUND, Around, Landing, around_ops, group_of, insert, landing_ops, remove, set_group,
};
use crate::work_queue::keys::{Group, Meta, QKeys, State, pair_of, parse_time_value, with_id};
use crate::work_queue::plan::{Plan, Snap, apply_first, get, read};

/// A timeline entry that is due.
pub(crate) struct Due {
    kv: KeyValue,
    at: u64,
    id: u64,
    group: String,
}

/// The due entries of the timeline read first in `s`, and the time of the
/// first one not due.
pub(crate) fn due_of(s: &Snap, now: u64, op: &'static str) -> Result<(Vec<Due>, Option<u64>)> {
    let mut due = Vec::new();
    for kv in s.list(0) {
        let (at, id) = pair_of(kv.key()).ok_or_else(|| corrupt(op, "work queue timeline"))?;
        if at > now {
            return Ok((due, Some(at)));
        }
        let (_, group) =
            parse_time_value(kv.value()).ok_or_else(|| corrupt(op, "work queue timeline"))?;
        due.push(Due {
            kv: kv.clone(),
            at,
            id,
            group,
        });
    }
    Ok((due, None))
}

/// Make the due messages ready. `Ok(false)`: lost a race (nothing done).
pub(crate) async fn advance(
    sh: &Etcd,
    k: &QKeys,
    l: Lane,
    due: &[Due],
    op: &'static str,
) -> Result<bool> {
    let mut ops: Vec<TxnOp> = due.iter().map(|d| get(k.meta(l, d.id))).collect();
    let mut groups: Vec<&str> = Vec::new();
    for d in due {
        if !groups.contains(&d.group.as_str()) {
            groups.push(&d.group);
        }
    }
    for g in &groups {
        ops.push(get(k.group(l, g)));
        ops.push(get(k.head(l, g)));
    }
    let s = read(sh, op, ops).await?;
    let mut p = Plan::new();
    // Group -> (its record and head as read, the group as read, changed).
    type Changed<'a> = HashMap<&'a str, (&'a KeyValue, &'a KeyValue, Group, Group)>;
    let mut changed: Changed<'_> = HashMap::new();
    for (i, d) in due.iter().enumerate() {
        p.same(&d.kv);
        p.del(d.kv.key().to_vec());
        let Some(mkv) = s.one(i) else {
            // An entry without its message: only the entry goes.
            p.absent(k.meta(l, d.id));
            continue;
        };
        p.same(mkv);
        let mut meta =
            Meta::decode(mkv.value()).ok_or_else(|| corrupt(op, "work queue message"))?;
        if meta.at() != Some(d.at) || meta.group != d.group {
            continue;
        }
        meta.state = State::Ready;
        p.put(k.meta(l, d.id), meta.encode());
        p.put(with_id(&k.readies(l, &d.group), d.id), meta.encode());
        let at = due.len() + 2 * groups.iter().position(|g| *g == d.group).unwrap_or(0);
        let (Some(gkv), Some(hkv)) = (s.one(at), s.one(at + 1)) else {
            return Ok(false);
        };
        let old = group_of(gkv, hkv, op)?;
        let e = changed
            .entry(d.group.as_str())
            .or_insert((gkv, hkv, old, old));
        e.3.ready = match e.3.ready {
            0 => d.id,
            r => r.min(d.id),
        };
    }
    for (g, (gkv, hkv, old, new)) in changed {
        p.same(gkv);
        p.same(hkv);
        set_group(&mut p, k, l, g, Some(old), Some(new));
    }
    Ok(sh.txn(op, p.into_txn(vec![], vec![])).await?.succeeded())
}

/// Move the main lane's next message `id` (its ready entry as read: `rkv`)
/// to the dead lane, attempts kept, ready. `Ok(false)`: lost a race.
pub(crate) async fn dead_letter(
    sh: &Etcd,
    k: &QKeys,
    id: u64,
    meta: &Meta,
    rkv: &KeyValue,
    op: &'static str,
) -> Result<bool> {
    let g = meta.group.as_str();
    let mut ops = around_ops(k, Lane::Main, g, id);
    ops.push(get(k.payload(Lane::Main, id)));
    ops.extend(landing_ops(k, Lane::Dead, g));
    let s = read(sh, op, ops).await?;
    let Some(payload) = s.one(AROUND) else {
        return Ok(false);
    };
    let mut p = Plan::new();
    p.same(rkv);
    let Some(mut levels) = remove(p, k, Lane::Main, id, meta, &Around::of(&s, 0), op)? else {
        return Ok(false);
    };
    let mut dead = meta.clone();
    dead.state = State::Ready;
    let v = Landing::of(&s, AROUND + 1);
    for p in &mut levels {
        insert(p, k, Lane::Dead, id, &dead, payload.value(), &v, op)?;
    }
    apply_first(sh, op, levels).await
}
