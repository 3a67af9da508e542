//! The two changes every work queue operation is made of (see
//! `work_queue.rs`): [`remove`] takes a message out of its lane, [`insert`]
//! puts one into a lane; both keep the group's record, head and candidate
//! index entries right ([`set_group`]), and add to a [`Plan`] the compares
//! that what they read still holds.

use coord_core::{Lane, Result};
use etcd_client::{CompareOp, GetOptions, KeyValue, TxnOp};

use crate::client::corrupt;
use crate::client::keys::prefix_end;
use crate::work_queue::keys::{Group, Meta, QKeys, after, id_of, with_id};
use crate::work_queue::plan::{Plan, Snap, get, range};

/// Write group `g` as `new` (`None`: delete it) where it differs from
/// `old`: its record, its head, and its entries in both candidate indexes.
pub(crate) fn set_group(
    p: &mut Plan,
    k: &QKeys,
    l: Lane,
    g: &str,
    old: Option<Group>,
    new: Option<Group>,
) {
    match new {
        None => {
            if old.is_some() {
                p.del(k.group(l, g));
                p.del(k.head(l, g));
            }
        }
        Some(n) => {
            if old.map(|o| (o.turn, o.ready)) != Some((n.turn, n.ready)) {
                p.put(k.group(l, g), Group::record(n.turn, n.ready));
            }
            if old.map(|o| o.head) != Some(n.head) {
                p.put(k.head(l, g), Group::head_value(n.head));
            }
        }
    }
    for ordered in [false, true] {
        let entry = |x: Option<Group>| {
            x.and_then(|x| x.entry(ordered))
                .map(|(turn, id)| k.index_entry(l, ordered, turn, id))
        };
        let (o, n) = (entry(old), entry(new));
        if o != n {
            if let Some(o) = o {
                p.del(o);
            }
            if let Some(n) = n {
                p.put(n, g.as_bytes().to_vec());
            }
        }
    }
}

/// The group read from its record and head.
pub(crate) fn group_of(record: &KeyValue, head: &KeyValue, op: &'static str) -> Result<Group> {
    Group::of(record.value(), head.value()).ok_or_else(|| corrupt(op, "work queue group"))
}

/// The id at the end of `kv`'s key.
pub(crate) fn id_in(kv: &KeyValue, op: &'static str) -> Result<u64> {
    id_of(kv.key()).ok_or_else(|| corrupt(op, "work queue key"))
}

/// How many of a group's messages from the one taken out [`around_ops`]
/// reads: that one and those right behind it, each a possible next head.
const MEMBERS_READ: i64 = 17;

/// What taking message `id` out of its group needs: the group's record
/// and head, its messages from `id` ([`MEMBERS_READ`]) and its ready
/// messages from `id` (two), and
/// the lane's first two groups (keys only). Five reads, for
/// [`Around::of`].
pub(crate) fn around_ops(k: &QKeys, l: Lane, g: &str, id: u64) -> Vec<TxnOp> {
    let members = k.members(l, g);
    let readies = k.readies(l, g);
    let groups = k.groups(l);
    vec![
        get(k.group(l, g)),
        get(k.head(l, g)),
        range(with_id(&members, id), prefix_end(&members), MEMBERS_READ),
        range(with_id(&readies, id), prefix_end(&readies), 2),
        TxnOp::get(
            groups.clone(),
            Some(
                GetOptions::new()
                    .with_range(prefix_end(&groups))
                    .with_limit(2)
                    .with_keys_only(),
            ),
        ),
    ]
}

/// How many reads [`around_ops`] makes.
pub(crate) const AROUND: usize = 5;

/// The answers of [`around_ops`] from operation `at` on.
pub(crate) struct Around<'a> {
    pub(crate) group: Option<&'a KeyValue>,
    pub(crate) head: Option<&'a KeyValue>,
    members: &'a [KeyValue],
    readies: &'a [KeyValue],
    groups: &'a [KeyValue],
    rev: i64,
}

impl<'a> Around<'a> {
    pub(crate) fn of(s: &'a Snap, at: usize) -> Around<'a> {
        Around {
            group: s.one(at),
            head: s.one(at + 1),
            members: s.list(at + 2),
            readies: s.list(at + 3),
            groups: s.list(at + 4),
            rev: s.rev,
        }
    }
}

/// Take message `id` (record `meta`, compared by the caller in `p`)
/// out of lane `l`: its keys, its place in its group (the next message
/// becomes the group's head or lowest ready one), the group when it was
/// its last message, and the lane's clock when that was the lane's last
/// group. A message that is neither its group's head nor ready (an ack's,
/// mostly) changes nothing shared and compares only that it is not the
/// head.
///
/// The head's removal names the group's next message as its head, so it
/// relies on that message still being there. The messages right behind
/// the head are the ones the group's other consumers are about to ack, so
/// one such guess loses to them again and again: the removal offers one
/// level per message read behind the head (the first of them still there,
/// nothing landed before it) with that message not ready, one more before
/// it for the one read as the group's lowest ready message, and, when the
/// read saw the group's end, one where none is left. See [`nest`](crate::work_queue::plan::nest).
///
/// `Ok(None)`: the reads do not agree with each other (a concurrent
/// change); try again.
pub(crate) fn remove(
    mut p: Plan,
    k: &QKeys,
    l: Lane,
    id: u64,
    meta: &Meta,
    a: &Around<'_>,
    op: &'static str,
) -> Result<Option<Vec<Plan>>> {
    let g = meta.group.as_str();
    let (Some(gkv), Some(hkv)) = (a.group, a.head) else {
        return Ok(None);
    };
    let old = group_of(gkv, hkv, op)?;
    p.del(k.meta(l, id));
    p.del(k.payload(l, id));
    let members = k.members(l, g);
    let mine = with_id(&members, id);
    p.del(mine.clone());
    if let Some(t) = meta.at() {
        p.del(k.time_entry(l, t, id));
    }
    let readies = k.readies(l, g);
    let mut new = old;
    // Whether the group's record is compared unchanged (then `new.ready`
    // is exactly what follows).
    let pinned = meta.ready();
    if pinned {
        let rk = with_id(&readies, id);
        p.del(rk.clone());
        p.same(gkv);
        if old.ready == id {
            if a.readies.first().map(|kv| kv.key()) != Some(&rk[..]) {
                return Ok(None);
            }
            p.still(&rk, &prefix_end(&readies), 2, a.readies, a.rev);
            new.ready = match a.readies.get(1) {
                Some(kv) => id_in(kv, op)?,
                None => 0,
            };
        }
    }
    if old.head != id {
        // The group keeps its head (older than this message), so its
        // ordered entry stays as it is.
        p.value_cmp(k.head(l, g), CompareOp::NotEqual, Group::head_value(id));
        set_group(&mut p, k, l, g, Some(old), Some(new));
        return Ok(Some(vec![p]));
    }
    p.same(hkv);
    match a.members.first() {
        Some(kv) if kv.key() == &mine[..] => p.same(kv),
        _ => return Ok(None),
    }
    let from = after(&mine);
    let mut levels = Vec::new();
    for n in &a.members[1..] {
        let next = id_in(n, op)?;
        let mut q = p.clone();
        // The first message behind this one still there: whatever was
        // between them is gone, and nothing landed there since.
        q.none_in(&from, n.key());
        q.exists_as(n);
        if pinned {
            if new.ready != next {
                q.absent(with_id(&readies, next));
            }
            let head = Group { head: next, ..new };
            set_group(&mut q, k, l, g, Some(old), Some(head));
            levels.push(q);
            continue;
        }
        if old.ready == next {
            // The group's lowest ready message, as read: its ordered entry
            // appears.
            let mut ready = q.clone();
            let r = Group::record(old.turn, next);
            ready.value_cmp(k.group(l, g), CompareOp::Equal, r);
            let was = Group { ready: next, ..old };
            let now = Group { head: next, ..was };
            set_group(&mut ready, k, l, g, Some(was), Some(now));
            levels.push(ready);
        }
        // Not ready (a delivery may have taken it since the read): the
        // group's record stays as it is, whatever it says by then, and no
        // ordered entry appears.
        q.absent(with_id(&readies, next));
        let was = Group { ready: 0, ..old };
        set_group(
            &mut q,
            k,
            l,
            g,
            Some(was),
            Some(Group { head: next, ..was }),
        );
        levels.push(q);
    }
    if a.members.len() >= MEMBERS_READ as usize || new.ready != 0 {
        return Ok(Some(levels).filter(|l| !l.is_empty()));
    }
    // The group's end was read: none of the messages behind is left.
    p.none_in(&from, &prefix_end(&members));
    p.same(gkv);
    set_group(&mut p, k, l, g, Some(old), None);
    let gk = k.group(l, g);
    match a.groups.iter().find(|kv| kv.key() != gk) {
        // Another group keeps the lane (and its clock) alive.
        Some(other) => p.exists_as(other),
        None => {
            // The lane's last group: its clock goes too (a lane without
            // groups starts again at 0, which orders nothing differently).
            let groups = k.groups(l);
            p.none_in(&groups, &gk);
            p.none_in(&after(&gk), &prefix_end(&groups));
            p.del(k.clock(l));
        }
    }
    levels.push(p);
    Ok(Some(levels))
}

/// How many of a group's first ready messages [`landing_ops`] reads.
const OLDER_READ: i64 = 16;

/// What putting a message into group `g` of lane `l` needs: the group's
/// record and head, the lane's clock, and the group's first
/// [`OLDER_READ`] ready messages. [`LANDING`] reads, for [`Landing::of`].
pub(crate) fn landing_ops(k: &QKeys, l: Lane, g: &str) -> Vec<TxnOp> {
    let r = k.readies(l, g);
    let end = prefix_end(&r);
    vec![
        get(k.group(l, g)),
        get(k.head(l, g)),
        get(k.clock(l)),
        TxnOp::get(
            r,
            Some(
                GetOptions::new()
                    .with_range(end)
                    .with_limit(OLDER_READ)
                    .with_keys_only(),
            ),
        ),
    ]
}

/// How many reads [`landing_ops`] makes.
pub(crate) const LANDING: usize = 4;

/// The answers of [`landing_ops`] from operation `at` on.
pub(crate) struct Landing<'a> {
    pub(crate) group: Option<&'a KeyValue>,
    pub(crate) head: Option<&'a KeyValue>,
    clock: Option<&'a KeyValue>,
    readies: &'a [KeyValue],
}

impl<'a> Landing<'a> {
    pub(crate) fn of(s: &'a Snap, at: usize) -> Landing<'a> {
        Landing {
            group: s.one(at),
            head: s.one(at + 1),
            clock: s.one(at + 2),
            readies: s.list(at + 3),
        }
    }
}

/// Put message `id` (record `meta`, `payload`) into lane `l`: ready, or
/// on the timeline; a group new to the lane starts at the lane's clock + 1.
#[allow(clippy::too_many_arguments)]
pub(crate) fn insert(
    p: &mut Plan,
    k: &QKeys,
    l: Lane,
    id: u64,
    meta: &Meta,
    payload: &[u8],
    v: &Landing<'_>,
    op: &'static str,
) -> Result<()> {
    let g = meta.group.as_str();
    p.put(k.meta(l, id), meta.encode());
    p.put(k.payload(l, id), payload.to_vec());
    p.put(with_id(&k.members(l, g), id), Vec::new());
    let ready = match meta.at() {
        None => {
            p.put(with_id(&k.readies(l, g), id), meta.encode());
            id
        }
        Some(t) => {
            p.put(k.time_entry(l, t, id), meta.time_value());
            0
        }
    };
    match (v.group, v.head) {
        (Some(gkv), Some(hkv)) => {
            let old = group_of(gkv, hkv, op)?;
            let lowest = match (old.ready, ready) {
                (0, r) | (r, 0) => r,
                (a, b) => a.min(b),
            };
            let new = Group {
                turn: old.turn,
                head: old.head.min(id),
                ready: lowest,
            };
            if id < old.head {
                p.same(gkv);
                p.same(hkv);
            } else {
                // Behind the head, whoever it is by then.
                p.value_cmp(k.head(l, g), CompareOp::Less, Group::head_value(id));
                // The group's first ready messages read that are older
                // than this one (the record's lowest ready id must be the
                // first of them).
                let older: Vec<&KeyValue> = v
                    .readies
                    .iter()
                    .take_while(|kv| id_of(kv.key()).is_some_and(|r| r < id))
                    .collect();
                let agrees = older.first().and_then(|kv| id_of(kv.key())) == Some(old.ready);
                if let (true, true, Some(last)) = (ready != 0, agrees, older.last()) {
                    // A ready message behind older ready ones changes
                    // nothing the group's record holds (its turn, its
                    // lowest ready id) and so none of its index entries.
                    // It needs the same group still there, and the
                    // highest of the older ready messages read unchanged:
                    // that one ready all along, the group kept a candidate
                    // older than this message, and none of its messages
                    // above that one was delivered meanwhile (a delivery
                    // takes the lowest ready id first), so this one lands
                    // in its place in the group's order. Not the record
                    // unchanged: every delivery of the group changes that,
                    // and a push that compared it lost to every pop of a
                    // busy group.
                    p.exists_as(gkv);
                    p.same(last);
                    return Ok(());
                }
                p.same(gkv);
            }
            set_group(p, k, l, g, Some(old), Some(new));
        }
        (None, None) => {
            p.absent(k.group(l, g));
            p.absent(k.head(l, g));
            let turn: u64 = match v.clock {
                Some(kv) => {
                    p.same(kv);
                    std::str::from_utf8(kv.value())
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| corrupt(op, "work queue clock"))?
                }
                None => {
                    p.absent(k.clock(l));
                    0
                }
            };
            // A group joining the lane starts after the turn being served:
            // one that leaves and comes back does not go before groups
            // that waited.
            let new = Group {
                turn: turn.saturating_add(1),
                head: id,
                ready,
            };
            set_group(p, k, l, g, None, Some(new));
        }
        _ => {
            return Err(corrupt(
                op,
                "work queue group (its record without its head)",
            ));
        }
    }
    Ok(())
}
