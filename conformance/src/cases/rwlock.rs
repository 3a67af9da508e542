//! Read-write lock cases: many readers or one writer, writer-preferring,
//! lease-bounded and fenced (built in coord-core on the store's FIFO
//! semaphores).
//!
//! A store whose semaphores are missing or not FIFO (yet) skips every case
//! here with the reason [`RWLOCK_GATE`], on `stderr`, never a silent pass.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use coord_core::{Coord, Error, RwLocks, RwMode};
use tokio::time::{Instant, sleep};

use crate::testkit::wait::until;
use crate::{Factory, WOKEN, ttl, unique, wake_poll};

const LONG: Duration = Duration::from_secs(30);

/// Why every read-write lock case skips on a store without FIFO semaphores.
pub const RWLOCK_GATE: &str = "the store does not offer read-write locks (its error says why)";

fn rw(c: &Coord) -> Option<RwLocks> {
    match c.rw_locks() {
        Ok(r) => Some(r),
        Err(e @ Error::Unsupported { .. }) => {
            eprintln!("skipped: {RWLOCK_GATE}: {e}");
            None
        }
        Err(e) => panic!("rw_locks(): expected a handle or Unsupported, got {e:?}"),
    }
}

/// 8 clients x 25 rounds, each a read or a write by turns: a writer is
/// always alone, readers do overlap (it is not a mutex), every grant is
/// counted.
pub async fn rwlock_writer_excludes_readers_and_writers_under_load(f: &Factory) {
    const CLIENTS: u32 = 8;
    const ROUNDS: u32 = 25;
    let Some(_) = rw(&f.client().await) else {
        return;
    };
    let name = unique("rw-load");
    let readers = Arc::new(AtomicU32::new(0));
    let writing = Arc::new(AtomicBool::new(false));
    let most_readers = Arc::new(AtomicU32::new(0));
    // Every client connects first, so that they all contend at once.
    let mut rws = Vec::new();
    for _ in 0..CLIENTS {
        rws.push(f.client().await.rw_locks().unwrap());
    }
    let mut tasks = Vec::new();
    for (i, rw) in (0..CLIENTS).zip(rws) {
        let (name, readers, writing, most) = (
            name.clone(),
            readers.clone(),
            writing.clone(),
            most_readers.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                // One write in four.
                if (i + round) % 4 == 0 {
                    let w = rw
                        .write(&name, LONG, Duration::from_secs(120))
                        .await
                        .expect("write under load");
                    assert!(!writing.swap(true, Ordering::SeqCst), "two writers at once");
                    assert_eq!(readers.load(Ordering::SeqCst), 0, "a writer beside readers");
                    sleep(Duration::from_millis(2)).await;
                    assert_eq!(
                        readers.load(Ordering::SeqCst),
                        0,
                        "a reader got in beside a writer"
                    );
                    writing.store(false, Ordering::SeqCst);
                    w.release().await.unwrap();
                } else {
                    let r = rw
                        .read(&name, LONG, Duration::from_secs(120))
                        .await
                        .expect("read under load");
                    let n = readers.fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(!writing.load(Ordering::SeqCst), "a reader beside a writer");
                    most.fetch_max(n, Ordering::SeqCst);
                    // Until two readers have overlapped, a reader stays up
                    // to 2 s for another to join (a 5 ms read alone may
                    // never overlap another on a slow store); a writer
                    // queued meanwhile goes next, and the readers queued
                    // behind it are let in together.
                    let joined = tokio::time::Instant::now() + Duration::from_secs(2);
                    while most.load(Ordering::SeqCst) < 2 && tokio::time::Instant::now() < joined {
                        sleep(Duration::from_millis(5)).await;
                        most.fetch_max(readers.load(Ordering::SeqCst), Ordering::SeqCst);
                    }
                    sleep(Duration::from_millis(5)).await;
                    readers.fetch_sub(1, Ordering::SeqCst);
                    r.release().await.unwrap();
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(
        most_readers.load(Ordering::SeqCst) >= 2,
        "readers never overlapped: the lock behaved as a mutex"
    );
}

/// Readers keep the lock read-held without a gap (each new one arrives
/// while others still read). A writer that starts waiting gets in within a
/// bound, because the readers arriving after it queue behind it; and while
/// it waits, a fresh reader is refused.
pub async fn rwlock_waiting_writer_is_not_starved_by_readers(f: &Factory) {
    let w_client = f.client().await;
    let Some(wrw) = rw(&w_client) else {
        return;
    };
    let name = unique("rw-starve");
    let stop = Arc::new(AtomicBool::new(false));
    let mut rws = Vec::new();
    for _ in 0..4 {
        rws.push(f.client().await.rw_locks().unwrap());
    }
    let probe = f.client().await.rw_locks().unwrap();
    let mut readers = Vec::new();
    for rw in rws {
        let (name, stop) = (name.clone(), stop.clone());
        readers.push(tokio::spawn(async move {
            let mut held = rw.read(&name, LONG, Duration::from_secs(30)).await.unwrap();
            let mut reads = 1u32;
            while !stop.load(Ordering::SeqCst) {
                sleep(Duration::from_millis(150)).await;
                // The next read is taken before this one is given up, so
                // the lock is never without a reader however slow the
                // machine, until a writer waits: then the next read queues
                // behind it and times out, and this one is given up.
                let next = match rw.read(&name, LONG, Duration::from_millis(500)).await {
                    Ok(next) => next,
                    Err(Error::Timeout { .. }) => {
                        held.release().await.unwrap();
                        held = rw.read(&name, LONG, Duration::from_secs(30)).await.unwrap();
                        reads += 1;
                        continue;
                    }
                    Err(e) => panic!("read: {e}"),
                };
                held.release().await.unwrap();
                held = next;
                reads += 1;
            }
            held.release().await.unwrap();
            reads
        }));
        sleep(Duration::from_millis(40)).await;
    }
    // The check below needs the readers holding: wait until the store
    // shows them overlapping (a spawned reader may not have asked yet).
    until("two readers holding at once", LONG, || async {
        probe.inspect(&name).await.unwrap().readers.len() >= 2
    })
    .await;
    assert!(
        wrw.try_write(&name, LONG).await.unwrap().is_none(),
        "a writer got in beside readers"
    );
    let asked = Instant::now();
    let w = wrw
        .write(&name, LONG, Duration::from_secs(10))
        .await
        .expect("the writer must not be starved by a stream of readers");
    let waited = asked.elapsed();
    // The readers holding when it queued leave within 650 ms (their hold,
    // then their next read's wait behind the writer); the rest is round
    // trips and wake-ups.
    assert!(
        waited <= Duration::from_secs(3),
        "the writer waited {waited:?} behind overlapping readers"
    );
    assert!(
        probe.try_read(&name, LONG).await.unwrap().is_none(),
        "a reader got in beside the writer"
    );
    stop.store(true, Ordering::SeqCst);
    w.release().await.unwrap();
    for r in readers {
        assert!(r.await.unwrap() >= 1);
    }
}

/// Fencing tokens rise across reader and writer grants: a writer's token
/// is above the tokens of every read before it, and a later read's above
/// the writer's. Readers share; a writer excludes readers and writers.
pub async fn rwlock_fencing_tokens_rise_across_readers_and_writers(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let (Some(ra), Some(rb)) = (rw(&a), rw(&b)) else {
        return;
    };
    let name = unique("rw-fence");
    let r1 = ra.read(&name, LONG, Duration::ZERO).await.unwrap();
    let r2 = rb
        .try_read(&name, LONG)
        .await
        .unwrap()
        .expect("two readers share the lock");
    assert!(rb.try_write(&name, LONG).await.unwrap().is_none());
    let (t1, t2) = (r1.fencing_token(), r2.fencing_token());
    assert_ne!(t1, t2);
    assert_eq!((r1.name(), r1.mode()), (name.as_str(), RwMode::Read));
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let w = rb.write(&name, LONG, Duration::ZERO).await.unwrap();
    assert_eq!((w.name(), w.mode()), (name.as_str(), RwMode::Write));
    assert!(
        w.fencing_token() > t1.max(t2),
        "a write token below a read's"
    );
    assert!(ra.try_read(&name, LONG).await.unwrap().is_none());
    assert!(ra.try_write(&name, LONG).await.unwrap().is_none());
    let tw = w.fencing_token();
    w.release().await.unwrap();
    let r3 = ra.read(&name, LONG, Duration::ZERO).await.unwrap();
    assert!(
        r3.fencing_token() > tw,
        "a read token below the last write's"
    );
    r3.release().await.unwrap();
}

/// A writer whose grant expired (no renewal) cannot extend or release it
/// once another writer holds the lock, and does not disturb that holder.
pub async fn rwlock_stale_guard_cannot_release_or_extend(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let (Some(ra), Some(rb)) = (rw(&a), rw(&b)) else {
        return;
    };
    let name = unique("rw-stale");
    let short = ttl(&a, Duration::from_millis(600));
    let stale = ra.write(&name, short, Duration::ZERO).await.unwrap();
    let fresh = rb
        .write(&name, LONG, short * 4 + Duration::from_secs(5))
        .await
        .unwrap();
    assert!(fresh.fencing_token() > stale.fencing_token());
    assert!(
        stale.extend(short).await.is_err(),
        "a stale writer extended"
    );
    assert!(
        matches!(stale.release().await, Err(Error::NotHeld { .. })),
        "a stale writer's release must be NotHeld"
    );
    assert!(fresh.is_valid());
    assert!(
        ra.try_read(&name, LONG).await.unwrap().is_none(),
        "the stale writer's release freed the new writer's lock"
    );
    fresh.release().await.unwrap();
}

/// A waiting writer is woken by the store when the last reader leaves
/// (within [`WOKEN`] of the release's reply), polling at [`wake_poll`].
pub async fn rwlock_waiter_is_woken_by_notification(f: &Factory) {
    let a = f.client().await;
    let b = f.client().await;
    let poll = wake_poll(&b);
    let b = b.with_poll_interval(poll);
    let (Some(ra), Some(rb)) = (rw(&a), rw(&b)) else {
        return;
    };
    let name = unique("rw-wake");
    let r = ra.read(&name, LONG, Duration::ZERO).await.unwrap();
    let n = name.clone();
    let waiter = tokio::spawn(async move {
        let w = rb.write(&n, LONG, Duration::from_secs(20)).await;
        (Instant::now(), w)
    });
    sleep(Duration::from_millis(1500)).await;
    r.release().await.unwrap();
    // From the release's reply: its round trip is not the writer's delay.
    let released = Instant::now();
    let (got, w) = waiter.await.unwrap();
    let w = w.expect("the writer gets the lock");
    let lag = got.saturating_duration_since(released);
    assert!(
        lag <= WOKEN,
        "writer took {lag:?} after the reader left (poll {poll:?}): not woken by a notification"
    );
    w.release().await.unwrap();
}

/// Bad input is an InvalidArgument before anything is sent, and leaves
/// nothing: afterwards the name can be taken for writing at once.
pub async fn rwlock_bad_input_is_rejected_and_writes_nothing(f: &Factory) {
    let c = f.client().await;
    let Some(r) = rw(&c) else {
        return;
    };
    let name = unique("rw-bad");
    let field = |res: coord_core::Result<coord_core::RwGuard>| match res {
        Err(Error::InvalidArgument { field, .. }) => field,
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    assert_eq!(field(r.read("", LONG, Duration::ZERO).await), "name");
    assert_eq!(
        field(r.write("a\u{1}b", LONG, Duration::ZERO).await),
        "name"
    );
    assert_eq!(
        field(r.read(&name, Duration::ZERO, Duration::ZERO).await),
        "ttl"
    );
    assert_eq!(
        field(
            r.write(&name, Duration::from_secs(400 * 24 * 3600), Duration::ZERO)
                .await
        ),
        "ttl"
    );
    assert!(matches!(
        r.force_release("").await,
        Err(Error::InvalidArgument { field: "name", .. })
    ));
    let w = r
        .try_write(&name, LONG)
        .await
        .unwrap()
        .expect("nothing was left by the refused calls");
    w.release().await.unwrap();
}

/// `inspect` tells a read-write lock's readers from its writer: two
/// readers are listed as readers with their owner ids and tokens and no
/// writer; then a writer alone, with its token; then nobody.
pub async fn rwlock_inspect_shows_the_readers_or_the_writer(f: &Factory) {
    let c = f.client().await;
    let Some(r) = rw(&c) else {
        return;
    };
    let name = unique("rw-inspect");
    let a = r.read(&name, LONG, Duration::ZERO).await.unwrap();
    let b = r.read(&name, LONG, Duration::ZERO).await.unwrap();
    let info = r.inspect(&name).await.unwrap();
    assert!(
        info.writer.is_none(),
        "readers taken for a writer: {info:?}"
    );
    let mut seen: Vec<_> = info
        .readers
        .iter()
        .map(|h| (h.owner_id.clone(), h.fencing_token))
        .collect();
    seen.sort();
    let mut want = vec![
        (a.owner_id(), a.fencing_token()),
        (b.owner_id(), b.fencing_token()),
    ];
    want.sort();
    assert_eq!(seen, want, "{info:?}");
    a.release().await.unwrap();
    b.release().await.unwrap();
    let w = r.write(&name, LONG, Duration::ZERO).await.unwrap();
    let info = r.inspect(&name).await.unwrap();
    let writer = info.writer.as_ref().expect("the writer");
    assert_eq!(
        (&writer.owner_id, writer.fencing_token),
        (&w.owner_id(), w.fencing_token()),
        "{info:?}"
    );
    assert!(info.readers.is_empty(), "{info:?}");
    w.release().await.unwrap();
    let info = r.inspect(&name).await.unwrap();
    assert!(info.writer.is_none() && info.readers.is_empty(), "{info:?}");
}
