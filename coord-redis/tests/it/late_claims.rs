//! Late copies of timed-out claim attempts (`coord_core::late`) on locks,
//! leases and elections: a copy delayed in the network past the call
//! timeout, landing after its owner gave up and left, takes nothing; the
//! owner's own later attempts are not refused; answered attempts leave no
//! mark. (The lock case in the default layout is
//! `claim_wakeups_and_tokens::a_late_attempt_after_a_timed_out_acquire_takes_no_lock`.)

use crate::common;
use std::time::Duration;

use common::{SEC, granted, unique};
use conformance::facade_claim::{FacadeClaim, Held};
use conformance::testkit::proxy::FaultProxy;
use conformance::testkit::redis::{RedisServer, Resp};
use conformance::testkit::wait::until;
use coord_core::{Coord, Election, Lease, Lock, OwnerToken, Step};
use coord_redis::{Layout, RedisBackend, RedisOptions};

#[derive(Clone, Copy, Debug)]
enum Case {
    PhpLayoutLock,
    Lease,
    Election,
}

/// Take `name` as `case` says, waiting up to `wait` (a lease: one grant):
/// `Ok(None)` when refused (or timed out waiting).
async fn take(
    c: &Coord,
    case: Case,
    name: &str,
    ttl: Duration,
    wait: Duration,
) -> coord_core::Result<Option<Held>> {
    let claim = match case {
        Case::PhpLayoutLock => FacadeClaim::Lock,
        Case::Lease => FacadeClaim::Lease,
        Case::Election => FacadeClaim::Election,
    };
    claim.take(c, name, ttl, wait).await
}

/// Warm `b`'s connection with a claim of `case` and its release, each
/// call tried again until answered (`b`'s call timeout is 200 ms, which a
/// loaded machine can outlast). One owner: its retry of an unanswered
/// attempt is that attempt.
async fn warm(b: &RedisBackend, case: Case) {
    let o = OwnerToken::random();
    let ttl = 10 * SEC;
    let (a, _) = common::until_answered("the warm-up claim", || async {
        match case {
            Case::PhpLayoutLock => Lock::try_acquire(b, "warm", o.step(), ttl).await,
            Case::Lease => Lease::grant(b, "warm", o.step(), ttl).await,
            Case::Election => Election::try_campaign(b, "warm", "late", o.step(), ttl).await,
        }
    })
    .await;
    granted(a);
    let (released, tries) = common::until_answered("the warm-up release", || async {
        match case {
            Case::PhpLayoutLock => Lock::release(b, "warm", o.step()).await,
            Case::Lease => Lease::revoke(b, "warm", o.step()).await,
            Case::Election => Election::resign(b, "warm", o.step()).await,
        }
    })
    .await;
    assert!(
        released || tries > 1,
        "{case:?}: the warm-up claim was not held at its release"
    );
}

/// As
/// `claim_wakeups_and_tokens::a_late_attempt_after_a_timed_out_acquire_takes_no_lock`
/// for `case`: the first attempt of a client behind a slow proxy is
/// delayed 1.5 s, past its 200 ms call timeout; it gives up (its cleanup
/// leaves the mark); the holder releases; the late copy lands on the free
/// claim. The next attempt of another client must be granted.
async fn a_late_copy_takes_nothing(case: Case) {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let layout = match case {
        Case::PhpLayoutLock => Layout::Php,
        _ => Layout::Coord,
    };
    let via = RedisBackend::connect(
        RedisOptions::new(&format!("redis://127.0.0.1:{}", proxy.port()))
            .layout(layout)
            .timeout(Duration::from_millis(200)),
    )
    .await
    .unwrap();
    let direct = RedisOptions::new(&server.url())
        .layout(layout)
        .connect()
        .await
        .unwrap();
    let name = unique("late-claim");
    // Warm the slow client's connection, so the delayed attempt is one message.
    warm(&via, case).await;
    let via = via.into_coord();
    let held = take(&direct, case, &name, 60 * SEC, Duration::ZERO)
        .await
        .unwrap()
        .expect("the holder takes the free claim");
    proxy.latency(Duration::from_millis(1500));
    let waiter = tokio::spawn({
        let (via, name) = (via.clone(), name.clone());
        async move {
            // Refused, timed out waiting, or (one lease grant) no answer.
            take(&via, case, &name, 60 * SEC, Duration::from_millis(600))
                .await
                .is_ok_and(|h| h.is_some())
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    proxy.latency(Duration::ZERO);
    assert!(
        !waiter.await.unwrap(),
        "{case:?}: the waiter should give up"
    );
    // Its cleanup (in the background) leaves the mark.
    until("the waiter's mark", 10 * SEC, || async {
        !marks(&server, &name).is_empty()
    })
    .await;
    held.release().await;
    // Let the delayed attempt land.
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let next = take(&direct, case, &name, 10 * SEC, Duration::ZERO)
        .await
        .unwrap();
    assert!(
        next.is_some(),
        "{case:?}: the claim is free and nobody waits, yet it is refused: the \
         timed-out attempt's late copy took it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_php_layout_lock_attempt_takes_no_lock() {
    a_late_copy_takes_nothing(Case::PhpLayoutLock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_timed_out_lease_grant_takes_no_lease() {
    a_late_copy_takes_nothing(Case::Lease).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_timed_out_campaign_elects_nobody() {
    a_late_copy_takes_nothing(Case::Election).await;
}

/// The marks of owners that left `name` (any kind, either layout).
fn marks(server: &RedisServer, name: &str) -> Vec<String> {
    keys(server, "*:left:*")
        .into_iter()
        .filter(|k| k.contains(name))
        .collect()
}

fn keys(server: &RedisServer, pattern: &str) -> Vec<String> {
    match server.command(&["KEYS", pattern]) {
        Resp::Array(Some(items)) => items
            .into_iter()
            .map(|k| match k {
                Resp::Bulk(Some(b)) => String::from_utf8(b).unwrap(),
                other => panic!("{other:?}"),
            })
            .collect(),
        other => panic!("{other:?}"),
    }
}

/// Raw trait calls with one owner: its attempt times out behind the slow
/// proxy, its release (finding nothing) leaves the mark for 30 s, the late
/// copy lands and is refused (the lock stays free). The same owner's next
/// attempt, stamped after the mark, is granted all the same; its release
/// (after an answered attempt) leaves no further mark, and nor does any
/// cycle of answered attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_stamped_after_the_mark_is_granted_and_answered_ones_leave_no_mark() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let via = RedisBackend::connect(
        RedisOptions::new(&format!("redis://127.0.0.1:{}", proxy.port()))
            .timeout(Duration::from_millis(200)),
    )
    .await
    .unwrap();
    let direct = common::backend(&server.url()).await;
    let name = unique("late-raw");
    let owner = OwnerToken::random();
    // Answered cycles leave no mark.
    let warm = OwnerToken::random();
    for _ in 0..3 {
        granted(
            Lock::try_acquire(&via, &name, warm.step(), SEC)
                .await
                .unwrap(),
        );
        assert!(Lock::release(&via, &name, warm.step()).await.unwrap());
    }
    assert_eq!(keys(&server, "*:left:*"), Vec::<String>::new());

    proxy.latency(Duration::from_millis(1500));
    let r = Lock::try_acquire(&via, &name, owner.step(), 60 * SEC).await;
    proxy.latency(Duration::ZERO);
    assert!(r.is_err(), "the attempt should time out: {r:?}");
    // The caller's book knows the attempt went unanswered: its release
    // marks.
    let marking = Step {
        mark: true,
        ..owner.step()
    };
    assert!(!Lock::release(&via, &name, marking).await.unwrap());
    let mark = format!("coord:lock:{{{name}}}:left:{}", owner.to_hex());
    assert_eq!(keys(&server, "*:left:*"), vec![mark.clone()]);
    match server.command(&["PTTL", &mark]) {
        Resp::Int(ms) => assert!(ms > 29_000 && ms <= 30_000, "the mark lives 30 s: {ms}"),
        other => panic!("{other:?}"),
    }
    // The late copy lands, and is refused.
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let info = Lock::inspect(&direct, &name).await.unwrap();
    assert!(info.holders.is_empty(), "the late copy took the lock");

    // The owner again (a raw caller may reuse it after its release): stamped
    // after the mark, granted.
    granted(
        Lock::try_acquire(&via, &name, owner.step(), 10 * SEC)
            .await
            .unwrap(),
    );
    assert!(Lock::release(&via, &name, owner.step()).await.unwrap());
    for _ in 0..3 {
        let o = OwnerToken::random();
        granted(Lock::try_acquire(&via, &name, o.step(), SEC).await.unwrap());
        assert!(Lock::release(&via, &name, o.step()).await.unwrap());
    }
    assert_eq!(keys(&server, "*:left:*"), vec![mark]);
}

/// Redlock: the waiter's first attempt is delayed 1.5 s on two of three
/// masters (past the 200 ms call timeout); the acquire gives up, the holder
/// releases, and the copies land on the two masters. They must not take
/// the lock there (a quorum of ghosts, for 60 s): the next acquire of
/// another client must be granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_late_copies_on_a_quorum_of_masters_take_no_lock() {
    let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let (pa, pb) = (
        FaultProxy::start(masters[0].port()),
        FaultProxy::start(masters[1].port()),
    );
    let via = coord_redis::connect(&format!(
        "redlock://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}?timeout=200ms",
        pa.port(),
        pb.port(),
        masters[2].port()
    ))
    .await
    .unwrap();
    let direct = coord_redis::connect(&format!(
        "redlock://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}",
        masters[0].port(),
        masters[1].port(),
        masters[2].port()
    ))
    .await
    .unwrap();
    let name = unique("late-redlock");
    for c in [&via, &direct] {
        let g = common::eventually("warm", || async {
            c.locks().unwrap().acquire("warm", SEC, 5 * SEC).await
        })
        .await;
        g.release().await.unwrap();
    }
    let held = direct
        .locks()
        .unwrap()
        .try_acquire(&name, 60 * SEC)
        .await
        .unwrap()
        .expect("the holder takes the free lock");
    pa.watch(name.as_bytes());
    pb.watch(name.as_bytes());
    pa.latency(Duration::from_millis(1500));
    pb.latency(Duration::from_millis(1500));
    let waiter = tokio::spawn({
        let (via, name) = (via.clone(), name.clone());
        async move {
            via.locks()
                .unwrap()
                .acquire(&name, 60 * SEC, Duration::from_millis(600))
                .await
        }
    });
    // Its first attempt has reached both proxies (and took the latency):
    // the later ones need not.
    until("the first attempt on both proxies", 10 * SEC, || async {
        pa.seen() > 0 && pb.seen() > 0
    })
    .await;
    pa.latency(Duration::ZERO);
    pb.latency(Duration::ZERO);
    let r = waiter.await.unwrap();
    assert!(r.is_err(), "the waiter should give up: {r:?}");
    // Its cleanup (in the background) leaves the mark on the masters the
    // copies will land on.
    until("the waiter's marks", 10 * SEC, || async {
        masters[..2].iter().all(|m| !marks(m, &name).is_empty())
    })
    .await;
    held.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let next = direct
        .locks()
        .unwrap()
        .try_acquire(&name, 10 * SEC)
        .await
        .unwrap();
    assert!(
        next.is_some(),
        "the lock is free and nobody waits, yet it is refused: the timed-out \
         waiter's late copies took it on two masters"
    );
}
