//! Claims at the edges of their TTL: sub-second TTLs, takeover at a
//! crashed holder's expiry (with polling too slow to help), release and
//! renewal after expiry, local deadlines after extend, and the watchdog and
//! lost signal after a shortened extend. These kill the mutations the
//! original suite let through (TTLs truncated to seconds, a wrong
//! `Held { expires_in }` hint, success reported for an expired claim, an
//! election renewed after expiry, `extend` not moving the deadline).

use std::time::Duration;

use coord_core::{Error, LockOptions};
use tokio::time::{Instant, sleep, timeout};

use super::ROUNDS;
use crate::{Factory, PROMPT, expiry_slack, ttl, unique};

mod attempts;
pub use attempts::{
    election_attempts_are_idempotent_and_renewals_keep_the_term,
    lock_attempts_are_idempotent_per_owner,
    lock_same_owner_through_another_client_gets_no_other_token,
};

const LONG: Duration = Duration::from_secs(30);

/// Whether the store can express a TTL of `want` exactly (not rounded up to
/// a whole second, as etcd leases are).
fn sub_second(c: &coord_core::Coord, want: Duration) -> bool {
    ttl(c, want) == want
}

/// A sub-second TTL is honoured to the millisecond range: held at a third
/// of it, free soon after it. Gated on `ttl_granularity < 1 s`: etcd's
/// leases count whole seconds, and rounding up is allowed (never down).
pub async fn lock_sub_second_ttl_is_honoured(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let t = Duration::from_millis(600);
    if !sub_second(&a, t) {
        eprintln!(
            "skipped: {} rounds TTLs to {:?}",
            a.capabilities().backend,
            a.capabilities().ttl_granularity
        );
        return;
    }
    let name = unique("subsec");
    // The grant is made between `sent` and `start` (its reply): the lock
    // may not be free before `sent` + t, and must be once `start` + t
    // has passed.
    let sent = Instant::now();
    let g = a.locks().unwrap().try_acquire(&name, t).await.unwrap();
    let g = g.expect("free lock");
    // Read before `start`, so the time between the two reads is counted in
    // `taken` (a loaded machine may stall between them), not against it.
    let remaining = g.remaining();
    let start = Instant::now();
    // The guard counts its validity from when the attempt was sent, less
    // the drift margin: however long the reply took (a loaded machine),
    // not from an earlier moment.
    let taken = start.duration_since(sent);
    assert!(
        remaining <= t && remaining + taken + coord_core::drift(t) + Duration::from_millis(5) >= t,
        "{g:?}: {remaining:?} left, its reply {taken:?} after it was sent"
    );
    sleep(t / 3).await;
    let early = b.locks().unwrap().try_acquire(&name, LONG).await.unwrap();
    assert!(
        early.is_none() || sent.elapsed() >= t,
        "a {t:?} lock was free {:?} after its grant was asked for",
        sent.elapsed()
    );
    // Taken only because a loaded machine stalled the sleep past the TTL:
    // given back, or it would be the holder the check below finds.
    if let Some(early) = early {
        early.release().await.unwrap();
    }
    // Free well before a whole second would have passed.
    sleep((t + Duration::from_millis(150)).saturating_sub(start.elapsed())).await;
    let late = b.locks().unwrap().try_acquire(&name, LONG).await.unwrap();
    assert!(
        late.is_some(),
        "a {t:?} lock still held after {:?}",
        start.elapsed()
    );
    std::mem::forget(g);
}

/// A waiter whose polling is 10 s takes over a crashed holder's lock at its
/// expiry: only the store's `Held { expires_in }` hint (or an expiry
/// notification) can make this prompt.
pub async fn lock_waiter_takes_over_at_a_crashed_holders_expiry(f: &Factory) {
    let a = f.client().await;
    let b = f.client().await.with_poll_interval(Duration::from_secs(10));
    let name = unique("crashed");
    let t = ttl(&a, Duration::from_millis(1500));
    // The TTL runs from when the store made the grant: after `sent`, and
    // before the reply. Early is timed from `sent`, late from the reply
    // (see the semaphore case of the same shape).
    let sent = Instant::now();
    let g = a
        .locks()
        .unwrap()
        .acquire(&name, t, Duration::ZERO)
        .await
        .unwrap();
    let start = Instant::now();
    // The holder "crashes": no release, no renewal.
    std::mem::forget(g);
    let g2 = b
        .locks()
        .unwrap()
        .acquire(&name, LONG, Duration::from_secs(8))
        .await
        .expect("the crashed holder's lock never passed to the waiter");
    let (waited, since_sent) = (start.elapsed(), sent.elapsed());
    assert!(
        since_sent + Duration::from_millis(50) >= t,
        "taken over {:?} after the grant was asked for, before the TTL {t:?}",
        since_sent
    );
    // etcd frees an expired lease up to `expiry_slack` after its TTL.
    let slack = expiry_slack(&a);
    assert!(
        waited <= t + slack + PROMPT,
        "taken over only after {waited:?} (TTL {t:?}, expiry slack {slack:?}): \
         the expiry hint was not used"
    );
    g2.release().await.unwrap();
}

/// `extend` moves the local validity deadline (both ways) and the store's.
pub async fn lock_extend_moves_the_local_deadline(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let name = unique("extend-deadline");
    let t = ttl(&a, Duration::from_secs(1));
    let g = a
        .locks()
        .unwrap()
        .acquire(&name, t, Duration::ZERO)
        .await
        .unwrap();
    let longer = t * 4;
    g.extend(longer).await.unwrap();
    assert!(
        g.remaining() > t * 2,
        "extend({longer:?}) left {:?} of validity",
        g.remaining()
    );
    assert_eq!(g.ttl(), longer);
    sleep(t + Duration::from_millis(300)).await;
    assert!(
        g.is_valid(),
        "the extended guard lapsed at the old deadline"
    );
    assert!(
        b.locks()
            .unwrap()
            .try_acquire(&name, LONG)
            .await
            .unwrap()
            .is_none(),
        "the store freed the lock at the old TTL"
    );
    g.extend(t).await.unwrap();
    assert!(
        g.remaining() <= t,
        "a shorter extend kept {:?}",
        g.remaining()
    );
    g.release().await.unwrap();
}

/// After `keep_alive`, an explicit shorter `extend` re-plans the watchdog:
/// it keeps renewing in time, so nobody else can take the lock; and
/// without a watchdog the guard's local deadline follows the shortened
/// TTL, ending before the store grants the lock to anyone else, and the
/// lost signal fires once that deadline passed (not at the old one).
pub async fn lock_shortened_extend_replans_watchdog_and_lost_signal(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let short = ttl(&a, Duration::from_secs(1));
    let long = short.max(Duration::from_secs(10)) * 3;

    let name = unique("replan-watchdog");
    // Renewing every third of a 2 s TTL leaves the watchdog over a second
    // for each renewal on a loaded machine (1 s left it 600 ms); unplanned,
    // its next renewal would still come only at a third of `long`.
    let shortened = ttl(&a, Duration::from_secs(2));
    let g = a
        .locks()
        .unwrap()
        .acquire_with(&name, LockOptions::new(long).watchdog(true))
        .await
        .unwrap();
    // Let the watchdog plan its first renewal (a third of the long TTL).
    sleep(Duration::from_millis(200)).await;
    g.extend(shortened).await.unwrap();
    sleep(shortened * 3).await;
    assert!(
        g.is_valid(),
        "the watchdog let the shortened lock lapse: {g:?}"
    );
    assert!(
        b.locks()
            .unwrap()
            .try_acquire(&name, LONG)
            .await
            .unwrap()
            .is_none(),
        "another client took the lock while the watchdog was on"
    );
    g.release().await.unwrap();

    let name = unique("replan-lost");
    let g = a
        .locks()
        .unwrap()
        .acquire(&name, long, Duration::ZERO)
        .await
        .unwrap();
    // Both already waiting on the long deadline when the extend comes.
    let lost = tokio::spawn(g.lost());
    let token = g.lost_token();
    sleep(Duration::from_millis(200)).await;
    let usable = short - coord_core::drift(short);
    let start = Instant::now();
    g.extend(short).await.unwrap();
    let replied = Instant::now();
    // The new local deadline is the shortened TTL less the drift margin,
    // counted from a moment inside the call (the product takes it just
    // before sending, which only a slow reply can tell apart from the
    // reply: coord-memory's paused-time tests pin that).
    let deadline = g.valid_until();
    assert!(
        deadline >= start + usable && deadline <= replied + usable,
        "after extend({short:?}) the deadline is {:?} from the call, which took {:?}",
        deadline - start,
        replied - start
    );
    // Another client asks at once: the store must not let it in before
    // the holder's local validity ended.
    let other = {
        let (locks, name) = (b.locks().unwrap(), name.clone());
        tokio::spawn(async move {
            let r = locks
                .acquire(&name, LONG, short + Duration::from_secs(5))
                .await;
            (Instant::now(), r)
        })
    };
    // The old deadline is `long` (30 s or more) away: a lost signal within
    // half a second of the new one followed the extend, late wake-ups of a
    // loaded machine included.
    timeout(short + Duration::from_millis(500), lost)
        .await
        .expect("the lost signal kept the old deadline after a shorter extend")
        .unwrap();
    let fired = Instant::now();
    assert!(token.is_cancelled());
    // Timers fire at or after their deadline (how much after is the
    // scheduler's business): what users rely on is that the guard says
    // invalid from the deadline on, and that the signal is not early.
    assert!(
        !g.is_valid(),
        "lost fired while the guard says valid: {g:?}"
    );
    assert!(
        fired >= deadline,
        "lost fired {:?} before the deadline",
        deadline - fired
    );
    let (granted, g2) = other.await.unwrap();
    let g2 = g2.expect("the shortened lock never freed");
    assert!(
        granted >= deadline,
        "another client got the lock {:?} before the holder's deadline",
        deadline - granted
    );
    g2.release().await.unwrap();
    drop(g);
}

/// Releasing a lock, revoking a lease and resigning a leadership that
/// expired (and that nobody took since) reports `NotHeld`: the claim was
/// not held to the end.
pub async fn claims_released_after_expiry_are_not_held(f: &Factory) {
    let a = f.client().await;
    let t = ttl(&a, Duration::from_millis(500));
    let settle = t + Duration::from_millis(1500);

    let lock = unique("expired-lock");
    let g = a
        .locks()
        .unwrap()
        .acquire(&lock, t, Duration::ZERO)
        .await
        .unwrap();
    let lease = unique("expired-lease");
    let l = a.leases().unwrap().grant(&lease, t).await.unwrap().unwrap();
    let elect = unique("expired-election");
    let mut e = None;
    if let Some(elections) = crate::cases::offered(a.elections()) {
        let won = elections.try_campaign(&elect, "solo", t).await.unwrap();
        e = Some(won.expect("sole candidate wins"));
    }
    sleep(settle).await;

    let r = g.release().await;
    assert!(
        matches!(r, Err(Error::NotHeld { .. })),
        "release of an expired lock: {r:?}"
    );
    assert_eq!(a.leases().unwrap().remaining(&lease).await.unwrap(), None);
    let r = l.revoke().await;
    assert!(
        matches!(r, Err(Error::NotHeld { .. })),
        "revoke of an expired lease: {r:?}"
    );
    if let Some(e) = e {
        let r = e.resign().await;
        assert!(
            matches!(r, Err(Error::NotHeld { .. })),
            "resign of an expired leadership: {r:?}"
        );
    }
}

/// An election whose leader stops renewing: after the TTL `leader()` says
/// nobody leads, renewing fails and resurrects nothing, and a new candidate
/// wins with a higher term.
pub async fn election_expired_leader_is_gone_and_cannot_renew(f: &Factory) {
    if crate::cases::offered(f.client().await.elections()).is_none() {
        return;
    }
    let (a, b) = (f.client().await, f.client().await);
    let name = unique("elect-expire");
    let t = ttl(&a, Duration::from_millis(500));
    let first = a
        .elections()
        .unwrap()
        .try_campaign(&name, "old", t)
        .await
        .unwrap()
        .expect("sole candidate wins");
    sleep(t + Duration::from_millis(1500)).await;
    assert_eq!(
        b.elections().unwrap().leader(&name).await.unwrap(),
        None,
        "an expired leader is still reported"
    );
    let r = first.renew(LONG).await;
    assert!(
        matches!(r, Err(Error::NotHeld { .. })),
        "renewing an expired leadership: {r:?}"
    );
    assert_eq!(
        b.elections().unwrap().leader(&name).await.unwrap(),
        None,
        "a failed renewal resurrected the leader"
    );
    let second = b
        .elections()
        .unwrap()
        .try_campaign(&name, "new", LONG)
        .await
        .unwrap()
        .expect("the seat is free");
    assert!(second.term() > first.term());
    second.resign().await.unwrap();
}

/// A TTL too short to leave a guard any validity after the drift margin is
/// refused with `InvalidArgument` naming the smallest usable TTL (nothing
/// is taken); the smallest accepted TTL gives a guard valid at birth.
pub async fn input_ttl_below_the_drift_margin_is_rejected(f: &Factory) {
    let a = f.client().await;
    let usable = coord_core::validate::min_usable_ttl(a.capabilities());
    let name = unique("tiny-ttl");
    for ms in 1..=4u64 {
        let t = Duration::from_millis(ms);
        match a.locks().unwrap().try_acquire(&name, t).await {
            Err(Error::InvalidArgument {
                field: "ttl",
                reason: rule,
            }) => {
                assert!(
                    rule.contains(&format!("{usable:?}")),
                    "the error does not name the smallest usable TTL {usable:?}: {rule}"
                );
            }
            Ok(Some(g)) => {
                // Rounded up by the backend to something usable.
                assert!(g.ttl() >= usable, "a {t:?} request gave {g:?}");
                g.release().await.unwrap();
            }
            other => panic!("ttl {t:?}: {other:?}"),
        }
    }
    if usable > Duration::from_millis(2) && sub_second(&a, Duration::from_millis(2)) {
        let r = a
            .leases()
            .unwrap()
            .grant(&name, Duration::from_millis(2))
            .await;
        assert!(
            matches!(r, Err(Error::InvalidArgument { field: "ttl", .. })),
            "{r:?}"
        );
        let g = a.locks().unwrap().try_acquire(&name, LONG).await.unwrap();
        let g = g.expect("a refused attempt must not have taken the lock");
        let r = g.extend(Duration::from_millis(2)).await;
        assert!(
            matches!(r, Err(Error::InvalidArgument { field: "ttl", .. })),
            "{r:?}"
        );
        assert!(g.is_valid());
        g.release().await.unwrap();
    }
    let g = a
        .locks()
        .unwrap()
        .try_acquire(&name, usable)
        .await
        .unwrap()
        .expect("free");
    // The smallest usable TTL is accepted and leaves at least half of it
    // after the drift margin (what is left at birth also depends on the
    // round trip, which no TTL check can know).
    assert_eq!(g.ttl(), usable);
    assert!(usable.saturating_sub(coord_core::drift(usable)) >= coord_core::drift(usable));
    // A few milliseconds may have run out by now (a loaded machine, a
    // pooler in between): released or already expired are both fine.
    match g.release().await {
        Ok(()) | Err(Error::NotHeld { .. }) => {}
        Err(e) => panic!("release of the smallest usable TTL: {e}"),
    }
}
