//! Late copies of a claim owner's own steps (attempts and extends of
//! locks, leases and semaphores), and what a guard counts from while one
//! may still land.

use std::time::{Duration, Instant};

use coord_core::{Attempt, Lock, OwnerToken, Semaphore};

use super::{
    CUT_AFTER, DELAY, before_the_copy, hold_next_naming, until_answered, until_reconnected,
};
use crate::claim_kind::ClaimKind;
use crate::testkit::proxy::FaultProxy;

/// The first attempt's TTL, and the retry's.
const SHORT: Duration = Duration::from_secs(1);
/// The extend's TTL.
const LONG: Duration = Duration::from_secs(30);
/// The TTL of the extend whose copy lands late: longer than [`DELAY`].
const SHORT_EXTEND: Duration = Duration::from_secs(5);
/// The TTL of the extend held in the network in
/// [`late_extend_after_a_later_one`]. Once it goes unanswered, the guard
/// counts at most this long, so the holder's next extend must be answered
/// within it, after the client reconnected ([`CUT_AFTER`]): 2 s leaves it
/// 1.6 s, where 1 s left 650 ms, too little on a loaded machine.
const HELD_EXTEND: Duration = Duration::from_secs(2);

/// The owner's first attempt on `name` (TTL 1 s) is held in the network
/// past its call (`via`, through `proxy`, is dropped after 10 ms); its
/// retry is granted and the owner extends to 30 s; then the first attempt's
/// copy lands. It must not be taken for the holder retrying and set the
/// expiry back to 1 s: another owner (through `direct`) would be granted
/// while the holder's guard is valid for half a minute more. The extend of
/// an owner with an unanswered attempt marks it, so the copy (stamped
/// before) changes nothing. `name` must not occur in any other request
/// `via` sends meanwhile.
pub async fn late_copy_after_extend<B: Lock + Semaphore>(
    kind: ClaimKind,
    via: &B,
    direct: &B,
    proxy: &FaultProxy,
    name: &str,
) {
    let o = OwnerToken::random();
    // Warm the connection, so the held attempt is one request. `via`'s
    // call timeout is short: on a loaded machine the warm-up itself may go
    // unanswered, so it is tried until it is answered.
    let warm_until = Instant::now() + Duration::from_secs(10);
    until_answered(warm_until, "the warm-up", || kind.try_holders(via, "warm")).await;
    hold_next_naming(proxy, name);
    let held_at = Instant::now();
    let a1 = tokio::time::timeout(
        Duration::from_millis(10),
        kind.attempt(via, name, &o, SHORT),
    )
    .await;
    assert!(
        a1.is_err(),
        "the first attempt should be dropped unanswered: {a1:?}"
    );
    // The retry, on a new connection once the first one's is cut.
    until_reconnected(held_at).await;
    let deadline = before_the_copy(held_at);
    let a2 = until_answered(deadline, "the retry", || kind.attempt(via, name, &o, SHORT)).await;
    assert!(matches!(a2, Attempt::Granted(_)), "the retry: {a2:?}");
    let extended =
        until_answered(deadline, "the extend", || kind.extend(via, name, &o, LONG)).await;
    assert!(extended, "the extend");
    assert!(
        held_at.elapsed() < DELAY,
        "the extend ended after the first attempt's copy landed: the round proves nothing"
    );
    // The copy lands at DELAY; with its TTL it would end 1 s later.
    tokio::time::sleep_until((held_at + DELAY + SHORT + Duration::from_millis(500)).into()).await;
    assert_eq!(proxy.held(), 1, "the first attempt was held by the proxy");
    assert_eq!(
        proxy.delivered(),
        1,
        "the first attempt's copy was delivered (not written: {:?})",
        proxy.undelivered()
    );
    let other = kind
        .attempt(direct, name, &OwnerToken::random(), LONG)
        .await
        .unwrap();
    assert!(
        !matches!(other, Attempt::Granted(_)),
        "{kind:?}: another owner was granted while the holder's extend to 30 s had more than 25 s to \
         run: the late copy of the holder's first attempt set its expiry back"
    );
    assert_eq!(kind.holders(direct, name).await, vec![o]);
}

/// Two extends of a holder in a row, to 5 s then 6 s, are each held in
/// the network past its call (`via`, through `proxy`; the caller gives up
/// on each once it is held, unanswered); the holder extends again, to
/// 30 s, and is answered; then the copies land, 3 s after each was sent.
/// The store must refuse both, as any step of an owner stamped before one
/// of its steps the store already applied: set back to 5 or 6 s (from when
/// it landed, or from when it was sent where the extend's parts go
/// separately), the claim would be granted to another owner (through
/// `direct`) while its holder was answered with 30 s. The second extend is
/// sent after the first went unanswered, so a store that handles such an
/// extend apart (a marking one) is tried with its copy too. The copies
/// land within their own TTL, so even a store that moves a claim onto a
/// lease granted when the extend was sent keeps that lease alive for them.
/// The request held is the first naming `name` and, with `with_owner`,
/// the owner's token in hex (a store whose extend reads first and then
/// writes the owner's token, as etcd's semaphores do, holds its write).
/// `name` must not occur in any other request `via` sends meanwhile.
pub async fn late_copy_of_an_extend_after_a_later_one<B: Lock + Semaphore>(
    kind: ClaimKind,
    via: &B,
    direct: &B,
    proxy: &FaultProxy,
    name: &str,
    with_owner: bool,
) {
    let o = OwnerToken::random();
    let until = Instant::now() + Duration::from_secs(10);
    let granted = until_answered(until, "the acquire", || kind.attempt(via, name, &o, LONG)).await;
    assert!(matches!(granted, Attempt::Granted(_)), "{granted:?}");
    let hex = if with_owner {
        o.to_hex()
    } else {
        name.to_string()
    };
    let first_at = Instant::now();
    for (i, ttl) in [SHORT_EXTEND, SHORT_EXTEND + SHORT].into_iter().enumerate() {
        let (n, hex) = (name.to_string(), hex.clone());
        proxy.deliver_late(
            move |b: &[u8]| {
                let has = |s: &str| b.windows(s.len()).any(|w| w == s.as_bytes());
                has(&n) && has(&hex)
            },
            DELAY,
            CUT_AFTER,
        );
        // The caller gives up on the extend once the proxy holds its
        // request naming the claim (a store may send others first). One
        // that fails before (sent on the connection the proxy cut) is sent
        // again, as a caller would.
        let give_up = Instant::now() + Duration::from_secs(5);
        let (held_at, short) = loop {
            let sent_at = Instant::now();
            let mut short = Box::pin(kind.extend(via, name, &o, ttl));
            let held = async {
                while proxy.held() < i as u64 + 1 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            };
            tokio::select! {
                r = &mut short => {
                    assert!(r.is_err(), "extend {i} to {ttl:?} was answered: {r:?}");
                    assert!(Instant::now() < give_up, "extend {i} never reached the proxy: {r:?}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                r = tokio::time::timeout(CUT_AFTER, held) => {
                    r.expect("the extend sent no request naming the claim");
                    break (sent_at, short);
                }
            }
        };
        // Given up only once the proxy stopped gathering what follows the
        // request, so a cancellation the client sends (gRPC does) never
        // travels with the copy.
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(short);
        until_reconnected(held_at).await;
    }
    let deadline = before_the_copy(first_at);
    let extended =
        until_answered(deadline, "the extend", || kind.extend(via, name, &o, LONG)).await;
    assert!(extended, "{kind:?}: the long extend");
    assert!(
        first_at.elapsed() < DELAY,
        "the long extend ended after the first copy landed: the round proves nothing"
    );
    // The copies land about DELAY after each was sent; applied, the claim
    // would end SHORT_EXTEND + SHORT later at the latest.
    tokio::time::sleep_until(
        (first_at + DELAY + 2 * CUT_AFTER + SHORT_EXTEND + SHORT + Duration::from_millis(500))
            .into(),
    )
    .await;
    assert_eq!(proxy.held(), 2, "both extends were held by the proxy");
    assert_eq!(
        proxy.delivered(),
        2,
        "both copies were delivered (not written: {:?})",
        proxy.undelivered()
    );
    let other = kind
        .attempt(direct, name, &OwnerToken::random(), LONG)
        .await
        .unwrap();
    assert!(
        !matches!(other, Attempt::Granted(_)),
        "{kind:?}: another owner was granted while the holder's extend to 30 s had more than 20 s \
         to run: a late copy of one of its earlier extends, to 5 or 6 s, was applied after it"
    );
    assert_eq!(kind.holders(direct, name).await, vec![o]);
    assert!(kind.release(direct, name, &o).await.unwrap());
}

/// A holder's extend to 2 s (`HELD_EXTEND`) is held in the network past
/// its call (its caller gave up on it after 10 ms); the holder extends
/// again, to 30 s, and is answered; then the 2 s extend's copy lands and
/// sets the store's expiry to 2 s from then. The guard must not count its validity from the
/// 30 s it was answered with: by the time another owner (through `direct`)
/// is granted the name, the guard says it is no longer valid (a guard may
/// count from the short TTL while such a copy may still land, whatever the
/// store did with it). `name` must
/// not occur in any other request `via` sends meanwhile.
pub async fn late_extend_after_a_later_one(
    via: &coord_core::Coord,
    direct: &coord_core::Coord,
    proxy: &FaultProxy,
    name: &str,
) {
    let locks = via.locks().unwrap();
    let guard = locks.acquire(name, LONG, Duration::ZERO).await.unwrap();
    hold_next_naming(proxy, name);
    let held_at = Instant::now();
    let short = tokio::time::timeout(Duration::from_millis(10), guard.extend(HELD_EXTEND)).await;
    assert!(short.is_err(), "the short extend was answered: {short:?}");
    until_reconnected(held_at).await;
    // Extended again (tried until answered, as a caller would) before the
    // held copy lands.
    let deadline = before_the_copy(held_at);
    until_answered(deadline, "the extend", || async {
        match guard.extend(LONG).await {
            Err(e @ coord_core::Error::NotHeld { .. }) => panic!("the holder lost its lock: {e}"),
            r => r,
        }
    })
    .await;
    assert!(
        Instant::now() < held_at + DELAY,
        "the long extend was answered only after the held copy landed"
    );
    while proxy.delivered() < 1 {
        assert!(
            held_at.elapsed() < DELAY * 2,
            "the held extend was never delivered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The copy set the expiry to 2 s from when it landed: another owner is
    // granted within a few seconds; the guard must not be valid by then.
    let other = direct
        .locks()
        .unwrap()
        .acquire(name, LONG, Duration::from_secs(5))
        .await;
    match other {
        Ok(g) => {
            assert!(
                !guard.is_valid(),
                "another owner was granted while the guard is valid for {:?} more",
                guard.remaining()
            );
            g.release().await.unwrap();
        }
        Err(coord_core::Error::Timeout { .. }) => {
            // The store kept the 30 s extend (the copy changed nothing);
            // the guard may count from 2 s all the same, which is safe.
            let _ = guard.release().await;
        }
        Err(e) => panic!("the other owner's acquire: {e}"),
    }
}
