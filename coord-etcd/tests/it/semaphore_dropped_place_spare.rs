//! A queued attempt dropped mid-call while its place transaction is on its
//! way: `OnItsWay::drop` revokes the place's lease in the background
//! (`revoke_later`, retried with back-off while etcd does not answer), yet
//! the owner's record keeps that lease as its own place. If the place
//! write landed, the owner's next release deletes it (an answered
//! transaction) and hands the lease to the spare pool while its revocation
//! is still pending; a new 30 s grant on that spare then dies when the
//! revocation lands, long before its TTL.
//!
//! The revocation is kept pending by a black hole long enough for its
//! back-off pause to grow (each send times out after the call timeout);
//! the proxy is healed right after one of its sends timed out, so the
//! release and the next grant run during its pause.

use std::time::Duration;

use conformance::testkit::etcd;
use conformance::testkit::proxy::{FaultProxy, Mode};
use coord_core::{Attempt, OwnerToken, PermitRequest, Semaphore};
use tokio::time::{Instant, sleep};

use crate::late_support::{SEC, connect, direct, keys, unique, until};

const CALL_TIMEOUT: Duration = Duration::from_millis(1000);

fn req(ttl: Duration, queue: bool) -> PermitRequest {
    PermitRequest {
        permits: 1,
        total: 1,
        ttl,
        queue,
    }
}

fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_place_lease_is_not_spared_while_its_revoke_is_pending() {
    let prefix = unique("dropped-place-spare");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    proxy.close_after_loss(true);
    let far = connect(proxy.port(), &prefix, CALL_TIMEOUT).await;
    let near = direct(&prefix).await;
    // Warm far's connection (a TTL other than 30 s: its spare stays apart).
    {
        let o = OwnerToken::random();
        let a = far
            .try_acquire("warm", o.step(), &req(3 * SEC, false))
            .await;
        assert!(matches!(a, Ok(Attempt::Granted(_))), "warm-up: {a:?}");
        assert!(far.release("warm", o.step()).await.unwrap());
    }
    // N is full: far's owner O queues (a place on a new 30 s lease P).
    let holder = OwnerToken::random();
    let a = near
        .try_acquire("n", holder.step(), &req(60 * SEC, false))
        .await;
    assert!(matches!(a, Ok(Attempt::Granted(_))), "holder: {a:?}");
    let o = OwnerToken::random();
    let hex = o.to_hex().into_bytes();
    proxy.watch(&hex);
    proxy.slow_requests(&hex, Duration::from_millis(300));
    let attempt = tokio::spawn({
        let far = far.clone();
        async move { far.try_acquire("n", o.step(), &req(30 * SEC, true)).await }
    });
    until("the place write sent", 5 * SEC, || proxy.seen() >= 1).await;
    // The write reaches etcd (after 300 ms), its reply is lost.
    proxy.set(Mode::DropReplies);
    let started = Instant::now();
    let place = loop {
        let k = keys(&prefix, "sem/n/").await;
        if let Some((_, lease)) = k.iter().find(|(k, _)| k.contains("/w/")) {
            break *lease;
        }
        assert!(started.elapsed() < 5 * SEC, "the place never landed: {k:?}");
        sleep(Duration::from_millis(5)).await;
    };
    // Nothing from far reaches etcd now; the attempt is dropped mid-call:
    // its place lease's revocation goes into the black hole.
    proxy.blackhole();
    proxy.watch(&varint(place as u64));
    assert!(
        !attempt.is_finished(),
        "the attempt ended before it could be dropped mid-call (call timeout too short here)"
    );
    attempt.abort();
    assert!(attempt.await.unwrap_err().is_cancelled());
    // Let the revocation fail 7 times (its next pause is 3.2 s), then heal
    // once the 7th send timed out.
    until("seven revocations sent", 30 * SEC, || proxy.seen() >= 7).await;
    sleep(CALL_TIMEOUT + Duration::from_millis(150)).await;
    let sends_before = proxy.seen();
    proxy.heal();
    // O's release deletes the landed place (answered): its lease P goes to
    // the spare pool, still being revoked.
    let released = far.release("n", o.step()).await;
    let place_left = keys(&prefix, "sem/n/").await;
    // The case bites only if the revocation is still pending now.
    let mut raw = etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap();
    let left = raw.lease_time_to_live(place, None).await.unwrap().ttl();
    assert!(
        left > 0,
        "the place's lease was revoked before the release ({left}): nothing to spare"
    );
    // Another owner's 30 s grant through far (on the spare P, if so).
    let o2 = OwnerToken::random();
    let granted_at = Instant::now();
    let g = far.try_acquire("m", o2.step(), &req(30 * SEC, false)).await;
    let m_keys = keys(&prefix, "sem/m/").await;
    eprintln!(
        "place lease {place:x}; revocation sends before heal {sends_before}; release {released:?}; \
         keys of n after it {place_left:?}; grant {g:?}; keys of m {m_keys:?}"
    );
    assert!(matches!(g, Ok(Attempt::Granted(_))), "grant: {g:?}");
    // Wait for the pending revocation to land (its pause ends ~3.2 s after
    // the heal), well within the grant's 30 s TTL.
    sleep(6 * SEC).await;
    let seen = near.inspect("m").await.unwrap();
    let after = keys(&prefix, "sem/m/").await;
    let released_m = far.release("m", o2.step()).await;
    eprintln!(
        "revocation sends in all {}; {:?} after the grant: holders of m {:?}, keys {after:?}; \
         release of m {released_m:?}",
        proxy.seen(),
        granted_at.elapsed(),
        seen.holders
    );
    assert!(
        seen.holders.len() == 1 && matches!(released_m, Ok(true)),
        "a 30 s grant answered Granted {:?} ago is gone (grant keys were {m_keys:?}, now \
         {after:?}): its lease was the dropped place's, spared while being revoked",
        granted_at.elapsed()
    );
    let _ = near.release("n", holder.step()).await;
}
