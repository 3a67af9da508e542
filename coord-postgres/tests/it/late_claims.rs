//! Late copies of timed-out claim attempts (`coord_core::late`) on locks,
//! leases and elections: an attempt delayed in the network past the call
//! timeout, landing after its owner gave up and released, takes nothing;
//! the race of such a copy with the release that marks its owner is
//! decided by the row lock, whichever comes first; the owner's own later
//! attempts and other owners are not refused; answered attempts leave no
//! mark; a mark keeps its row from the sweep while it holds.
//!
//! The slow client goes through a `FaultProxy` (see `support`). The
//! cases run one after the other.

use crate::support;
use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance::facade_claim::{FacadeClaim, Held};
use conformance::testkit::postgres::cluster;
use conformance::testkit::proxy::FaultProxy;
use coord_core::{Attempt, Coord, Lock, OwnerToken};
use coord_postgres::PostgresBackend;
use coord_postgres::tokio_postgres::Client;
use support::{LATENCY, LONG, direct, raw, slow, unique, until_late_attempts_landed, wait_blocked};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The claim kinds the cases run on.
type Case = FacadeClaim;

/// Take `name` as `case` says with a long TTL, waiting up to `wait`.
async fn take(
    c: &Coord,
    case: Case,
    name: &str,
    wait: Duration,
) -> coord_core::Result<Option<Held>> {
    case.take(c, name, LONG, wait).await
}

fn kind(case: Case) -> &'static str {
    case.kind()
}

/// (owner set, marks) of the claim row of `kind`/`name`; None: no row.
async fn row(b: &PostgresBackend, kind: &str, name: &str) -> Option<(bool, i32)> {
    let c = b.pool().get().await.unwrap();
    let s = b.schema();
    c.query_opt(
        &format!(
            "SELECT owner IS NOT NULL, coalesce(cardinality(left_owners), 0) \
               FROM \"{s}\".claims WHERE kind = $1 AND name = $2"
        ),
        &[&kind, &name],
    )
    .await
    .unwrap()
    .map(|r| (r.get(0), r.get(1)))
}

/// The first attempt of a client behind a slow proxy is delayed past its
/// call timeout; the client gives up (its cleanup releases the owner, which
/// marks it); the holder releases; the late copy lands on the free claim.
/// The next attempt of another client must be granted.
async fn a_late_copy_takes_nothing(case: Case) {
    let _serial = SERIAL.lock().await;
    let schema = unique("late_claim");
    let proxy = FaultProxy::start(cluster().port());
    let direct_backend = direct(&schema).await;
    let here = direct_backend.coord();
    let far = slow(&schema, &proxy).await;
    let name = unique("late-claim");
    // Prepare the slow connection's statements: the late attempt is then
    // one message, sent at once.
    // (Its 200 ms call timeout can pass on a loaded machine before the
    // proxy's latency is even set: tried again, a few times.)
    let mut tries = 0;
    let warm = loop {
        tries += 1;
        match take(&far.coord(), case, &unique("warm"), Duration::ZERO).await {
            Ok(g) => break g.expect("the slow client takes a free name"),
            Err(e) if e.is_retryable() && tries < 10 => continue,
            Err(e) => panic!("warming the slow client up ({tries} tries): {e}"),
        }
    };
    warm.release().await;
    let held = take(&here, case, &name, Duration::ZERO)
        .await
        .unwrap()
        .expect("the holder takes the free claim");

    proxy.latency(LATENCY);
    let started = Instant::now();
    let waiter = tokio::spawn({
        let (c, name) = (far.coord(), name.clone());
        async move {
            take(&c, case, &name, Duration::from_millis(600))
                .await
                .is_ok_and(|h| h.is_some())
        }
    });
    // Healed before the first attempt times out, so the cleanup after it
    // (a lease's revoke, at once) is not delayed too.
    tokio::time::sleep(Duration::from_millis(50)).await;
    proxy.latency(Duration::ZERO);
    assert!(
        !waiter.await.unwrap(),
        "{case:?}: the slow client got the held claim"
    );
    // Its cleanup (in the background) has marked the owner by now.
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.release().await;
    until_late_attempts_landed(started).await;
    let late = row(&direct_backend, kind(case), &name).await;
    let next = take(&here, case, &name, Duration::ZERO).await.unwrap();
    assert!(
        next.is_some(),
        "{case:?}: the claim is free and nobody waits, yet it is refused: the \
         timed-out attempt's late copy took it (row after it landed: {late:?})"
    );
    assert_eq!(
        late,
        Some((false, 1)),
        "{case:?}: (owner set, marks) once the late copy landed"
    );
    next.unwrap().release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_lock_attempt_after_a_timed_out_acquire_takes_no_lock() {
    a_late_copy_takes_nothing(Case::Lock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_timed_out_lease_grant_takes_no_lease() {
    a_late_copy_takes_nothing(Case::Lease).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_timed_out_campaign_elects_nobody() {
    a_late_copy_takes_nothing(Case::Election).await;
}

/// `claim_leave` run by hand on `c`: the release of `owner` on lock
/// `name`, marking it as left at `stamp` for 30 s. (held, woke).
async fn leave(
    c: &Client,
    schema: &str,
    name: &str,
    owner: &OwnerToken,
    stamp: i64,
) -> (bool, bool) {
    let owner: &[u8] = owner.as_bytes();
    let r = c
        .query_one(
            &format!(
                "SELECT held, woke FROM \"{schema}\".claim_leave('lock', $1::text, $2::bytea, \
                 'coord', false, $3::int8, 30000000::int8)"
            ),
            &[&name, &owner, &stamp],
        )
        .await
        .expect("claim_leave");
    (r.get(0), r.get(1))
}

/// `claim_acquire` run by hand: an attempt of `owner` on lock `name`
/// stamped `stamp` (None: a client of layout 11 or before). The token, if
/// granted.
async fn attempt(
    c: &Client,
    schema: &str,
    name: &str,
    owner: &OwnerToken,
    stamp: Option<i64>,
) -> Option<i64> {
    let owner: &[u8] = owner.as_bytes();
    let s = format!("\"{schema}\"");
    let r = match stamp {
        Some(at) => c
            .query_one(
                &format!(
                    "SELECT granted FROM {s}.claim_acquire('lock', $1::text, $2::bytea, NULL, \
                     30000000::int8, 'coord', false, false, NULL::bytea, $3::int8)"
                ),
                &[&name, &owner, &at],
            )
            .await
            .expect("claim_acquire"),
        None => c
            .query_one(
                &format!(
                    "SELECT granted FROM {s}.claim_acquire('lock', $1::text, $2::bytea, NULL, \
                     30000000::int8, 'coord', false, false, NULL::bytea, NULL::int8)"
                ),
                &[&name, &owner],
            )
            .await
            .expect("claim_acquire, layout-11 signature"),
    };
    r.get(0)
}

/// One answered grant and release of `name` by a new owner; panics if
/// the grant is refused.
async fn cycle(b: &PostgresBackend, name: &str) {
    let o = OwnerToken::random();
    assert!(matches!(
        Lock::try_acquire(b, name, &o, LONG).await.unwrap(),
        Attempt::Granted(_)
    ));
    assert!(Lock::release(b, name, &o).await.unwrap());
}

/// A stamp 10 s after now: every attempt the test's client sends in the
/// next seconds is stamped before it.
fn future_stamp() -> i64 {
    coord_core::late::stamp() + 10_000_000
}

/// The release that marks an owner holds the row lock (its transaction
/// is kept open) while that owner's late attempt arrives: the attempt
/// waits, then re-reads the row with the mark and takes nothing, on a
/// name whose row exists (the common statement's in-place update) and on
/// a name with no row (the release inserts one; the attempt's insert waits
/// for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_attempt_waiting_for_the_marking_release_takes_nothing() {
    let _serial = SERIAL.lock().await;
    let schema = unique("late_race");
    let b: Arc<PostgresBackend> = direct(&schema).await;
    for fresh in [false, true] {
        let name = unique("race");
        if !fresh {
            // The name's row exists and is free.
            cycle(&b, &name).await;
        }
        let owner = OwnerToken::random();
        let tx = raw().await;
        tx.batch_execute("BEGIN").await.unwrap();
        assert_eq!(
            leave(&tx, &schema, &name, &owner, future_stamp()).await,
            (false, false)
        );
        let late = tokio::spawn({
            let (b, name) = (b.clone(), name.clone());
            async move { Lock::try_acquire(&*b, &name, &owner, LONG).await }
        });
        wait_blocked(&schema, 1).await;
        tx.batch_execute("COMMIT").await.unwrap();
        let got = late.await.unwrap().unwrap();
        assert!(
            matches!(got, Attempt::Held { .. }),
            "fresh name {fresh}: the late attempt that waited for the marking release got {got:?}"
        );
        assert_eq!(
            row(&b, "lock", &name).await,
            Some((false, 1)),
            "fresh {fresh}"
        );
        // Another owner is not refused.
        cycle(&b, &name).await;
    }
}

/// The other order: the late attempt's grant holds the row lock (its
/// transaction is kept open) when the release that marks its owner
/// arrives. The release waits, then frees the grant (and marks the owner).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_waiting_for_the_late_grant_frees_it() {
    let _serial = SERIAL.lock().await;
    let schema = unique("late_race2");
    let b = direct(&schema).await;
    for fresh in [false, true] {
        let name = unique("race2");
        if !fresh {
            cycle(&b, &name).await;
        }
        let owner = OwnerToken::random();
        let tx = raw().await;
        tx.batch_execute("BEGIN").await.unwrap();
        assert!(
            attempt(&tx, &schema, &name, &owner, Some(1))
                .await
                .is_some()
        );
        let marker = raw().await;
        let release = tokio::spawn({
            let (schema, name) = (schema.clone(), name.clone());
            async move { leave(&marker, &schema, &name, &owner, future_stamp()).await }
        });
        wait_blocked(&schema, 1).await;
        tx.batch_execute("COMMIT").await.unwrap();
        assert_eq!(
            release.await.unwrap(),
            (true, false),
            "fresh name {fresh}: the release freed the live grant it waited for"
        );
        assert_eq!(
            row(&b, "lock", &name).await,
            Some((false, 1)),
            "fresh {fresh}"
        );
        cycle(&b, &name).await;
    }
}

/// A mark refuses only its owner's attempts stamped before it: later ones,
/// other owners' and unstamped ones (older clients) are granted; answered
/// attempts leave no mark; one owner leaving twice keeps one mark, at its
/// higher stamp; a lapsed mark is pruned by the next leave and no longer
/// refuses; while a mark holds the sweep keeps its row, and deletes it
/// once the mark and the grace are over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marks_refuse_only_earlier_attempts_of_their_owner_and_lapse() {
    let _serial = SERIAL.lock().await;
    let schema = unique("late_marks");
    let b = coord_postgres::builder(&cluster().url())
        .schema(&schema)
        .sweep_every(None)
        .idle_grace(Duration::ZERO)
        .connect_backend()
        .await
        .unwrap();
    let c = raw().await;
    let name = unique("marks");
    // Answered cycles leave no mark (nor a kept row, beyond the free one).
    for _ in 0..3 {
        cycle(&b, &name).await;
    }
    assert_eq!(row(&b, "lock", &name).await, Some((false, 0)));

    let (gone, other) = (OwnerToken::random(), OwnerToken::random());
    let s1 = coord_core::late::stamp();
    assert_eq!(leave(&c, &schema, &name, &gone, s1).await, (false, false));
    assert_eq!(attempt(&c, &schema, &name, &gone, Some(s1 - 1)).await, None);
    // The same stamp is not before the mark.
    let t = attempt(&c, &schema, &name, &gone, Some(s1)).await;
    assert!(t.is_some(), "an attempt stamped at the mark was refused");
    assert_eq!(
        leave(&c, &schema, &name, &gone, s1 + 5).await,
        (true, false)
    );
    assert_eq!(
        row(&b, "lock", &name).await,
        Some((false, 1)),
        "one mark per owner"
    );
    assert_eq!(attempt(&c, &schema, &name, &gone, Some(s1 + 4)).await, None);
    // Other owners, unstamped attempts, and the owner later on: granted.
    for (o, at) in [(&other, Some(s1 - 1)), (&gone, None), (&gone, Some(s1 + 6))] {
        assert!(
            attempt(&c, &schema, &name, o, at).await.is_some(),
            "refused: same owner {}, stamp {at:?}",
            o == &gone
        );
        let o: &[u8] = o.as_bytes();
        c.execute(
            &format!("UPDATE \"{schema}\".claims SET owner = NULL WHERE name = $1 AND owner = $2"),
            &[&name, &o],
        )
        .await
        .unwrap();
    }
    // Through the backend, the owner is served again (its stamps are later).
    assert!(matches!(
        Lock::try_acquire(&*b, &name, &gone, LONG).await.unwrap(),
        Attempt::Granted(_)
    ));
    assert!(Lock::release(&*b, &name, &gone).await.unwrap());

    // The sweep keeps the row while the mark holds (its grant long over)...
    c.execute(
        &format!(
            "UPDATE \"{schema}\".claims SET expires_at = now() - interval '1 day' WHERE name = $1"
        ),
        &[&name],
    )
    .await
    .unwrap();
    b.sweep().await.unwrap();
    assert_eq!(
        row(&b, "lock", &name).await,
        Some((false, 1)),
        "swept while marked"
    );
    // ...and a lapsed mark no longer refuses, is pruned by the next leave,
    // and no longer keeps the row.
    c.execute(
        &format!(
            "UPDATE \"{schema}\".claims SET left_until = ARRAY[now() - interval '1 s'] WHERE name = $1"
        ),
        &[&name],
    )
    .await
    .unwrap();
    assert!(
        attempt(&c, &schema, &name, &gone, Some(s1 - 1))
            .await
            .is_some()
    );
    assert_eq!(
        leave(&c, &schema, &name, &gone, s1 + 100).await,
        (true, false)
    );
    let third = OwnerToken::random();
    assert_eq!(
        leave(&c, &schema, &name, &third, s1 + 100).await,
        (false, false)
    );
    assert_eq!(row(&b, "lock", &name).await, Some((false, 2)));
    c.execute(
        &format!(
            "UPDATE \"{schema}\".claims SET left_until = ARRAY[now() - interval '1 day', now() - interval '1 day'], \
                    expires_at = now() - interval '1 day' WHERE name = $1"
        ),
        &[&name],
    )
    .await
    .unwrap();
    assert!(b.sweep().await.unwrap() >= 1);
    assert_eq!(
        row(&b, "lock", &name).await,
        None,
        "a row with lapsed marks outlived the sweep"
    );
}

/// The real cleanup path: an attempt given up on mid-call (dropped after
/// its first poll) makes the owner's release a marking one; answered ones
/// do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_release_after_an_unanswered_attempt_marks() {
    let _serial = SERIAL.lock().await;
    let schema = unique("late_cleanup");
    let b = direct(&schema).await;
    let name = unique("cleanup");
    let holder = OwnerToken::random();
    assert!(matches!(
        Lock::try_acquire(&*b, &name, &holder, LONG).await.unwrap(),
        Attempt::Granted(_)
    ));
    let o = OwnerToken::random();
    assert!(matches!(
        Lock::try_acquire(&*b, &name, &o, LONG).await.unwrap(),
        Attempt::Held { .. }
    ));
    assert!(!Lock::release(&*b, &name, &o).await.unwrap());
    assert_eq!(
        row(&b, "lock", &name).await,
        Some((true, 0)),
        "an answered attempt marked"
    );

    // An attempt dropped after its first poll, before its reply. On a
    // loaded machine the reply can already be in by the end of that poll
    // (the connection runs on another worker thread): then the attempt
    // was answered, and it is made again by another owner.
    let mut tries = 0;
    let o = loop {
        tries += 1;
        let o = OwnerToken::random();
        let mut gave_up = Box::pin(Lock::try_acquire(&*b, &name, &o, LONG));
        let first = futures::poll!(gave_up.as_mut());
        drop(gave_up);
        if first.is_pending() {
            break o;
        }
        assert!(
            tries < 20,
            "every attempt was answered within its first poll"
        );
        // Answered: nothing of this owner is unanswered, so its release
        // marks nothing.
        assert!(!Lock::release(&*b, &name, &o).await.unwrap());
    };
    assert_eq!(
        row(&b, "lock", &name).await,
        Some((true, 0)),
        "an answered attempt marked"
    );
    assert!(!Lock::release(&*b, &name, &o).await.unwrap());
    assert_eq!(
        row(&b, "lock", &name).await,
        Some((true, 1)),
        "the release marked the owner"
    );
    // Forgotten once marked: a later release of the owner marks no more
    // (the mark stays, one per owner).
    assert!(!Lock::release(&*b, &name, &o).await.unwrap());
    assert!(Lock::release(&*b, &name, &holder).await.unwrap());
    assert_eq!(row(&b, "lock", &name).await, Some((false, 1)));
    let t = Lock::try_acquire(&*b, &name, &o, LONG).await.unwrap();
    assert!(
        matches!(t, Attempt::Granted(_)),
        "the owner's own later attempt: {t:?}"
    );
}

/// See `conformance::late_copy::late_copy_after_extend`.
async fn late_copy_after_extend(kind: conformance::claim_kind::ClaimKind) {
    let _serial = SERIAL.lock().await;
    let schema = unique("late_extend");
    let proxy = FaultProxy::start(cluster().port());
    let here = direct(&schema).await;
    let far = slow(&schema, &proxy).await;
    conformance::late_copy::late_copy_after_extend(
        kind,
        &*far,
        &*here,
        &proxy,
        &unique("late-extend"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_late_copy_of_a_holders_first_attempt_never_shortens_its_extend() {
    late_copy_after_extend(conformance::claim_kind::ClaimKind::Lock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_late_copy_of_a_holders_first_attempt_never_shortens_its_extend() {
    late_copy_after_extend(conformance::claim_kind::ClaimKind::Semaphore).await;
}

/// See `conformance::late_copy::late_copy_of_an_extend_after_a_later_one`.
async fn late_extend_after_a_later_one(kind: conformance::claim_kind::ClaimKind) {
    let _serial = SERIAL.lock().await;
    let schema = unique("late_extend2");
    let proxy = FaultProxy::start(cluster().port());
    let here = direct(&schema).await;
    let far = slow(&schema, &proxy).await;
    conformance::late_copy::late_copy_of_an_extend_after_a_later_one(
        kind,
        &*far,
        &*here,
        &proxy,
        &unique("late-extend2"),
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_late_copy_of_an_extend_never_undoes_a_later_one() {
    late_extend_after_a_later_one(conformance::claim_kind::ClaimKind::Lock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_late_copy_of_an_extend_never_undoes_a_later_one() {
    late_extend_after_a_later_one(conformance::claim_kind::ClaimKind::Semaphore).await;
}
