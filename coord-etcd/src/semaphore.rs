//! FIFO semaphores. Every key of a name lives under `<prefix>sem/<name>/`:
//!
//! - `h/<lease hex>`: a grant, value
//!   `"<owner hex> <permits> <total> <slot>,<slot>.."` (then ` <metadata>`
//!   for a grant made with metadata: see [`split_value`]), on an etcd lease
//!   of the grant's TTL (one lease per grant, as for lock claims; spare
//!   leases are reused); its create revision is the fencing token (as for
//!   locks: etcd's revision, durable and rising across restarts, never
//!   repeated).
//! - `s/<i>` (`0 <= i < total`): permit slot `i`, taken by a grant, on the
//!   grant's lease (value: the owner). A grant of `n` permits takes `n`
//!   free slots in the same transaction as its `h/` key, each compared to
//!   be absent, so the server never lets more than `total` permits be
//!   held, and grants that take different slots do not conflict.
//! - `w/<lease hex>`: a queued waiter, value `"<owner hex> <permits>
//!   <total>"`, on a lease of [`QUEUE_ENTRY_TTL`] renewed by the waiter's
//!   attempts (one at least every [`QUEUE_REFRESH`]); the queue is ordered
//!   by create revision.
//!
//! Grant and place keys are named by a lease, not by their owner (as lock
//! keys are, `claim/attempt.rs`): the lease the key's first write went on. A
//! lease carries one key of a kind at a time and goes back to the spare
//! pool only once that key was deleted by an answered call, so two live
//! grants (or places) never share a key, while the next grant on the spare
//! writes the same key again: a busy name reuses a few keys instead of
//! adding one per acquire to etcd's key index, which every range read on
//! the name walks until a compaction (`tests/it/sem_key_history.rs`). A write
//! whose reply was lost (or that was dropped on its way) is recorded with
//! its key, and the owner's next attempts write that key (on a new lease)
//! compared to be absent, so a write landing late never makes a second
//! grant or place; its lease is never a spare (revoked or adopted). The
//! owner is found in the value: by the attempt's read, by a release or
//! extend of an owner this client has no record of, by `inspect` and by
//! the wake-ups.
//!
//! A key may thus be written again for another owner once its grant (or
//! place) ended, so nothing acts on a key for knowing it exists: a release
//! or extend acts on the grant at the create revision it was written with
//! (its fencing token), and on a place likewise. The same owner may come
//! through several clients (the raw `Semaphore` trait with one token): an
//! attempt that finds the owner's grant or place written through another
//! client adopts it, but only the client that created a lease ever spares
//! or revokes it (see [`SemLocal`]): a lease of another client may already
//! carry that client's next grant. Values of clients before this layout (`h/<owner hex>`,
//! value `"<permits> <total> .."`) are refused as corrupt: every client of
//! a semaphore name must be upgraded together.
//!
//! An attempt reads the name and is granted only if its request and every
//! request queued ahead of it (the whole queue for an owner not in it) fit
//! into the free permits; it then takes free slots chosen at random, and
//! tries again with the state a lost compare-and-swap returns while that
//! state shows room (`semaphore/acquire.rs`). A refused attempt with `queue`
//! joins (or renews its place in) the queue (`semaphore/place.rs`); without it,
//! writes nothing. The total is checked on the read, and every grant or
//! place written compares what that check rested on (a grant or place the
//! read saw, at its create revision, or that the name has none: see
//! `sem_view::Basis`), so the name never has grants or places of two
//! totals, not even when two first grants of an idle name race.
//! Grants once made are released and extended in `semaphore/hold.rs`; wake-ups
//! come from a watch per name and client (`semaphore/watch.rs`).

pub(crate) mod acquire;
pub(crate) mod hold;
pub(crate) mod place;
pub(crate) mod view;
pub(crate) mod watch;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_core::{Error, OwnerToken, Result};
use tokio::time::Instant;

use crate::client::keys::prefix_end;
use crate::client::pool::Keeper;
use crate::client::turns::{OneCall, Turns};
use crate::client::{Etcd, lock};

/// How long a queued waiter's place lasts without an attempt renewing it
/// (as coord-memory's `QUEUE_ENTRY_TTL`).
pub(crate) const QUEUE_ENTRY_TTL: Duration = Duration::from_secs(30);
/// The longest a queued waiter is told to sleep before attempting again,
/// which renews its place.
pub(crate) const QUEUE_REFRESH: Duration = Duration::from_secs(10);
/// When the local bookkeeping is swept.
const PRUNE_AT: usize = 1024;
/// How long one new key's lease may spend trying spares before it grants
/// a new lease (tests/it/semaphore_extend_racing_release.rs).
const SPARE_BUDGET: Duration = Duration::from_secs(1);

/// A semaphore claim of this client: (name, owner).
pub(crate) type SemKey = (Box<str>, [u8; 16]);

/// The [`SemKey`] of `owner` on semaphore `name`.
pub(crate) fn sem_key(name: &str, owner: &OwnerToken) -> SemKey {
    (name.into(), *owner.as_bytes())
}

/// This client's knowledge of one owner's grant and queue place.
///
/// Leases this client created (granted, or taken from its spares) are
/// its own: only those are ever spared or revoked by it. A grant or place
/// that an attempt found already there (the same owner's, written through
/// another client: see [`Grant::own`]) is adopted: this client acts on its
/// key at its create revision, and leaves its lease to the client that
/// created it, which may already have handed it on to another owner.
#[derive(Default)]
pub(crate) struct SemLocal {
    /// The owner's place in the queue (its lease) once written or found.
    pub(crate) waiter: Option<Place>,
    /// The place key (`w/<lease hex>`) a place write of this client was
    /// sent to: its next places write the same key. Only ever named by
    /// one of this client's leases, which is not a spare while recorded.
    pub(crate) place: Option<Vec<u8>>,
    /// The grant key (`h/<lease hex>`) once a grant write of this client
    /// for this owner may have landed (answered, unanswered or dropped):
    /// its next grants write the same key. Only ever named by one of this
    /// client's leases, never a spare while this is recorded (revoked, or
    /// the grant's own); an adopted grant's key is never recorded here.
    pub(crate) hold: Option<Vec<u8>>,
    /// The grant (also one whose write's reply was lost).
    pub(crate) grant: Option<Grant>,
    /// The grant lease's keepalive stream, if open.
    pub(crate) keeper: Option<Keeper>,
    /// The slots the grant holds.
    pub(crate) slots: Vec<u32>,
    /// The lease of a grant transaction dropped on its way (the attempt
    /// was cancelled mid-call), being revoked, and until when it could
    /// live: a grant found on it is not adopted (it is going).
    pub(crate) doomed: Option<(i64, Instant)>,
    /// The leases of grant moves (extends to another TTL) whose answer
    /// this client never saw: such a move may still land, after a later
    /// extend, and put the grant back on its own lease. The next extend
    /// moves the grant onto a fresh lease by its create revision alone, so
    /// that each of them, comparing the lease it saw, fails; it then
    /// revokes these leases, which carry nothing any more.
    pub(crate) moves: Vec<i64>,
}

/// A grant as this client knows it.
#[derive(Clone)]
pub(crate) struct Grant {
    /// Its lease (for a write whose reply was lost: that write's).
    pub(crate) lease: i64,
    /// The lease's TTL in seconds (0 for an adopted grant: unknown, so an
    /// extend moves it to a lease of this client's).
    pub(crate) ttl: u64,
    /// The server keeps the lease at least until then.
    pub(crate) deadline: Instant,
    /// Its key.
    pub(crate) key: Vec<u8>,
    /// Its key's create revision (its fencing token); 0 while unknown (a
    /// write whose reply was lost). A key deleted and written again for a
    /// later grant has another one, so a release or extend compares it.
    pub(crate) rev: i64,
    /// Whether the lease is this client's (see [`SemLocal`]).
    pub(crate) own: bool,
}

/// A queue place as this client knows it.
#[derive(Clone, Copy)]
pub(crate) struct Place {
    /// Its lease.
    pub(crate) lease: i64,
    /// When an attempt last renewed it.
    pub(crate) at: Instant,
    /// Whether the lease is this client's (see [`SemLocal`]).
    pub(crate) own: bool,
}

/// The owner (hex) a grant's or waiter's value names: its first field,
/// 32 hex digits (`None` for a value of an older layout, or not coord's).
pub(crate) fn owner_in(v: &[u8]) -> Option<&[u8]> {
    let hex = v.split(|b| *b == b' ').next()?;
    (hex.len() == 32 && hex.iter().all(u8::is_ascii_hexdigit)).then_some(hex)
}

/// A grant's or waiter's value after its owner, split into its fields
/// (`"<permits> <total>"`, a grant's `" <slot>,<slot>.."` after them) and
/// the grant's metadata: whatever follows the third space after the owner
/// (`"<owner hex> <permits> <total> <slots> <json>"`). A grant without
/// metadata has none.
pub(crate) fn split_value(v: &[u8]) -> (&[u8], Option<&[u8]>) {
    let v = v
        .iter()
        .position(|b| *b == b' ')
        .map_or(&v[v.len()..], |i| &v[i + 1..]);
    let third = v
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b' ')
        .nth(2)
        .map(|(i, _)| i);
    match third {
        Some(i) => (&v[..i], Some(&v[i + 1..]).filter(|m| !m.is_empty())),
        None => (v, None),
    }
}

/// `(permits, total)` of a grant's or waiter's value (`None` without an
/// owner: see [`owner_in`]).
pub(crate) fn parse(v: &[u8]) -> Option<(u32, u32)> {
    owner_in(v)?;
    let mut it = std::str::from_utf8(split_value(v).0).ok()?.split(' ');
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// The slots of a grant's value (`"<owner hex> <permits> <total>
/// <slot>,<slot>.."`).
pub(crate) fn slots_of(v: &[u8]) -> Vec<u32> {
    let s = std::str::from_utf8(split_value(v).0).unwrap_or("");
    s.split(' ')
        .nth(2)
        .map(|l| l.split(',').filter_map(|i| i.parse().ok()).collect())
        .unwrap_or_default()
}

pub(crate) fn mismatch(asked: u32, bound: u32) -> Error {
    Error::invalid(
        "permits_total",
        format!(
            "is {asked}, but the semaphore is in use with permits_total {bound}; \
             the total binds while the name has holders or waiters"
        ),
    )
}

/// The keys of one owner's claims on a name.
pub(crate) struct Names {
    /// The prefix of every key of the name.
    pub(crate) base: Vec<u8>,
    /// The owner's hex, as values name it.
    pub(crate) owner: Vec<u8>,
}

impl Names {
    /// The range of the keys of one kind (`p`: `h/`, `s/` or `w/`).
    pub(crate) fn range(&self, p: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let k = [&self.base[..], p].concat();
        let e = prefix_end(&k);
        (k, e)
    }

    /// The key of slot `i`.
    pub(crate) fn slot(&self, i: u32) -> Vec<u8> {
        [&self.base[..], format!("s/{i}").as_bytes()].concat()
    }

    /// A grant key named by `lease` (`h/<lease hex>`).
    pub(crate) fn hold_on(&self, lease: i64) -> Vec<u8> {
        [&self.base[..], format!("h/{lease:x}").as_bytes()].concat()
    }

    /// A place key named by `lease` (`w/<lease hex>`).
    pub(crate) fn wait_on(&self, lease: i64) -> Vec<u8> {
        [&self.base[..], format!("w/{lease:x}").as_bytes()].concat()
    }

    /// A key no client writes (`w/` itself): what a transaction deletes
    /// where the owner has no place to delete, keeping its answers' order.
    pub(crate) fn nothing(&self) -> Vec<u8> {
        [&self.base[..], b"w/"].concat()
    }

    /// Whether `v` (a grant's or waiter's value) names this owner.
    pub(crate) fn owns(&self, v: &[u8]) -> bool {
        owner_in(v) == Some(&self.owner[..])
    }
}

/// The FIFO semaphores of one backend.
pub(crate) struct Semaphores {
    pub(crate) etcd: Arc<Etcd>,
    /// This client's semaphore grants and queue places.
    pub(crate) sems: Mutex<HashMap<SemKey, SemLocal>>,
    /// One call at a time per owner of a semaphore: see
    /// [`Semaphores::one_call`].
    turns: Turns<SemKey>,
}

impl Semaphores {
    pub(crate) fn new(etcd: Arc<Etcd>) -> Self {
        Semaphores {
            etcd,
            sems: Mutex::new(HashMap::new()),
            turns: Turns::default(),
        }
    }

    /// Wait until no other call of this client on one owner's permits of a
    /// semaphore (`sk`: its name and owner) is under way, as for claims
    /// (`claim/entries.rs`): two attempts of one owner with room for both each wrote a grant of its
    /// own (two tokens, twice the permits) and the second to land revoked
    /// the other's lease; an attempt racing the owner's moving extend
    /// revoked the lease the grant had just moved to
    /// (tests/it/semaphore_same_owner_one_client/).
    pub(crate) async fn one_call(&self, sk: &SemKey) -> OneCall<SemKey> {
        self.turns.take(sk.clone()).await
    }

    pub(crate) fn sem_names(&self, name: &str, owner: &OwnerToken) -> Names {
        let base = self.etcd.keys.sem(name);
        let owner = owner.to_hex().into_bytes();
        Names { base, owner }
    }

    pub(crate) fn sem_local<R>(&self, sk: &SemKey, f: impl FnOnce(&mut SemLocal) -> R) -> R {
        let mut m = lock(&self.sems);
        if m.len() >= PRUNE_AT {
            let now = Instant::now();
            let old = QUEUE_ENTRY_TTL * 2;
            m.retain(|_, s| {
                s.grant.as_ref().is_some_and(|g| g.deadline + old > now)
                    || s.waiter.is_some_and(|w| w.at + old > now)
                    || s.doomed.is_some_and(|(_, until)| until > now)
            });
        }
        f(m.entry(sk.clone()).or_default())
    }

    /// Forget `sk` locally, revoking its own leases in the background
    /// (never an adopted one: see [`SemLocal`]), only if the record's
    /// grant is still `read` (same lease and create revision; or still
    /// none): the grant a call read before awaiting the store. A grant made
    /// again for the owner through this client meanwhile (a concurrent
    /// attempt, which answered it) is left alone
    /// (tests/it/semaphore_extend_racing_release.rs). Checked and removed under one lock.
    pub(crate) fn sem_forget_of(self: &Arc<Self>, sk: &SemKey, read: Option<&Grant>) {
        let id = |g: &Grant| (g.lease, g.rev);
        let removed = {
            let mut m = lock(&self.sems);
            let same = m
                .get(sk)
                .is_some_and(|s| s.grant.as_ref().map(id) == read.map(id));
            if same { m.remove(sk) } else { None }
        };
        if let Some(s) = removed {
            let place = s.waiter.filter(|w| w.own).map(|w| w.lease);
            let grant = s.grant.filter(|g| g.own).map(|g| g.lease);
            // Unseen moves' leases: the grant they might carry is gone.
            for l in place.into_iter().chain(grant).chain(s.moves) {
                self.etcd.revoke_later(l);
            }
        }
    }

    /// A lease of `ttl` seconds for a new key: a spare refreshed now
    /// (spares are tried for [`SPARE_BUDGET`] at most), or a new grant;
    /// the server keeps it at least `ttl` from the instant returned (taken
    /// before the call).
    pub(crate) async fn sem_lease(
        &self,
        ttl: u64,
        op: &'static str,
    ) -> Result<(i64, Option<Keeper>, Instant)> {
        let since = Instant::now();
        // A dead spare costs its not-found retries (350 ms); when every
        // spare is dead (after an etcd restore, say), the rest are left
        // to later calls once SPARE_BUDGET is spent.
        while since.elapsed() < SPARE_BUDGET {
            let Some(s) = self.etcd.take_spare(ttl) else {
                break;
            };
            if let (true, keeper) = self.etcd.refresh(s.id, s.keeper, op).await? {
                return Ok((s.id, keeper, since));
            }
        }
        Ok((self.etcd.grant_lease(ttl, op).await?, None, since))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_values_with_and_without_metadata_decode() {
        let o = "0123456789abcdef0123456789abcdef";
        let v = format!("{o} 2 5 0,3").into_bytes();
        assert_eq!(owner_in(&v), Some(o.as_bytes()));
        assert_eq!(parse(&v), Some((2, 5)));
        assert_eq!(slots_of(&v), vec![0, 3]);
        assert_eq!(split_value(&v), (&b"2 5 0,3"[..], None));
        let w = format!("{o} 1 5").into_bytes();
        assert_eq!(split_value(&w), (&b"1 5"[..], None));
        assert_eq!(parse(&w), Some((1, 5)));
        let v = format!(r#"{o} 2 5 0,3 {{"job": "a b", "n": [1, 2]}}"#).into_bytes();
        assert_eq!(parse(&v), Some((2, 5)));
        assert_eq!(slots_of(&v), vec![0, 3]);
        assert_eq!(
            split_value(&v).1,
            Some(&br#"{"job": "a b", "n": [1, 2]}"#[..])
        );
        // An older layout's value (no owner): not read as a grant.
        assert_eq!(parse(b"2 5 0,3"), None);
        // Not coord's: no panic.
        assert_eq!(parse(b"\xff \xfe"), None);
        assert!(slots_of(b"\xff").is_empty());
    }
}
