//! One owner's semaphore calls racing through ONE client (the raw
//! `coord_core::Semaphore` trait: `try_acquire`, `release`, `extend` with
//! one `OwnerToken`). Every call of an owner reads the client's record of
//! it (`Shared::sems`) and etcd, and writes the record (and spares or
//! revokes leases) after its awaits, so a client runs one call per
//! semaphore owner at a time (`Shared::sem_one_call`), as it does per
//! claim for locks, elections and leases (`same_owner_one_client.rs`).
//!
//! Each test runs many rounds on fresh names: the owner's two or three
//! calls are started together, a delay between them spun (0 to 750 µs, or
//! wider: tokio's timer has a millisecond resolution, the windows are a
//! fraction of a local etcd round trip). The answers are recorded; after
//! all rounds (background revocations given two seconds to land) etcd is
//! read straight, and every state the answers imply is checked: a grant
//! answered and never released is still in etcd at the token answered, on
//! a live lease, with the permits asked for, and no other grant of the
//! owner; a release answered true with no grant after it leaves nothing of
//! the owner; the owner's client can still extend and release what it
//! holds. The trait's rule for an owner asking again: "If `owner` already
//! holds a grant of `name`, the attempt succeeds again with the same
//! token".
//!
//! Without the one call at a time, three races break that (the tests
//! below fail):
//! - D1: two attempts with room for both each read no grant of the owner,
//!   take a lease of their own and write their own key `h/<lease>`,
//!   compared absent only by that key and its slots: both are granted,
//!   with two tokens, the owner holding twice what it asked for; the one
//!   recorded second then revokes the other's lease, deleting a grant
//!   answered Granted and never released;
//! - D2: a holder's attempt racing its moving extend: the attempt reads
//!   the grant on lease L; the extend moves it to L2 and records L2; the
//!   attempt records the grant on L as adopted and revokes the replaced
//!   record's lease L2, which carries the moved grant;
//! - D3 (rare): two attempts for the only permit: the loser finds the
//!   winner's grant before the winner recorded it, adopts it and moves it
//!   to its own lease L2; the winner's late record then revokes L2: both
//!   answered Granted, nothing held.
//!
//! This file holds what the files below share: the TTLs and sweeps, the
//! owner's grants and history read from etcd, and the checks of every
//! state the answers imply.

use std::sync::Arc;
use std::time::Duration;

use coord_core::{Attempt, OwnerToken, Semaphore};

use crate::semaphore_support;
use semaphore_support::{Rec, raw_etcd, state};

mod extends;
mod release_between_acquires;
mod two_acquires;

/// The TTL of the grants: never runs out within a test, which checks the
/// grants of its first rounds only after its last. (30 s is too short: a
/// test run beside the crate's other modules outlives it, and its first
/// rounds find their grants expired.)
const TTL: Duration = Duration::from_secs(600);
/// Another TTL: an extend (or an attempt of the holder) with it moves the
/// grant's keys to a new lease.
const TTL2: Duration = Duration::from_secs(900);

/// How long background revocations are given to land.
const SETTLE: Duration = Duration::from_secs(2);

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// The delay of round `i` of a sweep: 0 to 750 µs in 50 µs steps.
fn sweep(i: u64) -> Duration {
    Duration::from_micros((i % 16) * 50)
}

/// A wider sweep (0 to 5.9 ms in 100 µs steps): for a second call that
/// should land around a move (read, lease, transaction: three round
/// trips after the first call began).
fn wide(i: u64) -> Duration {
    Duration::from_micros((i % 60) * 100)
}

type Sem = Arc<dyn Semaphore>;

/// An answer, shortened for a report.
fn short<T: std::fmt::Debug>(r: &coord_core::Result<T>) -> String {
    match r {
        Ok(v) => format!("{v:?}"),
        Err(e) => format!("Err({e})"),
    }
}

fn token(a: &coord_core::Result<Attempt>) -> Option<i64> {
    match a {
        Ok(Attempt::Granted(t)) => Some(t.get() as i64),
        _ => None,
    }
}

/// The owner's grants (`h/` keys whose value names it) of `n` now.
async fn grants_of(p: &str, n: &str, o: &OwnerToken) -> Vec<Rec> {
    let hex = o.to_hex();
    state(p, n)
        .await
        .0
        .into_iter()
        .filter(|r| r.owner == hex)
        .collect()
}

/// The events on the keys of name `n` from revision `from` to now, one a
/// line: revision, put or delete, the key under the name, its lease (for a
/// delete: the lease it was on). Evidence for a report.
async fn history(p: &str, n: &str, from: i64) -> String {
    use etcd_client::{EventType, WatchOptions};
    let dir = format!("{p}sem/{n}/");
    let mut etcd = raw_etcd().await;
    let now = etcd
        .get("none", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let opts = WatchOptions::new()
        .with_prefix()
        .with_start_revision(from.max(1))
        .with_prev_key();
    let mut stream = etcd.watch(dir.as_bytes(), Some(opts)).await.unwrap();
    let mut out = String::new();
    'read: while let Ok(Ok(Some(resp))) =
        tokio::time::timeout(Duration::from_millis(500), stream.message()).await
    {
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            let key = &kv.key_str().unwrap_or("?")[dir.len()..];
            let line = match ev.event_type() {
                EventType::Put => format!(
                    "  {} put    {key} lease {:x} create {}\n",
                    kv.mod_revision(),
                    kv.lease(),
                    kv.create_revision()
                ),
                EventType::Delete => format!(
                    "  {} delete {key} (on lease {:x})\n",
                    kv.mod_revision(),
                    ev.prev_kv().map_or(0, |p| p.lease())
                ),
            };
            out.push_str(&line);
            if kv.mod_revision() >= now {
                break 'read;
            }
        }
    }
    out
}

/// Violations found, by kind.
#[derive(Default)]
struct Found {
    kinds: Vec<(&'static str, Vec<String>)>,
    /// Key histories printed so far (a few per test: each costs a
    /// watch's idle timeout).
    shown: usize,
}

impl Found {
    fn add(&mut self, kind: &'static str, what: String) {
        match self.kinds.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, v)) => v.push(what),
            None => self.kinds.push((kind, vec![what])),
        }
    }

    fn total(&self) -> usize {
        self.kinds.iter().map(|(_, v)| v.len()).sum()
    }

    /// Print the counts, then fail naming the first few of each kind.
    fn assert_none(&self, test: &str, rounds: usize, notes: &str) {
        println!("{test}: {rounds} rounds; {notes}");
        for (k, v) in &self.kinds {
            println!("{test}: {} x {k}", v.len());
        }
        println!("{test}: {} violations", self.total());
        if self.total() == 0 {
            return;
        }
        let mut msg = format!("{test}: {} violations in {rounds} rounds:\n", self.total());
        for (k, v) in &self.kinds {
            msg.push_str(&format!("  {} x {k}, e.g.:\n", v.len()));
            for w in v.iter().take(4) {
                msg.push_str(&format!("    {w}\n"));
            }
        }
        panic!("{msg}");
    }
}

/// The checks on a name whose answers imply the owner holds exactly one
/// grant with create revision `t` (its fencing token; or, where the
/// answers gave two tokens for one grant, one of `also`), of `permits`
/// among those asked for: that grant in etcd, on a live lease of one of the
/// TTLs asked for, no other grant of the owner, slots matching the
/// grants' permits, never more permits than `total`.
async fn check_holds(
    f: &mut Found,
    p: &str,
    (n, o): (&str, &OwnerToken),
    (t, also): (i64, Option<i64>),
    permits: &[u32],
    ttls: &[Duration],
    what: &str,
) {
    let (h, w, slots) = state(p, n).await;
    check_bounds(f, n, &h, slots, what);
    let mine: Vec<&Rec> = h.iter().filter(|r| r.owner == o.to_hex()).collect();
    match mine[..] {
        [] => {
            if f.shown < 3 {
                f.shown += 1;
                println!("{n} ({what}):\n{}", history(p, n, t - 8).await);
            }
            f.add(
                "answered Granted, never released: no grant of the owner left in etcd",
                format!("{n}: token {t}; {what}; places {w:?}"),
            )
        }
        [g] => {
            if g.create != t && Some(g.create) != also {
                f.add(
                    "the owner's only grant is not the token answered",
                    format!("{n}: answered {t}, etcd holds {g:?}; {what}"),
                );
            }
            if !permits.contains(&g.permits) {
                f.add(
                    "the owner's grant holds permits it never asked for",
                    format!("{n}: asked {permits:?}, holds {g:?}; {what}"),
                );
            }
            let mut etcd = raw_etcd().await;
            let l = etcd.lease_time_to_live(g.lease, None).await.unwrap();
            let ok = ttls.iter().any(|d| d.as_secs() as i64 == l.granted_ttl());
            if l.ttl() <= 0 || !ok {
                f.add(
                    "the owner's grant is on a lease not of a TTL asked for",
                    format!(
                        "{n}: lease {} granted {} s, {} s left, asked {ttls:?}; {what}",
                        g.lease,
                        l.granted_ttl(),
                        l.ttl()
                    ),
                );
            }
        }
        _ => f.add(
            "the owner holds two grants of one name",
            format!("{n}: {mine:?}; {what}"),
        ),
    }
}

/// What etcd must hold of any name: grants' permits within the total,
/// one slot key per permit, one grant per owner.
fn check_bounds(f: &mut Found, n: &str, h: &[Rec], slots: usize, what: &str) {
    let sum: u32 = h.iter().map(|r| r.permits).sum();
    if h.iter().any(|r| sum > r.total) {
        f.add(
            "more permits granted than the total",
            format!("{n}: {h:?}; {what}"),
        );
    }
    if slots as u32 != sum {
        f.add(
            "slot keys do not match the permits granted",
            format!("{n}: {slots} slots for {h:?}; {what}"),
        );
    }
}

/// Nothing of the owner left: no grant, no place.
async fn check_nothing(f: &mut Found, p: &str, n: &str, o: &OwnerToken, what: &str) {
    let (h, w, slots) = state(p, n).await;
    check_bounds(f, n, &h, slots, what);
    let hex = o.to_hex();
    if h.iter().chain(w.iter()).any(|r| r.owner == hex) {
        f.add(
            "the owner's keys left after a release answered true",
            format!("{n}: grants {h:?}, places {w:?}; {what}"),
        );
    }
}

/// Through the racing client, once things settled: the owner's grant can
/// be extended (with the TTL of `ttl`) and released, and the release
/// leaves nothing. Catches a local record the race left pointing at a
/// grant or lease that is not the owner's live one.
async fn check_follow_up(
    f: &mut Found,
    c: &Sem,
    p: &str,
    n: &str,
    o: &OwnerToken,
    ttl: Duration,
    what: &str,
) {
    let e = c.extend(n, o.step(), ttl).await;
    let live = !grants_of(p, n, o).await.is_empty();
    let r = c.release(n, o.step()).await;
    if !matches!(e, Ok(true)) || !matches!(r, Ok(true)) {
        f.add(
            "the holder's extend and release afterwards did not both answer true",
            format!(
                "{n}: extend {}, release {} (a grant of the owner in etcd between: {live}); {what}",
                short(&e),
                short(&r)
            ),
        );
    }
    let (h, w, _) = state(p, n).await;
    let hex = o.to_hex();
    if h.iter().chain(w.iter()).any(|r| r.owner == hex) {
        f.add(
            "the owner's keys left after its follow-up release",
            format!("{n}: grants {h:?}, places {w:?}; {what}"),
        );
    }
}
