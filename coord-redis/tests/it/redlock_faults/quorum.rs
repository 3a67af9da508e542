//! Decisions made by a quorum when the masters disagree: a late master set
//! to the quorum's token, a retry that gets its grant's token again, stale
//! and partial releases, and a watchdog that keeps a lock only with a
//! quorum.

use std::time::Duration;

use conformance::testkit::redis::RedlockMasters;
use conformance::testkit::wait::{holds_within, until};
use coord_core::{Listed, LockOptions};
use tokio::time::{Instant, sleep, timeout};

use super::{Frozen, client, live_claims, ready};

/// The watchdog keeps a lock while a quorum holds it (one master stopped),
/// and fires `lost` once a majority is gone (the stopped one restarted
/// empty, a second one stopped); the lock is then free for another client
/// once the TTL has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_holds_with_a_quorum_and_is_lost_without_one() {
    let set = RedlockMasters::start(3);
    let url = format!("{}?timeout=300ms&connect_timeout=5s", set.url());
    let (a, b) = (client(&url).await, client(&url).await);
    ready(&set, &[&a, &b]).await;
    // Long enough that a renewal (every third of it) slowed by a loaded
    // machine still comes in time; each hold below lasts two TTLs, so the
    // lock is valid only if renewals went through.
    let ttl = Duration::from_secs(2);
    let g = a
        .locks()
        .unwrap()
        .acquire_with("wd", LockOptions::new(ttl).watchdog(true))
        .await
        .unwrap();
    let lost = g.lost();
    tokio::pin!(lost);
    set.masters()[2].stop();
    sleep(ttl * 2).await;
    assert!(g.is_valid(), "the watchdog lost the lock with a quorum up");
    // Answered: b's first call after the stop may find a connection the
    // stop broke, or miss its 300 ms call timeout on a loaded machine.
    let other = conformance::testkit::wait::until_answered(
        std::time::Instant::now() + Duration::from_secs(10),
        "another client's try",
        || async { b.locks().unwrap().try_acquire("wd", ttl).await },
    )
    .await;
    assert!(
        other.is_none(),
        "another client got the lock the watchdog keeps"
    );
    assert!(
        timeout(Duration::from_millis(1), &mut lost).await.is_err(),
        "lost fired with a quorum up"
    );
    set.masters()[2].start_again();
    sleep(ttl * 2).await;
    assert!(g.is_valid());
    set.masters()[1].stop();
    let t = Instant::now();
    timeout(ttl * 3, &mut lost)
        .await
        .expect("lost fires once a majority no longer holds the claim");
    assert!(!g.is_valid());
    eprintln!("lost after {:?}", t.elapsed());
    let g2 = b
        .locks()
        .unwrap()
        .acquire("wd", ttl, ttl * 4)
        .await
        .expect("free for another client after the TTL");
    g2.release().await.unwrap();
    drop(g);
}

/// The token stored in a claim value `<owner>:<token>[~meta~][*]`.
fn stored_token(v: &str) -> u64 {
    let rest = v.split_once(':').expect("owner:token").1;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().expect("a token")
}

/// A master too slow to take part in the decision (250 ms each way behind
/// its proxy) grants late with a token of its own, and is then set to the
/// quorum's: every master holding the claim agrees on the grant's token,
/// and `inspect` shows that token. The next grant (another client) is
/// higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_master_is_set_to_the_quorum_token() {
    let set = RedlockMasters::start_behind_proxies(3);
    // The slow master's round trip (2 s) well within the call timeout, so
    // its grant comes late rather than not at all.
    let url = format!("{}?timeout=10s", set.url());
    let (a, b) = (client(&url).await, client(&url).await);
    ready(&set, &[&a, &b]).await;
    let slow = Duration::from_secs(1);
    set.proxy(2).latency(slow);
    let mut last = 0;
    for i in 0..3 {
        let (who, other) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let t = Instant::now();
        let g = who
            .locks()
            .unwrap()
            .try_acquire("late-token", Duration::from_secs(10))
            .await
            .unwrap()
            .unwrap();
        let took = t.elapsed();
        // Waiting for the slow master takes its round trip (2 s) at least.
        assert!(took < slow * 3 / 2, "waited for the slow master: {took:?}");
        let token = g.fencing_token().get();
        assert!(token > last, "{last} then {token}");
        last = token;
        // The late grant, then its correction, each a round trip to the
        // slow master; well within the claim's 10 s TTL.
        let stored = || -> Vec<Vec<u64>> {
            set.masters()
                .iter()
                .map(|m| {
                    live_claims(m, "late-token")
                        .iter()
                        .map(|c| stored_token(&c.1))
                        .collect()
                })
                .collect()
        };
        holds_within(Duration::from_secs(6), || async {
            stored().iter().all(|s| s == &[token])
        })
        .await;
        let stored = stored();
        assert!(
            stored.iter().all(|s| s == &[token]),
            "grant {token}, stored on the masters {stored:?}"
        );
        let info = other.locks().unwrap().inspect("late-token").await.unwrap();
        assert_eq!(info.holders.len(), 1);
        assert_eq!(info.holders[0].fencing_token.get(), token);
        g.release().await.unwrap();
        // The release returns once a quorum answered: the slow master's
        // comes later, and the next grant must find it free.
        until(
            "the slow master released",
            Duration::from_secs(6),
            || async { live_claims(&set.masters()[2], "late-token").is_empty() },
        )
        .await;
    }
    set.proxy(2).heal();
}

/// The holder is cut off from two of the three masters (their traffic
/// dropped for the call timeout) while it releases, then the network
/// heals. If `Guard::release` returns `Ok(())`, the lock must be free.
/// `quorum_release` must not count the one master that released as
/// success: the claim would stay on a majority for the rest of its TTL
/// (20 s here), and another client would time out. (On one Redis server a
/// release whose connection broke returns
/// `Err(Unavailable { .. "broken pipe" })`; counted that way, a
/// connection reset of two masters' connections just before the release
/// would give the same `Ok(())` with the claim left, in most runs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_that_reached_one_master_is_not_ok() {
    let set = RedlockMasters::start_behind_proxies(3);
    let url = format!("{}?timeout=500ms&connect_timeout=5s", set.url());
    let (a, b) = (client(&url).await, client(&url).await);
    ready(&set, &[&a, &b]).await;
    let g = a
        .locks()
        .unwrap()
        .try_acquire("blip", Duration::from_secs(20))
        .await
        .unwrap()
        .unwrap();
    // Cut off from two masters while it releases (the bytes are lost),
    // then the network heals.
    set.proxy(0).blackhole();
    set.proxy(1).blackhole();
    let released = g.release().await;
    eprintln!("release while cut off: {released:?}");
    set.proxy(0).heal();
    set.proxy(1).heal();
    let left: Vec<_> = set
        .masters()
        .iter()
        .map(|m| live_claims(m, "blip"))
        .collect();
    let t = Instant::now();
    let g2 = b
        .locks()
        .unwrap()
        .acquire("blip", Duration::from_secs(20), Duration::from_secs(2))
        .await;
    assert!(
        released.is_err() || g2.is_ok(),
        "release returned {released:?}, yet another client got {:?} after {:?}; claims left \
         on the masters: {left:?}",
        g2.map(|g| g.fencing_token()),
        t.elapsed()
    );
}

/// A retry by the owner gets its grant's token again when a master missed
/// the first attempt and granted it later with a token of its own (as
/// when a master of a just-connected client is out for the first attempt:
/// otherwise conformance_redlock's `lock_attempts_are_idempotent_per_owner`
/// gets a higher token on its retry). Here master 2 is frozen for the
/// first attempt: its call runs into the call timeout, and the script
/// queued on its socket grants the claim (a token of its own, later)
/// when it resumes. The retry, once the master is asked again, must
/// answer the quorum's token and set master 2 to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_master_missed_the_grant_gets_its_token_again() {
    let set = RedlockMasters::start(3);
    let url = format!("{}?timeout=300ms&connect_timeout=5s", set.url());
    let c = client(&url).await;
    ready(&set, &[&c]).await;
    let raw = c.raw_lock().unwrap();
    let me = coord_core::OwnerToken::random();
    let ttl = Duration::from_secs(20);
    let first = {
        let _frozen = Frozen::pause(&set.masters()[2]);
        let first = raw.try_acquire("missed", me.step(), ttl).await.unwrap();
        // The call to master 2 runs into its timeout meanwhile.
        sleep(Duration::from_millis(600)).await;
        first
    };
    let coord_core::Attempt::Granted(token) = first else {
        panic!("two masters of three granted a free lock: {first:?}");
    };
    let resumed = Instant::now();
    // Master 2 runs the queued attempt on resuming (a token of its own),
    // and is asked again once it is no longer skipped as slow (a second
    // after its timeout, before it resumed).
    until(
        "master 2 ran the queued attempt",
        Duration::from_secs(10),
        || async { !live_claims(&set.masters()[2], "missed").is_empty() },
    )
    .await;
    tokio::time::sleep_until(resumed + Duration::from_millis(1500)).await;
    let late = live_claims(&set.masters()[2], "missed");
    let again = raw.try_acquire("missed", me.step(), ttl).await.unwrap();
    assert_eq!(
        again,
        coord_core::Attempt::Granted(token),
        "a retry by the owner got another token (master 2 held {late:?} before it)"
    );
    // The retry returns once a quorum answered; master 2 is set to the
    // quorum's token beside it: well within the claim's 20 s TTL.
    let stored = || -> Vec<Vec<u64>> {
        set.masters()
            .iter()
            .map(|m| {
                live_claims(m, "missed")
                    .iter()
                    .map(|c| stored_token(&c.1))
                    .collect()
            })
            .collect()
    };
    holds_within(Duration::from_secs(5), || async {
        stored().iter().all(|s| s == &[token.get()])
    })
    .await;
    let stored = stored();
    assert!(
        stored.iter().all(|s| s == &[token.get()]),
        "grant {token:?}, stored on the masters {stored:?}"
    );
}

/// A stale release through another client reports false although a slow
/// master still holds the owner's released claim (otherwise
/// conformance_redlock's
/// `lock_same_owner_through_another_client_gets_no_other_token` fails
/// with "the first client's stale release reported success"). Client A
/// reaches the masters through proxies, client B directly. A releases
/// owner O; master 2, slowed for A (200 ms each way), is still out when
/// A's release answers (a quorum released; it lingers at most 50 ms). B
/// grants another owner on masters 0 and 1, then B's release of O finds O
/// on master 2 alone: the lock was no longer O's (a minority held it), so
/// the release must say false.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_release_finding_the_owner_on_a_minority_reports_false() {
    let set = RedlockMasters::start_behind_proxies(3);
    let direct = format!(
        "redlock://{}",
        set.masters()
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port()))
            .collect::<Vec<_>>()
            .join(",")
    );
    let (a, b) = (client(&set.url()).await, client(&direct).await);
    ready(&set, &[&a, &b]).await;
    let (ra, rb) = (a.raw_lock().unwrap(), b.raw_lock().unwrap());
    let (me, other) = (
        coord_core::OwnerToken::random(),
        coord_core::OwnerToken::random(),
    );
    let ttl = Duration::from_secs(20);
    let first = ra.try_acquire("stale", me.step(), ttl).await.unwrap();
    assert!(
        matches!(first, coord_core::Attempt::Granted(_)),
        "{first:?}"
    );
    sleep(Duration::from_millis(100)).await;
    set.proxy(2).latency(Duration::from_millis(200));
    assert!(ra.release("stale", me.step()).await.unwrap());
    let next = rb.try_acquire("stale", other.step(), ttl).await.unwrap();
    assert!(matches!(next, coord_core::Attempt::Granted(_)), "{next:?}");
    let on_2 = live_claims(&set.masters()[2], "stale");
    let stale = rb.release("stale", me.step()).await.unwrap();
    set.proxy(2).heal();
    assert!(
        !stale,
        "a stale release of an owner found on master 2 alone ({on_2:?}) reported success"
    );
    assert!(rb.release("stale", other.step()).await.unwrap());
}

/// A listing names what a quorum holds: a lock released on two masters of
/// three (its release returned once a quorum released; the third master's
/// release still on its way) is not listed, and one held on all three is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_held_on_fewer_masters_than_a_quorum_is_not_listed() {
    let set = RedlockMasters::start(3);
    let url = format!("{}?timeout=2s&connect_timeout=5s", set.url());
    let c = client(&url).await;
    ready(&set, &[&c]).await;
    let locks = c.locks().unwrap();
    let (gone, held) = ("listed-gone", "listed-held");
    let _g1 = locks
        .acquire(gone, Duration::from_secs(30), Duration::ZERO)
        .await
        .unwrap();
    let _g2 = locks
        .acquire(held, Duration::from_secs(30), Duration::ZERO)
        .await
        .unwrap();
    // An acquire returns once a quorum granted: wait until every master
    // holds both.
    until(
        "every master holds both locks",
        Duration::from_secs(10),
        || async {
            set.masters()
                .iter()
                .all(|m| live_claims(m, gone).len() == 1 && live_claims(m, held).len() == 1)
        },
    )
    .await;
    // Masters 0 and 1 no longer hold `gone`, as after a release that
    // returned once a quorum released.
    for m in &set.masters()[..2] {
        let claims = live_claims(m, gone);
        assert_eq!(claims.len(), 1, "{claims:?}");
        m.command(&["DEL", &claims[0].0]);
    }
    assert_eq!(live_claims(&set.masters()[2], gone).len(), 1);
    let names = c.list(Listed::Lock, "listed-", 100).await.unwrap();
    assert_eq!(names, [held], "only the name a quorum holds");
}

/// With one master of three down, a lock held on the other two is still
/// a lock: another owner's attempt is refused and its extend and release
/// answer false, every time, not "unavailable". The down master's error
/// comes back at once; the step must wait for the second running master
/// instead of deciding on that error and the first answer. And a release
/// that two masters answered "not held" does not wait out the call
/// timeout asking the down one again (the 20 rounds would outlast the
/// TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_master_down_another_owner_is_refused_not_told_unavailable() {
    let set = RedlockMasters::start(3);
    let url = format!("{}?timeout=2s&connect_timeout=5s", set.url());
    set.masters()[2].stop();
    let c = client(&url).await;
    let raw = c.raw_lock().unwrap();
    let (me, other) = (
        coord_core::OwnerToken::random(),
        coord_core::OwnerToken::random(),
    );
    let ttl = Duration::from_secs(20);
    let first = raw.try_acquire("down-one", me.step(), ttl).await.unwrap();
    assert!(
        matches!(first, coord_core::Attempt::Granted(_)),
        "{first:?}"
    );
    for round in 0..20 {
        let started = Instant::now();
        let theirs = raw.try_acquire("down-one", other.step(), ttl).await;
        assert!(
            matches!(theirs, Ok(coord_core::Attempt::Held { .. })),
            "round {round}: another owner's attempt got {theirs:?}"
        );
        let extended = raw.extend("down-one", other.step(), ttl).await;
        assert!(
            matches!(extended, Ok(false)),
            "round {round}: another owner's extend got {extended:?}"
        );
        let released = raw.release("down-one", other.step()).await;
        assert!(
            matches!(released, Ok(false)),
            "round {round}: another owner's release got {released:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "round {round} took {:?}, the call timeout: a step waited for the down master",
            started.elapsed()
        );
    }
    assert!(raw.release("down-one", me.step()).await.unwrap());
}

/// A retry by the owner whose first answers disagree on the token waits
/// for the master still out before it chooses. The owner holds token T
/// on every master; master 2 is then made to hold a later token of its
/// own for the same owner (as a late copy of an attempt leaves it), and
/// master 1, which holds T, answers 300 ms late. The first two answers
/// (masters 0 and 2: "held already", T and the later one) have no token
/// on a quorum; deciding on them would answer the later token. The retry
/// must wait for master 1 and answer T, and set master 2 back to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_whose_first_answers_disagree_waits_for_the_late_master() {
    let set = RedlockMasters::start_behind_proxies(3);
    let url = format!("{}?timeout=5s", set.url());
    let c = client(&url).await;
    ready(&set, &[&c]).await;
    let raw = c.raw_lock().unwrap();
    let me = coord_core::OwnerToken::random();
    let ttl = Duration::from_secs(20);
    let first = raw.try_acquire("disagree", me.step(), ttl).await.unwrap();
    let coord_core::Attempt::Granted(token) = first else {
        panic!("a free lock was refused: {first:?}");
    };
    until(
        "every master holds the grant's token",
        Duration::from_secs(5),
        || async {
            set.masters().iter().all(|m| {
                live_claims(m, "disagree")
                    .iter()
                    .any(|c| stored_token(&c.1) == token.get())
            })
        },
    )
    .await;
    // Master 2: the same owner, a later token of its own.
    let (key, value, _) = live_claims(&set.masters()[2], "disagree")
        .into_iter()
        .next()
        .expect("master 2 holds the claim");
    let later = token.get() + 1_000_000;
    let forged = value.replacen(&token.get().to_string(), &later.to_string(), 1);
    set.masters()[2].command(&["SET", &key, &forged, "KEEPTTL"]);
    set.proxy(1).latency(Duration::from_millis(300));
    let again = raw.try_acquire("disagree", me.step(), ttl).await.unwrap();
    set.proxy(1).heal();
    assert_eq!(
        again,
        coord_core::Attempt::Granted(token),
        "the retry chose before the master holding the grant's token answered"
    );
    until(
        "master 2 set back to the grant's token",
        Duration::from_secs(5),
        || async {
            live_claims(&set.masters()[2], "disagree")
                .iter()
                .all(|c| stored_token(&c.1) == token.get())
        },
    )
    .await;
    assert!(raw.release("disagree", me.step()).await.unwrap());
}
