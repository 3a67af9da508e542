//! The etcd semaphore's moving extend (`sem_extend` in `semaphore/hold.rs`)
//! racing a release through another client and a grant of the same owner
//! again through the extending client itself.
//!
//! The window between the extend's read of the grant and its moving
//! transaction is widened deterministically, without timing luck: the
//! extending client is given spare leases of the extend's TTL that were
//! revoked behind its back (straight through etcd). `sem_lease` tries each
//! spare before granting a new lease, and a spare is taken for gone only
//! after its keepalive was not found again after 50, 100 and 200 ms
//! (`NOT_FOUND_RETRIES`): each dead spare holds the extend at least
//! 350 ms between its read and its move, until `SPARE_BUDGET` (1 s) is
//! spent (so about 1 s in all), while the release and the new grant take
//! a few milliseconds on the test's local etcd.

use std::time::Duration;

use coord_core::{Attempt, OwnerToken};
use tokio::time::{Instant, sleep};

use crate::semaphore_support;
use semaphore_support::*;

/// Dead spares given to the extending client: its move waits at least
/// 350 ms per spare tried after its read, for 1 s in all (three tried).
const DEAD_SPARES: usize = 6;

/// The TTL of the moving extend (another one than the grant's).
const MOVE_TTL: Duration = Duration::from_secs(45);

/// Give the client `c` (its semaphore `s`) `count` spare leases of `ttl`,
/// each revoked straight through etcd after it became a spare.
async fn dead_spares(
    p: &str,
    s: &std::sync::Arc<dyn coord_core::Semaphore>,
    ttl: Duration,
    count: usize,
) {
    let n = "spares";
    let total = count as u32;
    let owners: Vec<OwnerToken> = (0..count).map(|_| OwnerToken::random()).collect();
    for o in &owners {
        granted(s.try_acquire(n, o.step(), &req(1, total, ttl, false)).await);
    }
    let leases: Vec<i64> = state(p, n).await.0.iter().map(|r| r.lease).collect();
    assert_eq!(leases.len(), count);
    for o in &owners {
        assert!(s.release(n, o.step()).await.unwrap());
    }
    let mut etcd = raw_etcd().await;
    for l in leases {
        etcd.lease_revoke(l).await.unwrap();
    }
}

/// The setting of the races below: clients C and B on a fresh prefix,
/// owner O granted the only permit of `n` through C (token `t1`), and C
/// given dead spares of `MOVE_TTL`.
struct Race {
    p: String,
    c: std::sync::Arc<dyn coord_core::Semaphore>,
    b: std::sync::Arc<dyn coord_core::Semaphore>,
    n: &'static str,
    o: OwnerToken,
    t1: u64,
    _clients: (coord_core::Coord, coord_core::Coord),
}

impl Race {
    async fn new(tag: &str, n: &'static str) -> Race {
        let p = unique(tag);
        let (cc, cb) = (coord(&p).await, coord(&p).await);
        let (c, b) = (raw(&cc), raw(&cb));
        let o = OwnerToken::random();
        let t1 = granted(c.try_acquire(n, o.step(), &req(1, 1, LONG, false)).await);
        dead_spares(&p, &c, MOVE_TTL, DEAD_SPARES).await;
        Race {
            p,
            c,
            b,
            n,
            o,
            t1,
            _clients: (cc, cb),
        }
    }

    /// O released through B, then granted again through C: the new token,
    /// and when the release began and the regrant was answered.
    async fn release_and_regrant(&self) -> (u64, Instant, Instant) {
        let raced = Instant::now();
        assert!(
            self.b.release(self.n, self.o.step()).await.unwrap(),
            "release through B"
        );
        let one = req(1, 1, LONG, false);
        let t2 = granted(self.c.try_acquire(self.n, self.o.step(), &one).await);
        (t2, raced, Instant::now())
    }

    /// The race took place as set up: the regrant answered a token above
    /// the first grant's. Calls of one owner through one client take
    /// turns (`Shared::sem_one_call`, see
    /// `semaphore_same_owner_one_client/`), so the regrant through C
    /// waits for the raced call (`what`) to end instead of landing inside
    /// it: the grant answered must hold either way. (Without the turns,
    /// the release and regrant take a few milliseconds and the raced call
    /// ends after them, the interleaving each test below describes.)
    fn assert_raced(
        &self,
        t2: u64,
        (raced, _regranted): (Instant, Instant),
        done: Instant,
        what: &str,
    ) {
        assert!(t2 > self.t1, "the regrant's token {t2} after {}", self.t1);
        assert!(
            done > raced,
            "{what} ended {:?} before the release began",
            raced - done
        );
    }

    /// Leave nothing behind for the shared server.
    async fn clean_up(&self, intruder: &OwnerToken) {
        let _ = self.c.release(self.n, self.o.step()).await;
        let _ = self.b.release(self.n, intruder.step()).await;
        let _ = self.b.force_release(self.n).await;
    }
}

/// Owner O holds the only permit through client C (TTL 30 s). C extends
/// O to another TTL (a move): E reads O's grant, then (held by dead
/// spares) has not moved it yet when O is released through client B and
/// granted again through C itself (a raw `try_acquire`, answered
/// Granted(t2), recorded by C). E's move then fails its compare. A failed
/// extend forgets C's record of O only if it is still the grant the
/// extend read (`sem_forget_of`): dropping the record of the grant just
/// answered and revoking its lease would make the grant C answered vanish
/// while its holder believes it holds the permit, and another owner would
/// be granted it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_move_keeps_a_grant_made_again_through_the_same_client() {
    let race = Race::new("race-forget", "x").await;
    let (p, c, b, n, o) = (&race.p, &race.c, &race.b, race.n, race.o);
    let e = {
        let c = c.clone();
        tokio::spawn(async move {
            let r = c.extend(n, o.step(), MOVE_TTL).await;
            (r, Instant::now())
        })
    };
    // E's read (its first request) has long landed; its move is more than
    // a second away.
    sleep(Duration::from_millis(150)).await;
    let (t2, raced, regranted) = race.release_and_regrant().await;
    let (r, e_done) = e.await.unwrap();
    // Let background revocations land.
    sleep(Duration::from_millis(500)).await;
    let live = state(p, n).await.0;
    let intruder = OwnerToken::random();
    let third = b
        .try_acquire(n, intruder.step(), &req(1, 1, LONG, false))
        .await;
    race.clean_up(&intruder).await;
    race.assert_raced(t2, (raced, regranted), e_done, "E");
    assert!(
        live.iter()
            .any(|g| g.owner == o.to_hex() && g.create as u64 == t2)
            && matches!(third, Ok(Attempt::Held { .. })),
        "C answered Granted({t2}) to O's try_acquire; E ({r:?}) then failed its \
         move; O's grants in etcd now: {live:#?}; a third owner then got {third:?}"
    );
}

/// The same race through the moving retry (which starts afresh when its
/// move fails): a `try_acquire` of O through C with another TTL (R) reads
/// O's grant, keeps its lease alive, and moves it with `sem_extend`, whose
/// move (held by dead spares) fails after O was released through B and
/// granted again through C (answered Granted(t2)). The grant answered t2
/// must stay (`sem_forget_of`, as in the test above). Were its lease
/// revoked, it would vanish without a release, R would start afresh and
/// make another grant (another token), and a third owner, trying through
/// B the moment etcd deletes the grant answered t2, could take the permit
/// meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moving_retry_keeps_a_grant_made_again_through_the_same_client() {
    let race = Race::new("race-retry", "y").await;
    let (p, c, b, n, o) = (&race.p, &race.c, &race.b, race.n, race.o);
    let key = state(p, n).await.0[0].key.clone();
    // A third owner tries through B as soon as a grant of O made after t1
    // (on the key of the first: `SemLocal::hold`) is deleted.
    let intruder = OwnerToken::random();
    let third = {
        let b = b.clone();
        let mut etcd = raw_etcd().await;
        let mut stream = etcd.watch(key.as_bytes(), None).await.unwrap();
        tokio::spawn(async move {
            let mut regranted = false;
            while let Ok(Some(resp)) = stream.message().await {
                for ev in resp.events() {
                    match ev.event_type() {
                        etcd_client::EventType::Put => regranted = true,
                        etcd_client::EventType::Delete if regranted => {
                            let one = req(1, 1, LONG, false);
                            return Some(b.try_acquire(n, intruder.step(), &one).await);
                        }
                        etcd_client::EventType::Delete => {}
                    }
                }
            }
            None
        })
    };
    let retry = {
        let c = c.clone();
        tokio::spawn(async move {
            let r = c
                .try_acquire(n, o.step(), &req(1, 1, MOVE_TTL, false))
                .await;
            (r, Instant::now())
        })
    };
    // R's read, keepalive and the extend's read have long landed; its
    // move is more than a second away.
    sleep(Duration::from_millis(150)).await;
    let (t2, raced, regranted) = race.release_and_regrant().await;
    let (r, r_done) = retry.await.unwrap();
    sleep(Duration::from_millis(500)).await;
    let live = state(p, n).await.0;
    third.abort();
    let third = third.await.ok().flatten();
    race.clean_up(&intruder).await;
    race.assert_raced(t2, (raced, regranted), r_done, "R");
    assert!(
        live.iter()
            .any(|g| g.owner == o.to_hex() && g.create as u64 == t2),
        "C answered Granted({t2}) to O's try_acquire, then {r:?} to its moving retry; the grant \
         at {t2} is gone without a release: the grants in etcd now: {live:#?}; a third owner \
         trying at its deletion got {third:?}"
    );
}

/// O's grant released through B (not made again) while a moving retry R
/// of O through C (another TTL) waits between its extend's read and its
/// move (dead spares): the move fails, R starts afresh and makes a new
/// grant; it answers the token of that grant, the only one of O in etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moving_retry_after_a_release_through_another_client_grants_afresh() {
    let race = Race::new("race-fresh", "z").await;
    let (p, c, b, n, o, t1) = (&race.p, &race.c, &race.b, race.n, race.o, race.t1);
    let retry = {
        let c = c.clone();
        tokio::spawn(async move {
            let r = c
                .try_acquire(n, o.step(), &req(1, 1, MOVE_TTL, false))
                .await;
            (r, Instant::now())
        })
    };
    sleep(Duration::from_millis(150)).await;
    assert!(b.release(n, o.step()).await.unwrap(), "release through B");
    let released = Instant::now();
    let (r, r_done) = retry.await.unwrap();
    assert!(r_done > released, "R ended before the release");
    let tr = granted(r);
    sleep(Duration::from_millis(300)).await;
    let live = state(p, n).await.0;
    let third = b
        .try_acquire(n, OwnerToken::random().step(), &req(1, 1, LONG, false))
        .await;
    let released_again = c.release(n, o.step()).await;
    let _ = b.force_release(n).await;
    assert!(tr > t1, "R answered {tr} after the release of {t1}");
    assert!(
        live.len() == 1 && live[0].owner == o.to_hex() && live[0].create as u64 == tr,
        "R answered Granted({tr}); the grants in etcd: {live:#?}"
    );
    assert!(matches!(third, Ok(Attempt::Held { .. })), "{third:?}");
    assert!(released_again.unwrap(), "release through C");
}

/// A moving retry whose extend moved another grant than the one it read
/// starts afresh: against an owner released and granted again through
/// B over and over, each retry of that owner through C with another TTL
/// still ends (within the call timeout) and answers a grant, never a
/// token below one B answered before it began; once B stops, a last retry
/// answers the owner's only grant in etcd, and no more than the total is
/// ever held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_retries_end_against_a_cycling_regrant() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let p = unique("race-cycle");
    let (cc, cb) = (coord(&p).await, coord(&p).await);
    let (c, b) = (raw(&cc), raw(&cb));
    let n = "w";
    let stop = Arc::new(AtomicBool::new(false));
    let obs = observer(p.clone(), n.into(), 2, stop.clone());
    let o = OwnerToken::random();
    let other = OwnerToken::random();
    granted(
        b.try_acquire(n, other.step(), &req(1, 2, LONG, false))
            .await,
    );
    let last_b = Arc::new(AtomicU64::new(granted(
        b.try_acquire(n, o.step(), &req(1, 2, LONG, false)).await,
    )));
    let cycling = Arc::new(AtomicBool::new(true));
    let cycler = {
        let (b, last_b, cycling) = (b.clone(), last_b.clone(), cycling.clone());
        tokio::spawn(async move {
            let mut rounds = 0u32;
            while cycling.load(Ordering::Relaxed) {
                let _ = b.release(n, o.step()).await.unwrap();
                match b
                    .try_acquire(n, o.step(), &req(1, 2, LONG, false))
                    .await
                    .unwrap()
                {
                    Attempt::Granted(t) => last_b.fetch_max(t.get(), Ordering::SeqCst),
                    other => panic!("B's regrant: {other:?}"),
                };
                rounds += 1;
                sleep(Duration::from_millis(3)).await;
            }
            rounds
        })
    };
    for i in 0..30u32 {
        let ttl = if i % 2 == 0 { MOVE_TTL } else { LONG * 2 };
        let floor = last_b.load(Ordering::SeqCst);
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            c.try_acquire(n, o.step(), &req(1, 2, ttl, false)),
        )
        .await
        .unwrap_or_else(|_| panic!("retry {i} did not end"));
        match r {
            Ok(Attempt::Granted(t)) => assert!(t.get() >= floor, "retry {i}: {t:?} < {floor}"),
            // Losing every round to B's regrants is a documented refusal.
            Err(coord_core::Error::Unavailable { .. }) => {}
            r => panic!("retry {i}: {r:?}"),
        }
    }
    cycling.store(false, Ordering::Relaxed);
    assert!(cycler.await.unwrap() > 0);
    let t = granted(
        c.try_acquire(n, o.step(), &req(1, 2, MOVE_TTL, false))
            .await,
    );
    sleep(Duration::from_millis(300)).await;
    let live: Vec<Rec> = state(&p, n)
        .await
        .0
        .into_iter()
        .filter(|r| r.owner == o.to_hex())
        .collect();
    stop.store(true, Ordering::Relaxed);
    assert!(obs.await.unwrap() > 0);
    let _ = b.force_release(n).await;
    assert!(
        live.len() == 1 && live[0].create as u64 == t,
        "the last retry answered Granted({t}); O's grants in etcd: {live:#?}"
    );
}

/// An acquire whose client holds only dead spares of its TTL (revoked
/// behind its back, as after an etcd restore) tries them for at most a
/// second before it grants a new lease: with 12 dead spares (at least
/// 4.2 s to try them all) a fresh owner on a fresh name is granted within
/// 2.5 s (the second, a new lease and the grant, on a loaded machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_tries_dead_spares_for_a_second_at_most() {
    let p = unique("race-spares");
    let cc = coord(&p).await;
    let c = raw(&cc);
    dead_spares(&p, &c, MOVE_TTL, 12).await;
    let o = OwnerToken::random();
    let t0 = Instant::now();
    granted(
        c.try_acquire("fresh", o.step(), &req(1, 1, MOVE_TTL, false))
            .await,
    );
    let took = t0.elapsed();
    assert!(took < Duration::from_millis(2500), "granted after {took:?}");
    assert!(has_grant(&p, "fresh", &o).await);
}

/// Owner O, with no grant, is granted through client C while a release of
/// O through C itself is under way (a release that finds nothing: it reads
/// the name, then forgets C's record of O). When the grant lands between
/// the release's read and its end, the release must leave the grant just
/// answered alone: its key stays, on its lease, while it is held. (A
/// release that removed C's record of O unconditionally would take the
/// grant's record with it and revoke that grant's lease: the grant
/// answered would vanish.) Run over a sweep of delays between the two
/// calls, many rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_finding_nothing_keeps_a_grant_made_meanwhile() {
    let p = unique("race-release");
    let cc = coord(&p).await;
    let c = raw(&cc);
    let mut raced = Vec::new();
    for i in 0..400u64 {
        let n: &'static str = Box::leak(format!("r{i}").into_boxed_str());
        let o = OwnerToken::random();
        let acquire = {
            let c = c.clone();
            tokio::spawn(async move { c.try_acquire(n, o.step(), &req(1, 1, LONG, false)).await })
        };
        let release = {
            let c = c.clone();
            let delay = Duration::from_micros((i % 20) * 150);
            tokio::spawn(async move {
                sleep(delay).await;
                c.release(n, o.step()).await
            })
        };
        let (a, r) = (acquire.await.unwrap(), release.await.unwrap());
        if let (Ok(Attempt::Granted(_)), Ok(false)) = (&a, &r) {
            raced.push((n, o));
        }
    }
    // Revocations run in the background.
    sleep(Duration::from_secs(2)).await;
    let mut vanished = Vec::new();
    for (n, o) in &raced {
        if !has_grant(&p, n, o).await {
            vanished.push(*n);
        }
    }
    for (n, o) in &raced {
        let _ = c.release(n, o.step()).await;
    }
    println!(
        "{} rounds granted with the release finding nothing",
        raced.len()
    );
    assert!(
        vanished.is_empty(),
        "grants answered while a release of the same owner found nothing, gone \
         afterwards: {vanished:?} (of {})",
        raced.len()
    );
}
