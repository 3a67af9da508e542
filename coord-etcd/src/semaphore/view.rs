//! A semaphore attempt's view of a name (one snapshot of its grants,
//! waiters and slots) and its random choice of free slots (see
//! `semaphore/acquire.rs`).

use std::collections::HashSet;
use std::hash::{BuildHasher, Hasher};

use coord_core::{OwnerToken, PermitRequest, Result};
use etcd_client::{Compare, CompareOp, KeyValue, TxnOp, TxnOpResponse, TxnResponse};

use crate::client::{corrupt, first_page, header_rev};
use crate::semaphore::{Names, Semaphores, mismatch, parse};

/// The state of a name as one snapshot saw it.
pub(crate) struct View {
    /// The permits free: the total less those granted, and no more than
    /// the slots free.
    pub(crate) free: u32,
    /// The owner's grant (found by the owner its value names).
    pub(crate) mine: Option<KeyValue>,
    /// The owner's place in the queue (likewise).
    pub(crate) my_place: Option<KeyValue>,
    /// Permits of the waiters queued ahead of the owner (all of them if it
    /// is not queued).
    pub(crate) ahead: u32,
    /// The slots taken (below the total).
    pub(crate) taken: HashSet<u32>,
    /// What the total was checked against, for a write to compare.
    pub(crate) basis: Basis,
}

/// What a read's check of the total rests on. A write made on that read
/// (a grant, a place) compares it, so that the name never has grants or
/// places of two totals: either the name still has no grant and no place
/// (a first grant of another total since the read fails the compare), or a
/// grant or place the read saw, with this total, still lives (at its
/// create revision: a key written again is another grant or place), and
/// so, as every write compares this, every live one has this total.
/// A write whose compare fails reads the name again.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Basis {
    /// The read saw no grant or place of another owner: the write
    /// compares that the name has none at all (the owner's own place, if
    /// live, is compared by the grant that deletes it; a place is written
    /// only where the owner's own lapsed).
    Idle,
    /// The newest grant or place of another owner: its key and create
    /// revision.
    Key(Vec<u8>, i64),
}

impl Basis {
    /// The compares that hold iff the basis still stands.
    pub(crate) fn compares(&self, n: &Names) -> Vec<Compare> {
        match self {
            Basis::Key(k, rev) => vec![Compare::create_revision(k.clone(), CompareOp::Equal, *rev)],
            // Over a range, every key must match: none has create
            // revision 0, and an empty range compares as an absent key.
            Basis::Idle => [&b"h/"[..], b"w/"]
                .iter()
                .map(|p| {
                    let (k, e) = n.range(p);
                    Compare::create_revision(k, CompareOp::Equal, 0).with_range(e)
                })
                .collect(),
        }
    }
}

/// The reads of one snapshot of a name: the first page of its grants,
/// waiters (with values) and slots (keys only), answered in this order
/// (the rest is read by [`Semaphores::sem_lists`], at the same revision).
pub(crate) fn reads(n: &Names) -> Vec<TxnOp> {
    let get = |p: &[u8], keys_only: bool| {
        let (k, e) = n.range(p);
        first_page(k, &e, keys_only)
    };
    vec![get(b"h/", false), get(b"w/", false), get(b"s/", true)]
}

/// A name's grants, waiters and slots, as [`reads`] read them.
pub(crate) type Lists = (Vec<KeyValue>, Vec<KeyValue>, Vec<KeyValue>);

impl Semaphores {
    /// The whole of each range [`reads`] read in `resp`: the first pages
    /// it answered, then the next pages at its revision (one snapshot).
    pub(crate) async fn sem_lists(
        &self,
        n: &Names,
        resp: TxnResponse,
        op: &'static str,
    ) -> Result<Lists> {
        let rev = header_rev(&resp);
        let mut out = Vec::with_capacity(3);
        for (r, (p, keys_only)) in resp.op_responses().into_iter().zip([
            (&b"h/"[..], false),
            (b"w/", false),
            (b"s/", true),
        ]) {
            let TxnOpResponse::Get(g) = r else {
                return Err(corrupt(op, "a semaphore read's answer"));
            };
            let (_, e) = n.range(p);
            out.push(self.etcd.rest_of(op, g, &e, rev, keys_only).await?);
        }
        let mut it = out.into_iter();
        match (it.next(), it.next(), it.next()) {
            (Some(h), Some(w), Some(s)) => Ok((h, w, s)),
            _ => Err(corrupt(op, "a semaphore read's answer")),
        }
    }
}

/// The name's state from the lists [`Semaphores::sem_lists`] read,
/// checking the total.
pub(crate) fn view_of(
    n: &Names,
    req: &PermitRequest,
    lists: Lists,
    op: &'static str,
) -> Result<View> {
    let (holds, waits, slots) = lists;
    let mut held = 0u32;
    let mut mine = None;
    // The newest grant or place of another owner.
    let basis = holds
        .iter()
        .chain(&waits)
        .filter(|kv| !n.owns(kv.value()))
        .max_by_key(|kv| kv.create_revision())
        .map_or(Basis::Idle, |kv| {
            Basis::Key(kv.key().to_vec(), kv.create_revision())
        });
    for kv in holds {
        let (permits, total) =
            parse(kv.value()).ok_or_else(|| corrupt(op, "a semaphore key's value"))?;
        if total != req.total {
            return Err(mismatch(req.total, total));
        }
        held = held.saturating_add(permits);
        if n.owns(kv.value()) {
            mine = Some(kv);
        }
    }
    let mut waiters = Vec::new();
    let mut my_place = None;
    for kv in waits {
        let (permits, total) =
            parse(kv.value()).ok_or_else(|| corrupt(op, "a semaphore key's value"))?;
        if total != req.total {
            return Err(mismatch(req.total, total));
        }
        waiters.push((kv.create_revision(), permits));
        // The owner's place (its earliest, should a late write have
        // queued it twice for a moment).
        if n.owns(kv.value())
            && my_place
                .as_ref()
                .is_none_or(|p: &KeyValue| p.create_revision() > kv.create_revision())
        {
            my_place = Some(kv);
        }
    }
    let taken: HashSet<u32> = slots
        .iter()
        .filter_map(|kv| {
            let i = kv.key().get(n.base.len() + 2..)?;
            std::str::from_utf8(i).ok()?.parse::<u32>().ok()
        })
        .filter(|i| *i < req.total)
        .collect();
    let before = my_place
        .as_ref()
        .map_or(i64::MAX, |kv| kv.create_revision());
    let ahead = waiters
        .iter()
        .filter(|(r, _)| *r < before)
        .fold(0u32, |a, (_, p)| a.saturating_add(*p));
    let free_slots = req.total - taken.len() as u32;
    Ok(View {
        free: req.total.saturating_sub(held).min(free_slots),
        mine,
        my_place,
        ahead,
        taken,
        basis,
    })
}

/// Random numbers for the slot choice: std's randomly keyed hasher over
/// the owner and a counter (independent across owners and processes).
pub(crate) struct Dice {
    keys: std::collections::hash_map::RandomState,
    owner: [u8; 16],
    n: u64,
}

impl Dice {
    pub(crate) fn new(owner: &OwnerToken) -> Self {
        Dice {
            keys: std::collections::hash_map::RandomState::new(),
            owner: *owner.as_bytes(),
            n: 0,
        }
    }

    /// A number in `0..bound` (`bound > 0`).
    fn below(&mut self, bound: u32) -> u32 {
        let mut h = self.keys.build_hasher();
        h.write(&self.owner);
        h.write_u64(self.n);
        self.n += 1;
        ((u128::from(h.finish()) * u128::from(bound)) >> 64) as u32
    }
}

/// `want` of the slots `0..total` not in `taken`, at random, ascending
/// (`want` no more than the slots free). Costs O(`taken` + `want`): where
/// at least half the slots are free, random slots are drawn until enough
/// free ones are found (fewer than two draws per slot expected);
/// otherwise the free slots, then fewer than twice the taken ones, are
/// listed and drawn from.
pub(crate) fn choose(taken: &HashSet<u32>, total: u32, want: u32, dice: &mut Dice) -> Vec<u32> {
    let want = want as usize;
    let mut out = Vec::with_capacity(want);
    if total as usize > 2 * taken.len() + 64 {
        while out.len() < want {
            let i = dice.below(total);
            if !taken.contains(&i) && !out.contains(&i) {
                out.push(i);
            }
        }
    } else {
        let mut free: Vec<u32> = (0..total).filter(|i| !taken.contains(i)).collect();
        for k in 0..want.min(free.len()) {
            let j = k + dice.below((free.len() - k) as u32) as usize;
            free.swap(k, j);
            out.push(free[k]);
        }
    }
    out.sort_unstable();
    out
}
