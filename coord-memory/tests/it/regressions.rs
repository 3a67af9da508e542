//! Edge cases of the store-independent logic (coord-core): guards and
//! watchdogs, waits and their cancellation, barriers, limiters, the sweep
//! of idle names, run on the in-memory backend with paused time.

use std::sync::Arc;
use std::time::Duration;

use coord_core::{Algorithm, Coord, Error, LockOptions, OwnerToken, Quota};
use coord_memory::MemoryBackend;
use support::faulty::{Fault, Faulty};

use crate::support;
const S: Duration = Duration::from_secs(1);

/// `acquire_all` never returns a lock that lapsed while a later one was
/// awaited: the locks taken first are kept alive meanwhile.
#[tokio::test(start_paused = true)]
async fn acquire_all_keeps_earlier_locks_alive_while_waiting() {
    let coord = MemoryBackend::coord();
    let locks = coord.locks().unwrap();
    let holder_b = locks.acquire("b", 3 * S, Duration::ZERO).await.unwrap();
    let l2 = locks.clone();
    let x = tokio::spawn(async move {
        l2.acquire_all(["a", "b"], LockOptions::new(S).wait(10 * S))
            .await
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        locks.try_acquire("a", 10 * S).await.unwrap().is_none(),
        "`a` lapsed while acquire_all waited for `b`"
    );
    let multi = x.await.unwrap().expect("acquire_all gets both");
    assert!(multi.guards().iter().all(|g| g.is_valid()));
    // Without opts.watchdog the guards do not keep renewing afterwards.
    assert!(multi.guards().iter().all(|g| !g.has_watchdog()));
    drop(holder_b);
    multi.release().await.unwrap();
}

/// A voluntary release is not a loss: `lost()` never completes after it.
#[tokio::test(start_paused = true)]
async fn lost_does_not_fire_after_a_voluntary_release() {
    let coord = MemoryBackend::coord();
    let locks = coord.locks().unwrap();
    let g = locks.acquire("l", 10 * S, Duration::ZERO).await.unwrap();
    let lost = g.lost();
    let token = g.lost_token();
    g.release().await.unwrap();
    assert!(tokio::time::timeout(60 * S, lost).await.is_err());
    assert!(!token.is_cancelled());
}

/// `Duration::MAX` means "wait for ever", never a panic.
#[tokio::test]
async fn max_waits_do_not_overflow() {
    let coord = MemoryBackend::coord();
    let g = coord
        .locks()
        .unwrap()
        .acquire("m", 10 * S, Duration::MAX)
        .await
        .unwrap();
    g.release().await.unwrap();
    let all = coord
        .locks()
        .unwrap()
        .acquire_all(["m1", "m2"], LockOptions::new(10 * S).wait(Duration::MAX))
        .await
        .unwrap();
    all.release().await.unwrap();
    coord
        .barriers()
        .unwrap()
        .wait("b", 1, "p", Duration::MAX)
        .await
        .unwrap();
    coord
        .limiter()
        .unwrap()
        .wait("k", Quota::per(1, S), 1, Duration::MAX)
        .await
        .unwrap();
    let l = coord
        .elections()
        .unwrap()
        .campaign("e", "me", 10 * S, Duration::MAX)
        .await
        .unwrap();
    l.resign().await.unwrap();
}

/// A key whose GCRA limit shrinks is not locked out for hours.
#[tokio::test(start_paused = true)]
async fn a_changed_quota_does_not_lock_a_key_out() {
    let coord = MemoryBackend::coord();
    let lim = coord.limiter().unwrap();
    tokio::time::advance(100 * S).await;
    assert!(
        lim.check("k", Quota::new(1000, S, Algorithm::Gcra))
            .await
            .unwrap()
            .allowed
    );
    tokio::time::advance(10 * S).await;
    let d = lim
        .check("k", Quota::new(10, S, Algorithm::Gcra))
        .await
        .unwrap();
    assert!(d.allowed, "denied after 10 s idle: {d:?}");
}

/// A watchdog started late, while the lock is still valid, keeps it.
#[tokio::test(start_paused = true)]
async fn a_watchdog_started_late_keeps_the_lock() {
    let coord = MemoryBackend::coord();
    let locks = coord.locks().unwrap();
    let mut g = locks.acquire("w", 3 * S, Duration::ZERO).await.unwrap();
    tokio::time::advance(Duration::from_millis(2500)).await;
    assert!(g.is_valid());
    g.keep_alive();
    tokio::time::sleep(2 * S).await;
    assert!(g.is_valid(), "the late watchdog let the lock lapse");
    g.release().await.unwrap();
}

/// A wait dropped while its arrival is being recorded leaves no ghost.
#[tokio::test(start_paused = true)]
async fn a_wait_cancelled_during_arrive_leaves_no_ghost() {
    let f = Faulty::new();
    f.always("barrier.arrive", Fault::SlowReply(S));
    let b = f.coord(S).barriers().unwrap();
    let _ = tokio::time::timeout(Duration::from_millis(100), b.wait("g", 2, "ghost", 10 * S)).await;
    f.heal();
    tokio::time::sleep(2 * S).await;
    let r = b.wait("g", 2, "real", Duration::from_millis(500)).await;
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "the cancelled participant still counted: {r:?}"
    );
}

/// A wait dropped while its timeout-withdraw is in flight leaves no ghost.
#[tokio::test(start_paused = true)]
async fn a_wait_cancelled_during_withdraw_leaves_no_ghost() {
    let f = Faulty::new();
    f.always("barrier.withdraw", Fault::Delay(Duration::from_millis(100)));
    let b = f.coord(S).barriers().unwrap();
    let _ = tokio::time::timeout(Duration::from_millis(1050), b.wait("g", 2, "quitter", S)).await;
    f.heal();
    tokio::time::sleep(S).await;
    let r = b.wait("g", 2, "second", Duration::from_millis(500)).await;
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "the quitter still counted: {r:?}"
    );
}

/// `with_lock` never throws away the work's result when the release fails
/// after the work finished: the caller gets the output and the error.
#[tokio::test]
async fn with_lock_keeps_the_output_when_release_fails() {
    // The release fails as if the store were unreachable after the work
    // under the lock committed.
    let f = Faulty::new();
    f.always("lock.release", Fault::Unavailable);
    let r = f
        .coord(S)
        .locks()
        .unwrap()
        .with_lock("committed", LockOptions::new(10 * S), |_| async { 42 })
        .await;
    match r {
        Err(coord_core::WithLockError::Release { output, error }) => {
            assert_eq!(output, 42);
            assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
        }
        other => panic!("expected the output with the release error, got {other:?}"),
    }
}

/// The completing arrival's reply is lost and the core retries it: the
/// wait passes in the generation it completed and leaves no phantom member
/// in the next one (the retry carries the same arrival id).
#[tokio::test]
async fn a_retried_completing_arrival_passes_and_leaves_no_phantom() {
    let f = Faulty::new();
    let b = f.coord(S).barriers().unwrap();
    let b2 = b.clone();
    let first = tokio::spawn(async move { b2.wait("phase", 2, "p1", 10 * S).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The next arrival is recorded, then its reply is lost.
    f.next("barrier.arrive", Fault::LoseReply, 1);
    let g = b.wait("phase", 2, "p2", 10 * S).await.unwrap();
    assert_eq!(first.await.unwrap().unwrap(), g);
    // Generation g+1 is empty: a lone arrival does not complete it.
    let next = coord_core::Barrier::arrive(&*f.inner, "phase", 2, "p3", &OwnerToken::random())
        .await
        .unwrap();
    assert!(
        !next.complete && next.generation > g,
        "the retried arrival joined the next generation: {next:?}"
    );
}

/// The state of idle names is swept as new names come in (a user locking
/// per entity must not grow the store forever), and a live claim survives
/// every sweep. Idle entries are made with the raw API (1 ms claims that
/// are never released, as crashed holders leave them).
#[tokio::test]
async fn idle_names_are_swept_and_live_ones_survive() {
    let backend = Arc::new(MemoryBackend::new());
    let coord = Coord::from_backend(backend.clone());
    let locks = coord.locks().unwrap();
    let keep = locks
        .acquire("keep", 3600 * S, Duration::ZERO)
        .await
        .unwrap();
    let lease = coord
        .leases()
        .unwrap()
        .grant("keep-lease", 3600 * S)
        .await
        .unwrap()
        .unwrap();
    let elections = coord.elections().unwrap();
    let leader = elections
        .try_campaign("keep-election", "me", 3600 * S)
        .await
        .unwrap()
        .unwrap();
    let raw_lock = coord.raw_lock().unwrap();
    let raw_election = coord.raw_election().unwrap();
    let limiter = coord.limiter().unwrap();
    let quota = Quota::new(5, Duration::from_millis(1), Algorithm::FixedWindow);
    let ms = Duration::from_millis(1);
    let mut inserted = 3;
    for round in 0..3 {
        // 60,000 names per map in all: past one sweep interval in every
        // shard (32 x 1,024).
        for i in 0..20_000 {
            let owner = OwnerToken::random();
            raw_lock
                .try_acquire(&format!("order:{round}:{i}"), owner.step(), ms)
                .await
                .unwrap();
            raw_election
                .try_campaign(&format!("shard:{round}:{i}"), "me", owner.step(), ms)
                .await
                .unwrap();
            limiter
                .check(&format!("key:{round}:{i}"), quota)
                .await
                .unwrap();
            inserted += 3;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let n = backend.stored_entries();
    eprintln!("{n} entries kept after {inserted} inserts");
    // At most about one sweep interval per shard and map is kept (without
    // sweeps it would be every one of them).
    assert!(n < 120_000, "{n} entries kept after {inserted} inserts");
    // The live claims outlived every sweep.
    keep.extend(3600 * S)
        .await
        .expect("the held lock was swept");
    lease
        .renew(3600 * S)
        .await
        .expect("the live lease was swept");
    leader
        .renew(3600 * S)
        .await
        .expect("the live leadership was swept");
    let info = elections.leader("keep-election").await.unwrap();
    assert_eq!(
        info.map(|i| i.term),
        Some(leader.term()),
        "the live leader was swept"
    );
    assert!(locks.try_acquire("keep", S).await.unwrap().is_none());
}

/// A leadership ends exactly at its TTL (paused time makes "exactly"
/// observable): at that instant another candidate wins, the old leader can
/// neither renew nor resign, and `leader()` reports the new one.
#[tokio::test(start_paused = true)]
async fn a_leadership_ends_exactly_at_its_ttl() {
    let backend = Arc::new(MemoryBackend::new());
    let raw: Arc<dyn coord_core::Election> = backend.clone();
    let (old, new) = (OwnerToken::random(), OwnerToken::random());
    let first = raw.try_campaign("e", "old", old.step(), S).await.unwrap();
    tokio::time::advance(S).await;
    assert_eq!(
        raw.leader("e").await.unwrap(),
        None,
        "reported at its expiry"
    );
    assert!(
        !raw.renew("e", old.step(), S).await.unwrap(),
        "renewed at its expiry"
    );
    assert!(
        !raw.resign("e", old.step()).await.unwrap(),
        "resigned at its expiry"
    );
    // The old owner's retry at its expiry is a new term, not a renewal.
    let again = raw.try_campaign("e", "old", old.step(), S).await.unwrap();
    assert_ne!(again, first, "an expired leadership was resumed");
    tokio::time::advance(S).await;
    let won = raw.try_campaign("e", "new", new.step(), S).await.unwrap();
    assert!(matches!(won, coord_core::Attempt::Granted(_)), "{won:?}");
}

/// `stored_entries` counts one entry per live name of every kind.
#[tokio::test]
async fn stored_entries_counts_every_kind() {
    let backend = Arc::new(MemoryBackend::new());
    let coord = Coord::from_backend(backend.clone());
    assert_eq!(backend.stored_entries(), 0);
    let _l = coord
        .locks()
        .unwrap()
        .acquire("a", 60 * S, Duration::ZERO)
        .await
        .unwrap();
    let _s = coord
        .leases()
        .unwrap()
        .grant("b", 60 * S)
        .await
        .unwrap()
        .unwrap();
    let _e = coord
        .elections()
        .unwrap()
        .try_campaign("c", "x", 60 * S)
        .await
        .unwrap();
    let quota = Quota::new(5, 60 * S, Algorithm::Gcra);
    coord.limiter().unwrap().check("d", quota).await.unwrap();
    coord.limiter().unwrap().check("e", quota).await.unwrap();
    let barriers = coord.barriers().unwrap();
    let waiting = tokio::spawn(async move { barriers.wait("f", 2, "p", 60 * S).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(backend.stored_entries(), 6);
    waiting.abort();
}

/// A barrier with a participant waiting survives the sweeps that many
/// other (completed, idle) barriers trigger: its arrival is not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_barrier_survives_the_sweep() {
    let backend = Arc::new(MemoryBackend::new());
    let coord = Coord::from_backend(backend.clone());
    let barriers = coord.barriers().unwrap();
    let b2 = barriers.clone();
    let first = tokio::spawn(async move { b2.wait("keep", 2, "p1", 60 * S).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let raw = coord.raw_barrier().unwrap();
    for i in 0..40_000 {
        raw.arrive(&format!("done:{i}"), 1, "solo", &OwnerToken::random())
            .await
            .unwrap();
    }
    assert!(!first.is_finished(), "the waiter passed alone");
    let g = barriers.wait("keep", 2, "p2", 10 * S).await.unwrap();
    assert_eq!(first.await.unwrap().unwrap(), g);
}

/// A listing of semaphores that the store answered with fewer names than
/// asked for is complete: `Coord::list` asks again only while coord's own
/// semaphores (read-write locks) may have taken the user's places.
#[tokio::test]
async fn list_names_asks_once_when_the_store_has_no_more() {
    use coord_core::{Listed, Lister};
    use std::sync::atomic::{AtomicUsize, Ordering};
    struct Counting(Arc<MemoryBackend>, AtomicUsize);
    #[coord_core::async_trait]
    impl Lister for Counting {
        async fn names(
            &self,
            kind: Listed,
            prefix: &str,
            limit: usize,
        ) -> coord_core::Result<Vec<String>> {
            self.1.fetch_add(1, Ordering::SeqCst);
            self.0.names(kind, prefix, limit).await
        }
    }
    let backend = Arc::new(MemoryBackend::new());
    let counting = Arc::new(Counting(backend.clone(), AtomicUsize::new(0)));
    let coord = Coord::from_backend(backend.clone())
        .with_semaphores(backend)
        .with_lister(counting.clone());
    let (sems, rw) = (coord.semaphores().unwrap(), coord.rw_locks().unwrap());
    let mut held = Vec::new();
    let mut readers = Vec::new();
    for i in 0..3 {
        held.push(sems.try_acquire(&format!("s{i}"), 2, 60 * S).await.unwrap());
        readers.push(
            rw.read(&format!("r{i}"), 60 * S, Duration::ZERO)
                .await
                .unwrap(),
        );
    }
    let got = coord.list(Listed::Semaphore, "", 10).await.unwrap();
    assert_eq!(got, ["s0", "s1", "s2"]);
    assert_eq!(
        counting.1.load(Ordering::SeqCst),
        1,
        "the store gave 6 names of the 10 asked for, yet was asked again"
    );
}

/// `Coord::list(Listed::Semaphore, "", n)` gives up to `n` semaphores:
/// read-write locks (semaphores underneath, under a name starting with a
/// control character) must not take the places of semaphores. With 10
/// of each held, a limit of 10 must list the 10 semaphores.
#[tokio::test]
async fn list_names_semaphores_are_not_crowded_out_by_rwlocks() {
    use coord_core::Listed;
    let coord = MemoryBackend::coord();
    let sems = coord.semaphores().unwrap();
    let rw = coord.rw_locks().unwrap();
    let mut permits = Vec::new();
    let mut readers = Vec::new();
    for i in 0..10 {
        permits.push(
            sems.try_acquire(&format!("s{i}"), 2, 60 * S)
                .await
                .unwrap()
                .expect("free permit"),
        );
        readers.push(
            rw.read(&format!("r{i}"), 60 * S, Duration::ZERO)
                .await
                .unwrap(),
        );
    }
    let want: Vec<String> = (0..10).map(|i| format!("s{i}")).collect();
    let got = coord.list(Listed::Semaphore, "", 10).await.unwrap();
    assert_eq!(got, want, "semaphores under \"\" with a limit of 10");
    let one = coord.list(Listed::Semaphore, "", 1).await.unwrap();
    assert_eq!(
        one.len(),
        1,
        "a limit of 1 with semaphores held gave {one:?}"
    );
    let rws = coord.list(Listed::RwLock, "", 10).await.unwrap();
    assert_eq!(rws.len(), 10);
}
