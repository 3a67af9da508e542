//! Cancellation at every await: each primitive's acquire, arrive or pop is
//! dropped after its k-th poll, for k = 1, 2, ... until it finishes (its
//! result, a guard, is then dropped), on a store whose every call takes
//! 10 ms to arrive and 10 ms to answer, so the drop lands before, inside
//! and after each store call. Afterwards nothing may be left for that
//! owner: the name is free for another client within the cleanup time
//! (1 s here: one round trip of cleanup; every TTL is 300 s and a queue
//! place lasts 30 s, so nothing lapses on its own meanwhile).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use coord_core::{Coord, Error, PermitOptions, PopOptions};

use crate::slow_store::{Lag, Slow};

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);
/// The polling interval: longer than every wait here, so no jittered
/// poll decides when an attempt is made (a notification, the holder's
/// expiry or the deadline does), and each run makes the same calls.
const POLL: Duration = Duration::from_secs(60);
/// Every grant's TTL, a delivery's visibility.
const LONG: Duration = Duration::from_secs(300);
/// When the blocker leaves, in the runs where it does.
const LEAVES_AT: Duration = Duration::from_millis(500);
/// How long a check waits for the background cleanup.
const CLEANUP: Duration = Duration::from_secs(1);
/// Far more polls than any run here takes.
const MAX_POLLS: usize = 1000;

fn slow() -> Arc<Slow> {
    Slow::new(Lag::new(10 * MS, 10 * MS))
}

/// Polls `fut` each time the runtime wakes it, at most `left` times, and
/// drops it unfinished at the wake-up after the last: `None` then, its
/// output if it finished first.
struct DropAfter<F> {
    fut: Pin<Box<F>>,
    left: usize,
}

impl<F: Future> Future for DropAfter<F> {
    type Output = Option<F::Output>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        self.left -= 1;
        self.fut.as_mut().poll(cx).map(Some)
    }
}

/// Whether the blocker leaves while the operation waits (it is then
/// granted) or stays (it times out).
#[derive(Debug, Clone, Copy)]
enum Run {
    BlockerLeaves,
    BlockerStays,
}

impl Run {
    fn wait(self) -> Duration {
        match self {
            Run::BlockerLeaves => 5 * S,
            Run::BlockerStays => S,
        }
    }
}

/// For k = 1, 2, ...: `setup(k)` (a blocker, returning what `leave` takes
/// away), run `op(k)` dropped after its k-th poll (its output dropped if it
/// finished), the blocker leaving at [`LEAVES_AT`] when `run` says so, then
/// after the cleanup time `leave` the blocker and `check(k)`; until `op`
/// finishes. Returns how the finishing run ended (its output dropped).
async fn cut_everywhere<B, SF, O, OF, T, L, LF, C, CF>(
    run: Run,
    mut setup: impl FnMut(usize) -> SF,
    mut op: O,
    leave: L,
    mut check: C,
) -> Result<(), Error>
where
    B: Send + 'static,
    SF: Future<Output = B>,
    O: FnMut(usize) -> OF,
    OF: Future<Output = Result<T, Error>>,
    L: Fn(B) -> LF + Clone + Send + 'static,
    LF: Future<Output = ()> + Send,
    C: FnMut(usize) -> CF,
    CF: Future<Output = ()>,
{
    for k in 1..=MAX_POLLS {
        let blocker = setup(k).await;
        let stays = match run {
            Run::BlockerLeaves => {
                let leave = leave.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(LEAVES_AT).await;
                    leave(blocker).await;
                });
                None
            }
            Run::BlockerStays => Some(blocker),
        };
        let out = DropAfter {
            fut: Box::pin(op(k)),
            left: k,
        }
        .await;
        let end = out.map(|r| r.map(drop));
        tokio::time::sleep(CLEANUP).await;
        if let Some(b) = stays {
            leave(b).await;
        }
        check(k).await;
        if let Some(end) = end {
            return end;
        }
    }
    panic!("{run:?}: the operation did not finish within {MAX_POLLS} polls");
}

/// The run that finished was granted where the blocker left, and timed
/// out where it stayed.
fn assert_ends(run: Run, end: Result<(), Error>) {
    match (run, &end) {
        (Run::BlockerLeaves, Ok(())) | (Run::BlockerStays, Err(Error::Timeout { .. })) => {}
        _ => panic!("{run:?}: the run that finished ended in {end:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_lock_acquire_dropped_at_any_await_leaves_the_lock_free() {
    for run in [Run::BlockerLeaves, Run::BlockerStays] {
        let slow = slow();
        let (locks, plain) = (
            slow.coord(POLL).locks().unwrap(),
            slow.plain().locks().unwrap(),
        );
        let p = plain.clone();
        let end = cut_everywhere(
            run,
            |k| {
                let p = p.clone();
                async move {
                    p.acquire(&format!("l{k}"), LONG, Duration::ZERO)
                        .await
                        .unwrap()
                }
            },
            |k| {
                let locks = locks.clone();
                async move { locks.acquire(&format!("l{k}"), LONG, run.wait()).await }
            },
            |g: coord_core::Guard| async move { g.release().await.unwrap() },
            |k| {
                let p = p.clone();
                async move {
                    let g = p.try_acquire(&format!("l{k}"), LONG).await.unwrap();
                    assert!(
                        g.is_some(),
                        "{run:?}, dropped after poll {k}: lock still held"
                    );
                    g.unwrap().release().await.unwrap();
                }
            },
        )
        .await;
        assert_ends(run, end);
    }
}

/// A semaphore run: the blocker takes both permits; the operation asks for
/// one of them.
async fn semaphore_run(slow: Arc<Slow>, run: Run) {
    let (sem, plain) = (
        slow.coord(POLL).semaphores().unwrap(),
        slow.plain().semaphores().unwrap(),
    );
    let p = plain.clone();
    let end = cut_everywhere(
        run,
        |k| {
            let p = p.clone();
            async move {
                p.acquire_with(&format!("s{k}"), PermitOptions::new(2, LONG).permits(2))
                    .await
                    .unwrap()
            }
        },
        |k| {
            let sem = sem.clone();
            async move { sem.acquire(&format!("s{k}"), 2, LONG, run.wait()).await }
        },
        |p: coord_core::Permit| async move { p.release().await.unwrap() },
        |k| {
            let p = p.clone();
            async move {
                // Both permits at once, and nobody queued ahead.
                let all = p
                    .try_acquire_many(&format!("s{k}"), 2, 2, LONG)
                    .await
                    .unwrap();
                assert!(
                    all.is_some(),
                    "{run:?}, dropped after poll {k}: a permit or a place in line is left: {:?}",
                    p.inspect(&format!("s{k}")).await.unwrap()
                );
                all.unwrap().release().await.unwrap();
            }
        },
    )
    .await;
    assert_ends(run, end);
}

#[tokio::test(start_paused = true)]
async fn a_fifo_semaphore_acquire_dropped_at_any_await_leaves_no_permit_or_place() {
    for run in [Run::BlockerLeaves, Run::BlockerStays] {
        let slow = slow();
        assert!(slow.coord(POLL).semaphores().unwrap().is_fifo());
        semaphore_run(slow, run).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_racing_semaphore_acquire_dropped_at_any_await_leaves_no_permit() {
    for run in [Run::BlockerLeaves, Run::BlockerStays] {
        let slow = Slow::racing(Lag::new(10 * MS, 10 * MS));
        assert!(!slow.coord(POLL).semaphores().unwrap().is_fifo());
        semaphore_run(slow, run).await;
    }
}

/// A read-write lock run: the blocker holds it in the mode that excludes
/// `read`'s (a writer for a reader, a reader for a writer).
async fn rwlock_run(run: Run, read: bool) {
    let slow = slow();
    let (rw, plain) = (
        slow.coord(POLL).rw_locks().unwrap(),
        slow.plain().rw_locks().unwrap(),
    );
    let p = plain.clone();
    let end = cut_everywhere(
        run,
        |k| {
            let p = p.clone();
            async move {
                let name = format!("rw{k}");
                if read {
                    p.write(&name, LONG, Duration::ZERO).await.unwrap()
                } else {
                    p.read(&name, LONG, Duration::ZERO).await.unwrap()
                }
            }
        },
        |k| {
            let rw = rw.clone();
            async move {
                let name = format!("rw{k}");
                if read {
                    rw.read(&name, LONG, run.wait()).await
                } else {
                    rw.write(&name, LONG, run.wait()).await
                }
            }
        },
        |g: coord_core::RwGuard| async move { g.release().await.unwrap() },
        |k| {
            let p = p.clone();
            async move {
                let w = p.try_write(&format!("rw{k}"), LONG).await.unwrap();
                let mode = if read { "reader" } else { "writer" };
                assert!(
                    w.is_some(),
                    "{run:?}, dropped after poll {k}: the {mode} left a grant or a place in line"
                );
                w.unwrap().release().await.unwrap();
            }
        },
    )
    .await;
    assert_ends(run, end);
}

#[tokio::test(start_paused = true)]
async fn a_read_lock_dropped_at_any_await_leaves_no_grant_or_place() {
    for run in [Run::BlockerLeaves, Run::BlockerStays] {
        rwlock_run(run, true).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_write_lock_dropped_at_any_await_leaves_no_grant_or_place() {
    for run in [Run::BlockerLeaves, Run::BlockerStays] {
        rwlock_run(run, false).await;
    }
}

/// Whether participant `other` alone completes the open generation of
/// 2-party barrier `name` now (it would if a phantom of `me` still
/// counted); it is withdrawn again if it does not.
async fn completes_alone(plain: &Coord, name: &str) -> bool {
    let raw = plain.raw_barrier().unwrap();
    let id = coord_core::OwnerToken::random();
    let a = raw.arrive(name, 2, "other", &id).await.unwrap();
    if !a.complete {
        raw.withdraw(name, a.generation, "other", &id)
            .await
            .unwrap();
    }
    a.complete
}

#[tokio::test(start_paused = true)]
async fn a_barrier_wait_dropped_at_any_await_leaves_nobody_counted() {
    // The other participant waits from the start (the wait passes as soon
    // as its arrival lands), or never comes (the wait times out).
    for other_waits in [true, false] {
        let slow = slow();
        let (b, plain) = (slow.coord(POLL).barriers().unwrap(), slow.plain());
        let run = if other_waits {
            Run::BlockerLeaves
        } else {
            Run::BlockerStays
        };
        let p = plain.clone();
        let end = cut_everywhere(
            run,
            |k| {
                let p = p.clone();
                async move {
                    if other_waits {
                        let raw = p.raw_barrier().unwrap();
                        let id = coord_core::OwnerToken::random();
                        raw.arrive(&format!("b{k}"), 2, "other", &id).await.unwrap();
                    }
                }
            },
            |k| {
                let b = b.clone();
                async move { b.wait(&format!("b{k}"), 2, "me", run.wait()).await }
            },
            |()| async {},
            |k| {
                let p = p.clone();
                async move {
                    assert!(
                        !completes_alone(&p, &format!("b{k}")).await,
                        "{run:?}, dropped after poll {k}: the dropped participant still counts"
                    );
                }
            },
        )
        .await;
        assert_ends(run, end);
    }
}

#[tokio::test(start_paused = true)]
async fn a_pop_dropped_at_any_await_leaves_no_message_in_flight() {
    // The message is there from the start, comes while the pop waits, or
    // never comes.
    for (pushed_at, wait) in [
        (Some(Duration::ZERO), 5 * S),
        (Some(LEAVES_AT), 5 * S),
        (None, S),
    ] {
        let slow = slow();
        let (q, plain) = (
            slow.coord(POLL).queues().unwrap(),
            slow.plain().queues().unwrap(),
        );
        let p = plain.clone();
        let end = cut_everywhere(
            Run::BlockerStays,
            |k| {
                let p = p.clone();
                async move {
                    let name = format!("q{k}");
                    match pushed_at {
                        Some(at) if at.is_zero() => {
                            p.push(&name, b"job").await.unwrap();
                        }
                        Some(at) => {
                            tokio::spawn(async move {
                                tokio::time::sleep(at).await;
                                p.push(&name, b"job").await.unwrap();
                            });
                        }
                        None => {}
                    }
                }
            },
            |k| {
                let q = q.clone();
                async move { q.pop_with(&format!("q{k}"), PopOptions::new(LONG).wait(wait)).await }
            },
            |()| async {},
            |k| {
                let p = p.clone();
                async move {
                    let stats = p.stats(&format!("q{k}")).await.unwrap();
                    assert_eq!(
                        stats.in_flight, 0,
                        "pushed at {pushed_at:?}, dropped after poll {k}: a delivery nobody holds: {stats:?}"
                    );
                }
            },
        )
        .await;
        assert!(end.is_ok(), "pushed at {pushed_at:?}: {end:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_campaign_dropped_at_any_await_leaves_nobody_leading() {
    for run in [Run::BlockerLeaves, Run::BlockerStays] {
        let slow = slow();
        let (e, plain) = (
            slow.coord(POLL).elections().unwrap(),
            slow.plain().elections().unwrap(),
        );
        let p = plain.clone();
        let end = cut_everywhere(
            run,
            |k| {
                let p = p.clone();
                async move {
                    p.campaign(&format!("e{k}"), "incumbent", LONG, Duration::ZERO)
                        .await
                        .unwrap()
                }
            },
            |k| {
                let e = e.clone();
                async move { e.campaign(&format!("e{k}"), "me", LONG, run.wait()).await }
            },
            |l: coord_core::Leadership| async move { l.resign().await.unwrap() },
            |k| {
                let p = p.clone();
                async move {
                    let leader = p.leader(&format!("e{k}")).await.unwrap();
                    assert!(
                        leader.is_none(),
                        "{run:?}, dropped after poll {k}: still leading: {leader:?}"
                    );
                }
            },
        )
        .await;
        assert_ends(run, end);
    }
}
