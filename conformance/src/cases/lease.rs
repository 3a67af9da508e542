//! Lease cases.

use std::time::Duration;

use coord_core::Error;
use tokio::time::{Instant, sleep};

use crate::{Factory, ttl, unique};

/// Renewing an expired lease fails and resurrects nothing.
pub async fn lease_renew_after_expiry_fails(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let name = unique("lease-expiry");
    let t = ttl(&a, Duration::from_secs(1));
    let l = a
        .leases()
        .unwrap()
        .grant(&name, t)
        .await
        .unwrap()
        .expect("free lease");
    l.renew(t).await.expect("renew while live");
    sleep(t + Duration::from_millis(700)).await;
    assert!(
        !b.leases().unwrap().is_alive(&name).await.unwrap(),
        "lease outlived its TTL"
    );
    let e = l.renew(Duration::from_secs(30)).await.unwrap_err();
    assert!(
        matches!(e, Error::NotHeld { .. }),
        "renew after expiry: {e:?}"
    );
    assert!(
        !b.leases().unwrap().is_alive(&name).await.unwrap(),
        "renew resurrected the lease"
    );
    // Granted for longer than `t`: its revoke below must find it alive
    // however slowly a loaded machine gets there.
    let other = b
        .leases()
        .unwrap()
        .grant(&name, Duration::from_secs(30))
        .await
        .unwrap()
        .expect("expired lease must be grantable");
    assert!(other.fencing_token() > l.fencing_token());
    other.revoke().await.unwrap();
}

/// A lease that expired and went to another owner: the first owner's
/// revoke (it never renewed, so it does not know) reports nothing held and
/// leaves the new owner's lease alive, with its higher fencing token.
pub async fn lease_revoke_after_expiry_leaves_the_next_holder(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let name = unique("lease-stale-revoke");
    let t = ttl(&a, Duration::from_secs(1));
    let old = a
        .leases()
        .unwrap()
        .grant(&name, t)
        .await
        .unwrap()
        .expect("free lease");
    sleep(t + Duration::from_millis(700)).await;
    let new = b
        .leases()
        .unwrap()
        .grant(&name, Duration::from_secs(30))
        .await
        .unwrap()
        .expect("an expired lease must be grantable");
    assert!(new.fencing_token() > old.fencing_token());
    let r = old.revoke().await;
    assert!(
        matches!(r, Ok(()) | Err(Error::NotHeld { .. })),
        "a stale revoke: {r:?}"
    );
    assert!(
        a.leases().unwrap().is_alive(&name).await.unwrap(),
        "the stale owner's revoke ended the new owner's lease"
    );
    assert!(
        a.leases()
            .unwrap()
            .grant(&name, Duration::from_secs(30))
            .await
            .unwrap()
            .is_none(),
        "the name was granted again while the new owner holds it"
    );
    new.revoke().await.expect("the new owner revokes");
}

/// Revoking ends a lease at once for every observer.
pub async fn lease_revoke_frees_at_once(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let name = unique("lease-revoke");
    let mut l = a
        .leases()
        .unwrap()
        .grant(&name, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    l.keep_alive();
    assert!(b.leases().unwrap().is_alive(&name).await.unwrap());
    assert!(
        b.leases()
            .unwrap()
            .grant(&name, Duration::from_secs(30))
            .await
            .unwrap()
            .is_none(),
        "two live leases on one name"
    );
    l.revoke().await.unwrap();
    assert!(
        !b.leases().unwrap().is_alive(&name).await.unwrap(),
        "revoked lease still alive"
    );
    let l2 = b
        .leases()
        .unwrap()
        .grant(&name, Duration::from_secs(30))
        .await
        .unwrap()
        .expect("revoked lease must be free");
    l2.revoke().await.unwrap();
}

/// `remaining` never exceeds the TTL, locally or on the store.
pub async fn lease_remaining_never_exceeds_ttl(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let name = unique("lease-remaining");
    let t = ttl(&a, Duration::from_secs(5));
    let l = a.leases().unwrap().grant(&name, t).await.unwrap().unwrap();
    assert!(
        l.remaining() <= t && l.remaining() > Duration::ZERO,
        "local remaining {:?} for TTL {t:?}",
        l.remaining()
    );
    let r = b
        .leases()
        .unwrap()
        .remaining(&name)
        .await
        .unwrap()
        .expect("live lease");
    assert!(r <= t, "store remaining {r:?} for TTL {t:?}");
    assert!(
        l.remaining() <= r + Duration::from_millis(5),
        "local validity {:?} exceeds the store's {r:?}",
        l.remaining()
    );
    l.renew(t).await.unwrap();
    assert!(l.remaining() <= t);
    l.revoke().await.unwrap();
    assert_eq!(b.leases().unwrap().remaining(&name).await.unwrap(), None);
}

/// `remaining` counts down: half way through a lease's TTL the store
/// reports about half of it, through the holder's client and through
/// another, and the guard's local `remaining` too. A store that keeps
/// reporting the full TTL while the lease lives fails here.
///
/// The store's deadline is at most the grant's reply plus the TTL, so at a
/// read sent `e` after that reply at most `TTL - e` is left; at least
/// `TTL - e'` is, with `e'` from before the grant was sent to the read's
/// reply. Both bounds are widened by the store's TTL granularity (etcd
/// answers in whole seconds) and 50 ms.
pub async fn lease_remaining_counts_down(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let name = unique("lease-countdown");
    let t = ttl(&a, Duration::from_secs(3));
    let slack = a.capabilities().ttl_granularity + Duration::from_millis(50);
    // Both clients' connections made first, so the reads below are
    // single round trips.
    for c in [&a, &b] {
        assert_eq!(c.leases().unwrap().remaining(&name).await.unwrap(), None);
    }
    let sent = Instant::now();
    let l = a
        .leases()
        .unwrap()
        .grant(&name, t)
        .await
        .unwrap()
        .expect("free lease");
    let granted = Instant::now();
    sleep(t / 2).await;
    for (who, c) in [("the holder's client", &a), ("another client", &b)] {
        let asked = Instant::now();
        let r = c.leases().unwrap().remaining(&name).await.unwrap();
        let answered = Instant::now();
        let Some(r) = r else {
            // None is right only for a read the store may have run after
            // the deadline (on a machine so loaded that the read took the
            // rest of the TTL): nothing more to check through it.
            assert!(
                answered - granted + slack >= t,
                "{who}: no live lease, read {:?} into a {t:?} TTL and answered {:?} into it",
                asked - sent,
                answered - sent
            );
            continue;
        };
        let most = t.saturating_sub(asked - granted) + slack;
        let least = t.saturating_sub(answered - sent).saturating_sub(slack);
        assert!(
            r <= most,
            "{who}: remaining {r:?} {:?} after a grant of {t:?}: at most {most:?} can be left \
             (remaining does not count down)",
            asked - granted
        );
        assert!(
            r >= least && r > Duration::ZERO,
            "{who}: remaining {r:?} {:?} after a grant of {t:?}: at least {least:?} is left",
            answered - sent
        );
    }
    let local = l.remaining();
    let elapsed = sent.elapsed();
    let most = t.saturating_sub(elapsed) + Duration::from_millis(5);
    // Still valid unless the reads took the rest of the TTL, less the
    // drift margin the guard keeps.
    let valid = elapsed + coord_core::drift(t) + Duration::from_millis(5) < t;
    assert!(
        local <= most && (!valid || local > Duration::ZERO),
        "the guard's remaining {local:?} {:?} after a grant of {t:?} (at most {most:?})",
        sent.elapsed()
    );
    l.revoke().await.unwrap();
}

/// A renewal with a shorter TTL brings the local deadline forward as it
/// is sent, even if its caller never hears back (here: cancelled after
/// its first poll). The store may apply it whatever the caller hears, so
/// `remaining` must not promise the longer TTL any more.
pub async fn lease_cancelled_shorter_renew_caps_remaining(f: &Factory) {
    use futures::FutureExt;
    let a = f.client().await;
    let name = unique("lease-shorter");
    let long = ttl(&a, Duration::from_secs(30));
    let short = ttl(&a, Duration::from_secs(2));
    let l = a
        .leases()
        .unwrap()
        .grant(&name, long)
        .await
        .unwrap()
        .unwrap();
    assert!(
        l.remaining() > short,
        "{:?} just after the grant",
        l.remaining()
    );
    // One poll: the request may be on its way, or even answered.
    let answered = l.renew(short).now_or_never();
    assert!(
        l.remaining() <= short,
        "remaining {:?} after a renewal to {short:?} ({answered:?})",
        l.remaining()
    );
    l.revoke().await.unwrap();
}

/// `force_revoke` ends a lease whoever holds it: the holder's renewal is
/// refused, another client is granted at once with a higher token, and
/// forcing a free name ends nothing.
pub async fn lease_force_revoke_ends_whoever_holds_it(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let name = unique("lease-force");
    let t = Duration::from_secs(30);
    let held = a
        .leases()
        .unwrap()
        .grant(&name, t)
        .await
        .unwrap()
        .expect("free lease");
    assert!(b.leases().unwrap().force_revoke(&name).await.unwrap());
    let e = held.renew(t).await.unwrap_err();
    assert!(
        matches!(e, Error::NotHeld { .. }),
        "renew after force: {e:?}"
    );
    let next = b
        .leases()
        .unwrap()
        .grant(&name, t)
        .await
        .unwrap()
        .expect("a force-revoked lease is free at once");
    assert!(next.fencing_token() > held.fencing_token());
    next.revoke().await.unwrap();
    assert!(!b.leases().unwrap().force_revoke(&name).await.unwrap());
}
