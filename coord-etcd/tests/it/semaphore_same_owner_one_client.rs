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

use std::sync::Arc;
use std::time::Duration;

use conformance::spin;
use coord_core::{Attempt, OwnerToken, PermitRequest, Semaphore};
use tokio::time::sleep;

use crate::semaphore_support;
use semaphore_support::{Rec, coord, raw, raw_etcd, req, state, unique};

/// The TTL of the grants: never runs out within a test, which checks the
/// grants of its first rounds only after its last. (30 s is too short: a
/// test run beside the crate's other modules outlives it, and its first
/// rounds find their grants expired.)
const TTL: Duration = Duration::from_secs(600);
/// Another TTL: an extend (or an attempt of the holder) with it moves the
/// grant's keys to a new lease.
const TTL2: Duration = Duration::from_secs(900);
/// A third TTL (a second moving extend).
const TTL3: Duration = Duration::from_secs(1200);

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
    let e = c.extend(n, o, ttl).await;
    let live = !grants_of(p, n, o).await.is_empty();
    let r = c.release(n, o).await;
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

/// Two attempts of one owner (no grant yet) on a fresh name, started
/// together through one client, `a` first and `b` after a spun delay:
/// the round's answers and the owner's grants right after both answered
/// (before background revocations land).
async fn two_acquires(
    c: &Sem,
    p: &str,
    n: &'static str,
    o: OwnerToken,
    (a, b): (PermitRequest, PermitRequest),
    delay: Duration,
) -> (
    coord_core::Result<Attempt>,
    coord_core::Result<Attempt>,
    usize,
) {
    let first = {
        let c = c.clone();
        tokio::spawn(async move { c.try_acquire(n, &o, &a).await })
    };
    tokio::task::yield_now().await;
    spin(delay);
    let second = c.try_acquire(n, &o, &b).await;
    let first = first.await.unwrap();
    let at_once = grants_of(p, n, &o).await.len();
    (first, second, at_once)
}

/// Two concurrent attempts of one owner, `a` and `b`, on fresh names,
/// `rounds` rounds. Checked: both answered Granted (the total always has
/// room for either); both with the same token (the trait: an owner that
/// holds is granted again with the same token, and nothing released it);
/// the owner never had two grants (right after the answers); afterwards
/// its one grant is the token answered, on a live lease; its client
/// extends and releases it.
async fn acquires_race(tag: &str, rounds: u64, a: PermitRequest, b: PermitRequest) {
    let p = unique(tag);
    let cc = coord(&p).await;
    let c = raw(&cc);
    let mut f = Found::default();
    let mut done = Vec::new();
    let (mut same, mut differ) = (0, 0);
    let mut answers = Vec::new();
    for i in 0..rounds {
        let n = leak(format!("a{i}"));
        let o = OwnerToken::random();
        answers.push((n, o, two_acquires(&c, &p, n, o, (a, b), sweep(i)).await));
    }
    for (n, o, (x, y, at_once)) in answers {
        let what = format!("answers {} / {}", short(&x), short(&y));
        if at_once > 1 {
            f.add(
                "two grants of the owner in etcd once both attempts answered",
                format!("{n}: {at_once} grants; {what}"),
            );
        }
        match (token(&x), token(&y)) {
            (Some(tx), Some(ty)) if tx == ty => {
                same += 1;
                done.push((n, o, (tx, None), what));
            }
            (Some(tx), Some(ty)) => {
                differ += 1;
                f.add(
                    "both attempts answered Granted with different tokens",
                    format!("{n}: {what}"),
                );
                done.push((n, o, (tx, Some(ty)), what));
            }
            _ => f.add("an attempt not answered Granted", format!("{n}: {what}")),
        }
    }
    sleep(SETTLE).await;
    let permits = [a.permits, b.permits];
    let ttls = [a.ttl, b.ttl];
    let mut shown = 0;
    for (n, o, (t, also), what) in &done {
        check_holds(&mut f, &p, (n, o), (*t, *also), &permits, &ttls, what).await;
        if let Some(u) = also {
            let live: Vec<i64> = grants_of(&p, n, o).await.iter().map(|r| r.create).collect();
            for x in [*t, *u].iter().filter(|x| !live.contains(x)) {
                f.add(
                    "a grant answered Granted (never released) gone from etcd",
                    format!("{n}: token {x} gone, the owner's grants now {live:?}; {what}"),
                );
            }
            if shown < 2 {
                shown += 1;
                println!(
                    "{tag} {n} ({what}):\n{}",
                    history(&p, n, t.min(u) - 8).await
                );
            }
        }
    }
    for (n, o, _, what) in &done {
        check_follow_up(&mut f, &c, &p, n, o, a.ttl, what).await;
    }
    f.assert_none(
        tag,
        rounds as usize,
        &format!("both Granted with one token in {same}, with two tokens in {differ}"),
    );
}

/// Same TTL, one permit each, room for both (total 2). Each attempt
/// reads no grant of the owner, takes a lease (L1, L2) and writes its own
/// key `h/<L1>`, `h/<L2>` with free slots: nothing in the grant
/// transaction compares the owner's other keys (D1 without one call at a
/// time: about a third of the rounds fail, those where the two attempts
/// draw different slots).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_acquires_with_room_for_both_make_one_grant() {
    let r = req(1, 2, TTL, false);
    acquires_race("sso-acq-room", 320, r, r).await;
}

/// Same TTL, the only permit (total 1): one attempt's slot compare
/// fails and its next round finds the other's grant (adopting it if the
/// winner has not recorded it yet). D3 without one call at a time fails
/// rarely (0 to 4 rounds of several hundred), when the winner's task is
/// polled late after its reply: the loser has by then adopted and moved
/// the grant, and the winner's record revokes the lease it moved to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_acquires_for_the_only_permit_keep_the_grant() {
    let r = req(1, 1, TTL, false);
    acquires_race("sso-acq-one", 150, r, r).await;
}

/// Two TTLs, the only permit: the loser finds the owner's grant of
/// the other TTL and moves it (`sem_extend`) to a lease of its TTL. D3 as
/// above (rare).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_acquires_of_two_ttls_for_the_only_permit_keep_the_grant() {
    acquires_race(
        "sso-acq-ttl",
        150,
        req(1, 1, TTL, false),
        req(1, 1, TTL2, false),
    )
    .await;
}

/// Different permit counts (1 and 2), room for both (total 4): D1 would
/// have the owner hold 3 permits for a moment, then one of the grants
/// answered revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_acquires_of_different_permits_make_one_grant() {
    acquires_race(
        "sso-acq-permits",
        320,
        req(1, 4, TTL, false),
        req(2, 4, TTL, false),
    )
    .await;
}

/// Owner O holds the only permit of a fresh name (TTL) through client C.
/// Through C: an extend of O (the grant's TTL in even rounds: a keepalive;
/// another TTL in odd rounds: a move of its keys to a new lease, then the
/// old lease revoked) and, after a spun delay, a release of O. The release
/// must answer true (the grant is live until it), and leave nothing of O.
/// Then O is granted the name again through C (the TTL of the first grant:
/// it may take a lease the race spared), and, once background revocations
/// landed, that grant must be in etcd at its token, and C must extend and
/// release it. Fails if a release of a live grant answers false, if a move
/// lands after a release and brings the grant back, or if either call
/// leaves a record or spare that costs the next grant its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_racing_a_release_leaves_nothing_and_the_next_grant_holds() {
    let tag = "sso-ext-rel";
    let p = unique(tag);
    let cc = coord(&p).await;
    let c = raw(&cc);
    let mut f = Found::default();
    let one = req(1, 1, TTL, false);
    let mut next = Vec::new();
    let mut ext_true = [0; 2];
    let rounds = 360u64;
    for i in 0..rounds {
        let n = leak(format!("e{i}"));
        let o = OwnerToken::random();
        let ettl = if i % 2 == 0 { TTL } else { TTL2 };
        let t0 = token(&c.try_acquire(n, &o, &one).await).expect("the first grant");
        let ext = {
            let c = c.clone();
            tokio::spawn(async move { c.extend(n, &o, ettl).await })
        };
        tokio::task::yield_now().await;
        spin(if i % 2 == 0 {
            sweep(i / 2)
        } else {
            wide(i / 2)
        });
        let r = c.release(n, &o).await;
        let e = ext.await.unwrap();
        ext_true[(i % 2) as usize] += usize::from(matches!(e, Ok(true)));
        let what = format!(
            "token {t0}, extend {}s {}, release {}",
            ettl.as_secs(),
            short(&e),
            short(&r)
        );
        if !matches!(r, Ok(true)) {
            f.add(
                "the release of a live grant not answered true",
                what.clone(),
            );
        }
        check_nothing(&mut f, &p, n, &o, &what).await;
        let a = c.try_acquire(n, &o, &one).await;
        match token(&a) {
            Some(t) => next.push((n, o, t, what)),
            None => f.add(
                "the next attempt on a free name not granted",
                format!("{n}: {}; {what}", short(&a)),
            ),
        }
    }
    sleep(SETTLE).await;
    for (n, o, t, what) in &next {
        let what = format!("{what}; then granted {t}");
        check_holds(&mut f, &p, (n, o), (*t, None), &[1], &[TTL], &what).await;
    }
    for (n, o, _, what) in &next {
        check_follow_up(&mut f, &c, &p, n, o, TTL, what).await;
    }
    f.assert_none(
        tag,
        rounds as usize,
        &format!(
            "extends answered true: {} of the same TTL, {} moving",
            ext_true[0], ext_true[1]
        ),
    );
}

/// Owner O holds the only permit of a fresh name (TTL) through client C.
/// Through C, concurrently: an extend of O to TTL2 (a move) and, after a
/// spun delay, an extend of O to TTL3 (another move) in even rounds, or
/// with the grant's TTL (a keepalive, or a move if the first moved it
/// already) in odd ones. Nobody releases: both answer true, and afterwards
/// O's one grant is still there at its token, on a live lease; C extends
/// and releases it. Fails if either extend answers false, or one revokes
/// the lease the other moved the grant to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_extends_of_other_ttls_keep_the_grant() {
    let tag = "sso-ext-ext";
    let p = unique(tag);
    let cc = coord(&p).await;
    let c = raw(&cc);
    let mut f = Found::default();
    let one = req(1, 1, TTL, false);
    let mut held = Vec::new();
    let rounds = 320u64;
    for i in 0..rounds {
        let n = leak(format!("x{i}"));
        let o = OwnerToken::random();
        let t = token(&c.try_acquire(n, &o, &one).await).expect("the first grant");
        let second = if i % 2 == 0 { TTL3 } else { TTL };
        let e1 = {
            let c = c.clone();
            tokio::spawn(async move { c.extend(n, &o, TTL2).await })
        };
        tokio::task::yield_now().await;
        spin(wide(i / 2));
        let e2 = c.extend(n, &o, second).await;
        let e1 = e1.await.unwrap();
        let what = format!(
            "token {t}, extend {}s {}, extend {}s {}",
            TTL2.as_secs(),
            short(&e1),
            second.as_secs(),
            short(&e2)
        );
        if !matches!((&e1, &e2), (Ok(true), Ok(true))) {
            f.add("an extend of a live grant not answered true", what.clone());
        }
        held.push((n, o, t, second, what));
    }
    sleep(SETTLE).await;
    for (n, o, t, second, what) in &held {
        check_holds(&mut f, &p, (n, o), (*t, None), &[1], &[TTL2, *second], what).await;
    }
    for (n, o, _, second, what) in &held {
        check_follow_up(&mut f, &c, &p, n, o, *second, what).await;
    }
    f.assert_none(tag, rounds as usize, "");
}

/// A holder's attempt racing its moving extend: owner O holds the only
/// permit of a fresh name (TTL, token t) through client C. Through C,
/// concurrently: an extend of O to TTL2 (a move to a new lease, the old
/// one revoked) and, after a spun delay, an attempt of O with TTL (even
/// rounds) or TTL2 (odd rounds). The attempt reads O's grant on the old
/// lease, keeps that lease alive and records it; the extend records the
/// new lease. Nobody releases: the attempt must answer Granted(t) (the
/// owner holds), the extend true, and O's one grant stays at t. With D2
/// (without one call at a time), in about a fifth of the rounds the grant
/// moved to the extend's lease is deleted (that lease revoked by the
/// attempt, in `semaphore/acquire.rs`) and the attempt answers a new token:
/// between the two, the permit was free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_attempt_racing_a_moving_extend_keeps_the_moved_grant() {
    let tag = "sso-att-ext";
    let p = unique(tag);
    let cc = coord(&p).await;
    let c = raw(&cc);
    let mut f = Found::default();
    let one = req(1, 1, TTL, false);
    let mut held = Vec::new();
    let rounds = 320u64;
    for i in 0..rounds {
        let n = leak(format!("h{i}"));
        let o = OwnerToken::random();
        let t = token(&c.try_acquire(n, &o, &one).await).expect("the first grant");
        let attl = if i % 2 == 0 { TTL } else { TTL2 };
        let e = {
            let c = c.clone();
            tokio::spawn(async move { c.extend(n, &o, TTL2).await })
        };
        tokio::task::yield_now().await;
        spin(wide(i / 2));
        let a = c.try_acquire(n, &o, &req(1, 1, attl, false)).await;
        let e = e.await.unwrap();
        let what = format!(
            "token {t}, extend {}s {}, attempt {}s {}",
            TTL2.as_secs(),
            short(&e),
            attl.as_secs(),
            short(&a)
        );
        if !matches!(e, Ok(true)) {
            f.add("the extend of a live grant not answered true", what.clone());
        }
        if token(&a) != Some(t) {
            f.add(
                "the holder's attempt not answered Granted with its token",
                what.clone(),
            );
        }
        held.push((n, o, t, attl, what));
    }
    sleep(SETTLE).await;
    let mut shown = 0;
    for (n, o, t, attl, what) in &held {
        check_holds(&mut f, &p, (n, o), (*t, None), &[1], &[TTL2, *attl], what).await;
        let now = grants_of(&p, n, o).await;
        if shown < 3 && now.iter().any(|r| r.create != *t) {
            shown += 1;
            println!("{tag} {n} ({what}):\n{}", history(&p, n, *t).await);
        }
    }
    for (n, o, _, attl, what) in &held {
        check_follow_up(&mut f, &c, &p, n, o, *attl, what).await;
    }
    f.assert_none(tag, rounds as usize, "");
}

/// Owner O, no grant, on a fresh name with room for two (total 2, one
/// permit asked). Through client C: an attempt A1, after a spun delay a
/// release R, after another an attempt A2 (the same request). What the
/// answers imply:
/// - both Granted with one token t: R true means it came after both
///   (nothing of O left), false before both (t held);
/// - two tokens: only a release between them explains it, so R must be
///   true and the later token's grant held (the earlier one gone);
/// - never two grants of O, never more permits than the total.
///
/// D1 makes it fail (two tokens with the release answered false: the two
/// attempts both granted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_release_acquire_answer_two_tokens_only_around_a_release() {
    let tag = "sso-arc";
    let p = unique(tag);
    let cc = coord(&p).await;
    let c = raw(&cc);
    let mut f = Found::default();
    let r1 = req(1, 2, TTL, false);
    let mut must_hold = Vec::new();
    let mut must_go = Vec::new();
    let (mut one_token, mut two_tokens, mut released) = (0, 0, 0);
    let rounds = 360u64;
    for i in 0..rounds {
        let n = leak(format!("d{i}"));
        let o = OwnerToken::random();
        let a1 = {
            let c = c.clone();
            tokio::spawn(async move { c.try_acquire(n, &o, &r1).await })
        };
        tokio::task::yield_now().await;
        spin(wide(i));
        let rel = {
            let c = c.clone();
            tokio::spawn(async move { c.release(n, &o).await })
        };
        tokio::task::yield_now().await;
        spin(sweep(i / 60));
        let a2 = c.try_acquire(n, &o, &r1).await;
        let (a1, rel) = (a1.await.unwrap(), rel.await.unwrap());
        let at_once = grants_of(&p, n, &o).await.len();
        let what = format!(
            "A1 {}, release {}, A2 {}",
            short(&a1),
            short(&rel),
            short(&a2)
        );
        if at_once > 1 {
            f.add(
                "two grants of the owner in etcd once all three answered",
                format!("{n}: {at_once} grants; {what}"),
            );
        }
        released += usize::from(matches!(rel, Ok(true)));
        match (token(&a1), token(&a2), &rel) {
            (Some(x), Some(y), Ok(true)) if x == y => {
                one_token += 1;
                must_go.push((n, o, what));
            }
            (Some(x), Some(y), Ok(false)) if x == y => {
                one_token += 1;
                must_hold.push((n, o, x, what));
            }
            (Some(x), Some(y), Ok(true)) => {
                two_tokens += 1;
                must_hold.push((n, o, x.max(y), what));
            }
            (Some(_), Some(_), Ok(false)) => {
                two_tokens += 1;
                f.add(
                    "two tokens answered with no release between them",
                    format!("{n}: {what}"),
                );
            }
            _ => f.add("a call not answered as expected", format!("{n}: {what}")),
        }
    }
    sleep(SETTLE).await;
    for (n, o, t, what) in &must_hold {
        check_holds(&mut f, &p, (n, o), (*t, None), &[1], &[TTL], what).await;
    }
    for (n, o, what) in &must_go {
        check_nothing(&mut f, &p, n, o, what).await;
    }
    for (n, o, _, what) in &must_hold {
        check_follow_up(&mut f, &c, &p, n, o, TTL, what).await;
    }
    f.assert_none(
        tag,
        rounds as usize,
        &format!(
            "one token in {one_token} rounds, two in {two_tokens}; the release true in {released}"
        ),
    );
}
