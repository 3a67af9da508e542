//! Late copies of an owner's own attempts, one scenario for every store
//! that refuses them (`coord_core::late`): each backend's tests call it
//! with a client behind a [`FaultProxy`] and one connected directly.

use std::time::{Duration, Instant};

use coord_core::{Attempt, Lock, OwnerToken, Semaphore};

use crate::claim_kind::ClaimKind;
use crate::testkit::proxy::FaultProxy;

/// The first attempt's TTL, and the retry's.
const SHORT: Duration = Duration::from_secs(1);
/// The extend's TTL.
const LONG: Duration = Duration::from_secs(30);
/// When the held attempt reaches the store, from its send: time enough
/// for the retry and the extend (each tried again until answered) on a
/// loaded machine.
const DELAY: Duration = Duration::from_millis(3000);
/// The TTL of the extend whose copy lands late: longer than [`DELAY`].
const SHORT_EXTEND: Duration = Duration::from_secs(5);
/// When the held attempt's connection is cut (the client reconnects).
const CUT_AFTER: Duration = Duration::from_millis(300);

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
    while kind.try_holders(via, "warm").await.is_err() {
        assert!(Instant::now() < warm_until, "the warm-up never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let n = name.to_string();
    proxy.deliver_late(
        move |b: &[u8]| b.windows(n.len()).any(|w| w == n.as_bytes()),
        DELAY,
        CUT_AFTER,
    );
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
    tokio::time::sleep_until((held_at + CUT_AFTER + Duration::from_millis(50)).into()).await;
    let deadline = held_at + DELAY - Duration::from_millis(200);
    let a2 = loop {
        match kind.attempt(via, name, &o, SHORT).await {
            Ok(a) => break a,
            Err(e) => {
                assert!(Instant::now() < deadline, "the retry never answered: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert!(matches!(a2, Attempt::Granted(_)), "the retry: {a2:?}");
    // `via`'s call timeout is short: on a loaded machine a call can time
    // out unanswered, and the owner tries again, as a caller would.
    let extended = loop {
        match kind.extend(via, name, &o, LONG).await {
            Ok(e) => break e,
            Err(e) => {
                assert!(Instant::now() < deadline, "the extend never answered: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
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
        "the first attempt's copy was delivered"
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
    // `via`'s call timeout is short: on a loaded machine a call can go
    // unanswered, and it is tried again, as a caller would.
    let granted = loop {
        match kind.attempt(via, name, &o, LONG).await {
            Ok(a) => break a,
            Err(e) => {
                assert!(Instant::now() < until, "the acquire never answered: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
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
        tokio::time::sleep_until((held_at + CUT_AFTER + Duration::from_millis(50)).into()).await;
    }
    let deadline = first_at + DELAY - Duration::from_millis(200);
    let extended = loop {
        match kind.extend(via, name, &o, LONG).await {
            Ok(e) => break e,
            Err(e) => {
                assert!(Instant::now() < deadline, "the extend never answered: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
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
    assert_eq!(proxy.delivered(), 2, "both copies were delivered");
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

/// 3 parties: b waits (through `direct`); a's arrival (through `via`,
/// whose call timeout must be well under a second) is held in the network
/// 2.5 s, so a's wait times out and a is withdrawn; then the held copy
/// lands. It must not make a a member again: c's arrival must not
/// complete the generation (2 live participants of 3). `name` must not
/// contain `a-late`.
pub async fn late_copy_of_a_timed_out_barrier_arrival(
    via: &coord_core::Coord,
    direct: &coord_core::Coord,
    proxy: &FaultProxy,
    name: &str,
) {
    const SEC: Duration = Duration::from_secs(1);
    // Warm the slow client's connection, so the held arrival is one request.
    via.barriers()
        .unwrap()
        .wait(&format!("{name}-warm"), 1, "w", 5 * SEC)
        .await
        .unwrap();
    let b = tokio::spawn({
        let (direct, name) = (direct.clone(), name.to_string());
        async move {
            let barriers = direct.barriers().unwrap();
            barriers.wait(&name, 3, "b", 30 * SEC).await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.deliver_late(
        |chunk| chunk.windows(6).any(|w| w == b"a-late"),
        Duration::from_millis(2500),
        Duration::from_millis(300),
    );
    let a = via.barriers().unwrap().wait(name, 3, "a-late", SEC).await;
    assert!(a.is_err(), "a passed alone with b: {a:?}");
    assert_eq!(proxy.held(), 1, "the arrival was held");
    let deadline = Instant::now() + 5 * SEC;
    while proxy.delivered() < 1 {
        assert!(Instant::now() < deadline, "never delivered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let the store apply it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let c = direct.barriers().unwrap().wait(name, 3, "c", SEC).await;
    assert!(
        matches!(c, Err(coord_core::Error::Timeout { .. })),
        "a barrier of 3 passed with 2 live participants (the late copy of a \
         withdrawn arrival counted): {c:?}"
    );
    assert!(
        !b.is_finished(),
        "b passed without a third live participant"
    );
    b.abort();
}

/// A queue whose messages may be delivered once (`max_deliveries(1)`): a
/// pop through `via` (call timeout well under a second) is held in the
/// network 2.5 s, so it fails; then its copy lands. The message must not
/// go to that attempt's consumer, whom nobody holds (where it would stay
/// for the 30 s visibility and then be dead-lettered, never seen): a
/// consumer through `direct` gets it within a second, as its first
/// delivery. `name` must not contain `pop-late`.
pub async fn late_pop_with_one_delivery_allowed(
    via: &coord_core::Coord,
    direct: &coord_core::Coord,
    proxy: &FaultProxy,
    name: &str,
) {
    use coord_core::{Lane, QueueConfig};
    const SEC: Duration = Duration::from_secs(1);
    let once = QueueConfig::default().max_deliveries(1);
    let far = via.queues().unwrap().with_config(once);
    let here = direct.queues().unwrap().with_config(once);
    let queue = format!("{name}-pop-late");
    // Warm the slow client's connection, so the held pop is one request.
    far.stats(&format!("{name}-warm")).await.unwrap();
    let id = here.push(&queue, b"once").await.unwrap();
    proxy.deliver_late(
        |chunk| chunk.windows(8).any(|w| w == b"pop-late"),
        Duration::from_millis(2500),
        Duration::from_millis(300),
    );
    let held_at = Instant::now();
    let first = tokio::time::timeout(2 * SEC, far.pop(&queue, 30 * SEC, Duration::ZERO)).await;
    assert!(
        !matches!(first, Ok(Ok(Some(_)))),
        "the held pop was answered: {first:?}"
    );
    assert_eq!(proxy.held(), 1, "the pop was held");
    while proxy.delivered() < 1 {
        assert!(held_at.elapsed() < 5 * SEC, "never delivered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let the store apply it, and the abandon (if it came second) too.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let d = here
        .pop(&queue, 30 * SEC, SEC)
        .await
        .unwrap()
        .expect("the message went to a consumer nobody holds (a late pop's copy)");
    assert_eq!(d.id(), id);
    assert_eq!(d.attempts(), 1, "a delivery nobody saw was counted");
    d.ack().await.unwrap();
    assert!(
        here.peek(&queue, Lane::Dead, 10).await.unwrap().is_empty(),
        "dead-lettered"
    );
}

/// A queue whose messages may be delivered once (`max_deliveries(1)`): a
/// pop dropped while its attempt is on its way gives back what the attempt
/// delivered without counting it (nobody saw it), so the next consumer
/// still gets the message, not the dead lane.
pub async fn dropped_pop_with_one_delivery_allowed(c: &coord_core::Coord, name: &str) {
    const SEC: Duration = Duration::from_secs(1);
    let here = c
        .queues()
        .unwrap()
        .with_config(coord_core::QueueConfig::default().max_deliveries(1));
    // A reply can be in by the end of the first poll (the attempt's task
    // ran on another worker at once): then the delivery was the caller's,
    // and dropping it gives it back counted. Such a round is tried again
    // on another queue.
    let mut tries = 0;
    loop {
        tries += 1;
        assert!(tries <= 20, "every pop was answered within its first poll");
        let q = format!("{name}-pop-dropped-{tries}");
        let id = here.push(&q, b"once").await.unwrap();
        let mut pop = Box::pin(here.pop(&q, 30 * SEC, Duration::ZERO));
        // One poll sends the attempt (in a task of its own); the pop is
        // never polled again, so whatever the attempt delivered, its
        // caller never saw. Dropped once the store shows the message in
        // flight.
        if futures::poll!(pop.as_mut()).is_ready() {
            continue;
        }
        let shown = Instant::now() + 5 * SEC;
        let mut delivered = false;
        while Instant::now() < shown {
            if here.stats(&q).await.unwrap().in_flight == 1 {
                delivered = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(delivered, "the attempt never delivered the message");
        drop(pop);
        let deadline = Instant::now() + 5 * SEC;
        let d = loop {
            if let Some(d) = here.pop(&q, 30 * SEC, SEC).await.unwrap() {
                break d;
            }
            assert!(
                Instant::now() < deadline,
                "the dropped pop's delivery never came back"
            );
        };
        assert_eq!(d.id(), id);
        assert_eq!(d.attempts(), 1, "the dropped pop's delivery was counted");
        d.ack().await.unwrap();
        break;
    }
}

/// A holder's extend to 1 s is held in the network past its call (its
/// caller gave up on it after 10 ms); the holder extends again, to 30 s,
/// and is answered; then the 1 s extend's copy lands and sets the store's
/// expiry to 1 s from then. The guard must not count its validity from the
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
    let n = name.to_string();
    proxy.deliver_late(
        move |b: &[u8]| b.windows(n.len()).any(|w| w == n.as_bytes()),
        DELAY,
        CUT_AFTER,
    );
    let held_at = Instant::now();
    let short = tokio::time::timeout(Duration::from_millis(10), guard.extend(SHORT)).await;
    assert!(short.is_err(), "the short extend was answered: {short:?}");
    tokio::time::sleep_until((held_at + CUT_AFTER + Duration::from_millis(50)).into()).await;
    // Extended again (tried until answered, as a caller would) before the
    // held copy lands.
    let deadline = held_at + DELAY - Duration::from_millis(200);
    loop {
        match guard.extend(LONG).await {
            Ok(()) => break,
            Err(e @ coord_core::Error::NotHeld { .. }) => panic!("the holder lost its lock: {e}"),
            Err(e) => {
                assert!(Instant::now() < deadline, "the extend never answered: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
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
    // The copy set the expiry to 1 s from when it landed: another owner is
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
            // the guard may count from 1 s all the same, which is safe.
            let _ = guard.release().await;
        }
        Err(e) => panic!("the other owner's acquire: {e}"),
    }
}

/// 2 parties: q waits (through `direct`); p's arrival (through `via`) is
/// held in the network 3 s and its connection cut, so the wait sends it
/// again (the same arrival) on a new connection, and p and q pass that
/// generation; they pass the next one too. Then the held copy lands, in
/// a generation neither has arrived at. It must count nowhere: q, alone,
/// must not pass (p's old arrival would make it the second party). `name`
/// must not contain `p-old`.
pub async fn late_copy_of_an_arrival_that_passed(
    via: &coord_core::Coord,
    direct: &coord_core::Coord,
    proxy: &FaultProxy,
    name: &str,
) {
    const SEC: Duration = Duration::from_secs(1);
    let (far, here) = (via.barriers().unwrap(), direct.barriers().unwrap());
    // Warm the slow client's connection, so the held arrival is one request.
    far.wait(&format!("{name}-warm"), 1, "w", 5 * SEC)
        .await
        .unwrap();
    let round = |here: coord_core::Barriers, name: String| {
        tokio::spawn(async move { here.wait(&name, 2, "q", 10 * SEC).await })
    };
    let q = round(here.clone(), name.to_string());
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.deliver_late(
        |chunk| chunk.windows(5).any(|w| w == b"p-old"),
        3 * SEC,
        Duration::from_millis(300),
    );
    let held_at = Instant::now();
    let first = far.wait(name, 2, "p-old", 10 * SEC).await.unwrap();
    assert_eq!(q.await.unwrap().unwrap(), first);
    assert_eq!(proxy.held(), 1, "the arrival was held");
    let q = round(here.clone(), name.to_string());
    let second = far.wait(name, 2, "p-old", 10 * SEC).await.unwrap();
    assert_eq!(q.await.unwrap().unwrap(), second);
    assert!(second > first);
    assert!(
        proxy.delivered() == 0,
        "the held copy landed before the second round ended ({:?} after it was held)",
        held_at.elapsed()
    );
    while proxy.delivered() < 1 {
        assert!(held_at.elapsed() < 6 * SEC, "never delivered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let the store apply it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let alone = here.wait(name, 2, "q", SEC).await;
    assert!(
        matches!(alone, Err(coord_core::Error::Timeout { .. })),
        "a barrier of 2 passed with 1 participant (the late copy of an arrival that had \
         passed counted again): {alone:?}"
    );
}
