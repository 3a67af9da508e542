//! Cases of one owner's attempts: sent again, or through another client, they are one claim.

use super::ROUNDS;
use crate::{Factory, ttl, unique};
use coord_core::{Attempt, FencingDurability, OwnerToken};
use std::time::Duration;
use tokio::time::{Instant, sleep};

/// The raw lock attempt is idempotent per owner (the core retries an
/// attempt whose reply was lost with the same owner token): the same owner
/// gets the same fencing token again (with another TTL too), another owner
/// is refused, and only the owner can extend or release.
pub async fn lock_attempts_are_idempotent_per_owner(f: &Factory) {
    let c = f.client().await;
    let raw = c.raw_lock().unwrap();
    let name = unique("idempotent");
    let t = ttl(&c, Duration::from_secs(10));
    let (me, other) = (OwnerToken::random(), OwnerToken::random());
    let first = raw.try_acquire(&name, me.step(), t).await.unwrap();
    let Attempt::Granted(token) = first else {
        panic!("a free lock was refused: {first:?}");
    };
    let again = raw.try_acquire(&name, me.step(), t).await.unwrap();
    assert_eq!(
        again,
        Attempt::Granted(token),
        "a retried attempt by the same owner got another token"
    );
    let theirs = raw.try_acquire(&name, other.step(), t).await.unwrap();
    assert!(
        matches!(theirs, Attempt::Held { .. }),
        "another owner got a held lock: {theirs:?}"
    );
    if let Attempt::Held {
        expires_in: Some(e),
    } = theirs
    {
        assert!(
            e <= t,
            "the holder's remaining time {e:?} exceeds its TTL {t:?}"
        );
    }
    assert!(!raw.extend(&name, other.step(), t).await.unwrap());
    assert!(!raw.release(&name, other.step()).await.unwrap());
    // Retried with another TTL (a caller's retry with a changed setting):
    // still the same grant and token, never freed in between.
    let longer = raw.try_acquire(&name, me.step(), t * 2).await.unwrap();
    assert_eq!(
        longer,
        Attempt::Granted(token),
        "a retried attempt by the same owner with another TTL got another token"
    );
    assert!(raw.extend(&name, me.step(), t).await.unwrap());
    assert!(raw.release(&name, me.step()).await.unwrap());
    assert!(
        !raw.release(&name, me.step()).await.unwrap(),
        "a second release reported success"
    );
    // Free again: a new grant has a higher token.
    match raw.try_acquire(&name, other.step(), t).await.unwrap() {
        Attempt::Granted(t2) => assert!(t2 > token),
        a => panic!("released lock still held: {a:?}"),
    }
    assert!(raw.release(&name, other.step()).await.unwrap());
}

/// The same owner token retried through a second client (a raw-trait
/// caller's retry after a lost reply, made from another process) never
/// gets another token while the first grant lives: the store answers the
/// first grant's token again (Redis, PostgreSQL, memory) or `Held` (etcd:
/// a claim is bound to the lease of the client that took it, as etcd's
/// own lock service binds it); Redlock, whose fencing is best effort, may
/// answer a higher one (never a lower one). It changes nothing: another owner stays
/// refused through either client. A release by owner through the second
/// client frees the name (the next grant's token is higher); the first
/// client's stale release then reports `false` and frees nothing.
pub async fn lock_same_owner_through_another_client_gets_no_other_token(f: &Factory) {
    let (c1, c2) = (f.client().await, f.client().await);
    let (raw1, raw2) = (c1.raw_lock().unwrap(), c2.raw_lock().unwrap());
    let name = unique("owner-2-clients");
    let t = ttl(&c1, Duration::from_secs(10));
    let (me, other, third) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let Attempt::Granted(token) = raw1.try_acquire(&name, me.step(), t).await.unwrap() else {
        panic!("a free lock was refused");
    };
    // Redlock (best-effort fencing) may answer a higher token when fewer
    // than a quorum of the masters a retry counts hold the grant's token
    // (one lost it, or was too slow for the retry's decision, while a
    // master that missed the first grant has a token of its own): the
    // retry then gets (and sets) the higher one (coord_redis::redlock,
    // "Retries by the same owner"). Never a lower one, on any store.
    let best_effort = raw1.capabilities().fencing == FencingDurability::BestEffort;
    let mut highest = token;
    for _ in 0..2 {
        match raw2.try_acquire(&name, me.step(), t).await.unwrap() {
            Attempt::Granted(again) if best_effort => {
                assert!(again >= highest, "token {again:?} after {highest:?}");
                highest = again;
            }
            Attempt::Granted(again) => assert_eq!(
                again, token,
                "the same owner through a second client got another token"
            ),
            Attempt::Held { .. } => {}
        }
    }
    for raw in [&raw1, &raw2] {
        let a = raw.try_acquire(&name, other.step(), t).await.unwrap();
        assert!(
            matches!(a, Attempt::Held { .. }),
            "another owner got the lock after the same owner's attempt through a second client: {a:?}"
        );
    }
    assert!(
        raw2.release(&name, me.step()).await.unwrap(),
        "a release by owner through a second client did not find the live lock"
    );
    let Attempt::Granted(next) = raw1.try_acquire(&name, other.step(), t).await.unwrap() else {
        panic!("the lock released through the second client is still held");
    };
    assert!(next > highest, "token {next:?} after {highest:?}");
    assert!(
        !raw1.release(&name, me.step()).await.unwrap(),
        "the first client's stale release reported success"
    );
    let a = raw2.try_acquire(&name, third.step(), t).await.unwrap();
    assert!(
        matches!(a, Attempt::Held { .. }),
        "a stale release freed the next owner's lock: {a:?}"
    );
    assert!(raw1.release(&name, other.step()).await.unwrap());
}

/// Campaign attempts are idempotent per owner (same term again), another
/// candidate is refused while the leader lives, and a leader that renews
/// stays leader past its first TTL with the same term.
pub async fn election_attempts_are_idempotent_and_renewals_keep_the_term(f: &Factory) {
    if crate::cases::offered(f.client().await.elections()).is_none() {
        return;
    }
    let c = f.client().await;
    let raw = c.raw_election().unwrap();
    let t = ttl(&c, Duration::from_secs(1));
    // A renewal (or a read of the leader) must find the leadership if it
    // was answered within t of when the last grant or renewal was sent;
    // answered later, it may rightly find it lapsed (a stalled machine),
    // and the case starts again on a fresh name.
    let mut judged = None;
    for _ in 0..ROUNDS {
        let name = unique("elect-idem");
        let (me, other) = (OwnerToken::random(), OwnerToken::random());
        // When the last grant or renewal of `me` was sent.
        let mut kept = Instant::now();
        let Attempt::Granted(term) = raw.try_campaign(&name, "me", me.step(), t).await.unwrap()
        else {
            panic!("the sole candidate was refused");
        };
        let late = |kept: Instant| kept.elapsed() >= t;
        let again = raw.try_campaign(&name, "me", me.step(), t).await.unwrap();
        let mut lapsed = again != Attempt::Granted(term) && late(kept);
        if !lapsed {
            assert_eq!(
                again,
                Attempt::Granted(term),
                "a retried campaign got another term"
            );
            let theirs = raw
                .try_campaign(&name, "other", other.step(), t)
                .await
                .unwrap();
            lapsed = !matches!(theirs, Attempt::Held { .. }) && late(kept);
            if !lapsed {
                assert!(matches!(theirs, Attempt::Held { .. }), "{theirs:?}");
                assert!(!raw.renew(&name, other.step(), t).await.unwrap());
            }
        }
        // Renew well before the TTL ends, four times: still leader after
        // 2 x TTL.
        for _ in 0..4 {
            if lapsed {
                break;
            }
            sleep(t / 2).await;
            let sent = Instant::now();
            let renewed = raw.renew(&name, me.step(), t).await.unwrap();
            lapsed = !renewed && late(kept);
            if !lapsed {
                assert!(renewed, "a live leader could not renew");
                kept = sent;
            }
        }
        let info = if lapsed {
            None
        } else {
            let info = c.elections().unwrap().leader(&name).await.unwrap();
            lapsed = info.is_none() && late(kept);
            info
        };
        if lapsed {
            eprintln!("a check came too late to judge: again on a fresh name");
            let _ = raw.resign(&name, other.step()).await;
            let _ = raw.resign(&name, me.step()).await;
            continue;
        }
        let info = info.expect("a renewed leader is gone");
        judged = Some((name, me, other, term, info));
        break;
    }
    let Some((name, me, other, term, info)) = judged else {
        panic!("{ROUNDS} rounds, each with a renewal answered too late to judge");
    };
    assert_eq!(
        (info.candidate.as_str(), info.term.get()),
        ("me", term.get())
    );
    assert!(!raw.resign(&name, other.step()).await.unwrap());
    assert!(raw.resign(&name, me.step()).await.unwrap());
    assert_eq!(c.elections().unwrap().leader(&name).await.unwrap(), None);
}
