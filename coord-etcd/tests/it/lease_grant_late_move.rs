//! A named-lease grant that finds its owner's key already there ("ours
//! already": a retry after a lost reply, or the owner granted through
//! another client) moves that key onto the etcd lease it just granted
//! (`claim/named_lease.rs`). If the caller never sees that move's answer
//! (dropped mid-call), the move may still land later: after the owner's
//! next grant moved the key onto a newer lease and was answered Granted.
//! The move compares the lease it read the key on, so landing then it
//! fails; comparing only the key's create revision, it put the key back
//! on the older lease, granted earlier and kept alive by nobody, and the
//! key ended at that lease's TTL, before the TTL the later grant was
//! answered with (and another owner was granted while it still ran).
//!
//! The held move is picked by its put: the key followed at once by a lease
//! field (`0x18`), as only a put with an empty value (`with_ignore_value`)
//! has; the grant's create (a value) and its compares and reads do not.

use std::time::Duration;

use conformance::testkit::etcd;
use conformance::testkit::proxy::FaultProxy;
use coord_core::{Attempt, Lease, OwnerToken};
use etcd_client::GetOptions;
use tokio::time::{Instant, sleep, sleep_until};

use crate::late_support::{SEC, connect, direct, find, unique, until};

/// The far client's call timeout.
const CALL_TIMEOUT: Duration = Duration::from_millis(1000);
/// The TTL of the far client's grants.
const TTL: Duration = Duration::from_secs(15);
/// When the held move reaches etcd, from its hold (well within `TTL`, so
/// the lease it moves the key onto still lives).
const DELAY: Duration = Duration::from_millis(5500);
/// When the held move's connection is cut (the client reconnects).
const CUT_AFTER: Duration = Duration::from_millis(300);
/// When the owner's next grant is sent, from the hold.
const NEXT_GRANT: Duration = Duration::from_secs(4);

/// The key's (create revision, lease), if it exists.
async fn key_at(key: &str) -> Option<(i64, i64)> {
    let mut raw = etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap();
    let r = raw.get(key.as_bytes(), None::<GetOptions>).await.unwrap();
    r.kvs().first().map(|kv| (kv.create_revision(), kv.lease()))
}

/// What etcd says of lease `id`'s remaining time, in whole seconds.
async fn ttl_of(id: i64) -> i64 {
    let mut raw = etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap();
    raw.lease_time_to_live(id, None).await.unwrap().ttl()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_move_of_an_unanswered_lease_grant_never_shortens_a_later_grant() {
    let prefix = unique("lease-late-move");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let far = connect(proxy.port(), &prefix, CALL_TIMEOUT).await;
    let near = direct(&prefix).await;
    // Warm far's connection.
    {
        let w = OwnerToken::random();
        let a = Lease::grant(&*far, "warm", w.step(), 2 * SEC).await;
        assert!(matches!(a, Ok(Attempt::Granted(_))), "warm-up: {a:?}");
        let _ = Lease::revoke(&*far, "warm", w.step()).await;
    }
    // O holds the lease `n` through near (its key exists: far's grants of
    // O find it, "ours already", and move it onto their own lease).
    let o = OwnerToken::random();
    let a = Lease::grant(&*near, "n", o.step(), 30 * SEC).await;
    assert!(matches!(a, Ok(Attempt::Granted(_))), "near's grant: {a:?}");
    let key = format!("{prefix}lease/n");
    let (rev, near_lease) = key_at(&key).await.expect("the lease's key");

    let mut needle = key.clone().into_bytes();
    needle.push(0x18);
    proxy.deliver_late(move |b| find(b, &needle).is_some(), DELAY, CUT_AFTER);
    // Far's grant of O: its move is held; the caller gives up on it.
    let first = tokio::spawn({
        let far = far.clone();
        async move { Lease::grant(&*far, "n", o.step(), TTL).await }
    });
    until("the first grant's move held", 5 * SEC, || proxy.held() == 1).await;
    let held_at = Instant::now();
    sleep(Duration::from_millis(100)).await;
    assert!(
        !first.is_finished(),
        "the first grant ended before it was dropped mid-call"
    );
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());

    // O's next grant through far, on a new connection: answered Granted.
    sleep_until(held_at + NEXT_GRANT).await;
    let (second, sent) = loop {
        let sent = Instant::now();
        match Lease::grant(&*far, "n", o.step(), TTL).await {
            Ok(a) => break (a, sent),
            Err(e) => {
                assert!(
                    sent < held_at + DELAY - SEC,
                    "the next grant was not answered before the copy lands: {e}"
                );
                sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert!(
        matches!(second, Attempt::Granted(t) if t.0 == rev as u64),
        "the next grant: {second:?}"
    );
    let valid_until = sent + TTL;
    let (_, granted_on) = key_at(&key).await.expect("the key after the next grant");
    assert_ne!(
        granted_on, near_lease,
        "the next grant did not move the key"
    );
    assert!(
        Instant::now() < held_at + DELAY - Duration::from_millis(200),
        "the next grant ended after the held move landed: the round proves nothing"
    );

    // The held move lands.
    until("the held move delivered", DELAY + 5 * SEC, || {
        proxy.delivered() == 1
    })
    .await;
    sleep(Duration::from_millis(300)).await;
    let after = key_at(&key).await;
    let server_left = match after {
        Some((_, lease)) => ttl_of(lease).await,
        None => -1,
    };
    let promised = valid_until.saturating_duration_since(Instant::now());
    eprintln!(
        "near's lease {near_lease:x}; next grant's lease {granted_on:x}; key after the late \
         move {after:?}; its lease has {server_left} s left; the grant answered {:?} ago \
         promised {promised:?} more",
        sent.elapsed()
    );
    // etcd reports whole seconds: one more covers its rounding.
    let kept =
        after.is_some_and(|(r, _)| r == rev) && (server_left + 1) as u64 >= promised.as_secs();

    // And so: once that older lease ends, another owner is granted while
    // O's grant still runs.
    let check_at = held_at + TTL + Duration::from_millis(2500);
    sleep_until(check_at).await;
    assert!(
        Instant::now() < valid_until,
        "O's grant ran out before the check"
    );
    let other = Lease::grant(&*near, "n", OwnerToken::random().step(), 30 * SEC).await;
    eprintln!(
        "another owner's grant {:?} before O's grant runs out: {other:?}",
        valid_until.saturating_duration_since(Instant::now())
    );
    assert!(
        kept && !matches!(other, Ok(Attempt::Granted(_))),
        "a grant answered Granted for {TTL:?} sat on a lease etcd was to end in {server_left} s \
         ({promised:?} promised; key {after:?}, the grant put it on {granted_on:x}): the late \
         move of the dropped grant put it back on that grant's older lease; another owner's \
         grant {:?} before O's ran out: {other:?}",
        valid_until.saturating_duration_since(Instant::now())
    );
    let _ = Lease::revoke(&*far, "n", o.step()).await;
}
