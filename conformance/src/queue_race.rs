//! Race scenarios for any store's raw `coord_core::Queue`: concurrent
//! calls on ONE delivery (or of one consumer, or a push with a pop of its
//! group) through ONE client. Used by
//! `tests/it/queue_same_delivery_races.rs` in coord-etcd, coord-redis and
//! coord-postgres.
//!
//! Each scenario runs [`ROUNDS`] rounds on fresh queue names; the two (or
//! three) calls are started together, a delay between them spun (0 to
//! 750 µs: tokio's timer has a millisecond resolution and the windows are
//! a fraction of a local round trip), the first call polled until it waits
//! on the store. Rounds vary which call goes first, whether the client
//! under test made the delivery (a client that keeps records of its
//! deliveries then has one) or another client did with the same consumer
//! token (no record), and whether the message is its group's head (an
//! older message of the group, delayed for ten minutes, is pushed first
//! in half the rounds). After a round's calls answered, late calls of the
//! owner on the ended delivery must answer false and change nothing; after
//! all rounds and the visibility plus two seconds of settling, another
//! client drains each queue (pop, ack, until empty) and what it finds, the
//! counts (`stats`), a purge's count and what the store holds (a
//! [`Probe`]: raw keys on etcd, `peek` elsewhere) are checked against what
//! the answers imply.
//!
//! The contract (`coord_core::queue_backend`): "`ack`, `nack` and `extend`
//! act only if the message is in flight to that owner token and its
//! deadline has not passed (owner-checked, atomic), and otherwise change
//! nothing and return `false`"; an ack deletes the message. So an ack is
//! not idempotent: of two acks of one delivery exactly one answers true
//! (the second finds no message in flight), and of an ack and a nack
//! exactly one (docs/guarantees.md: "no message lost or acked twice"). An extend
//! never ends a delivery, so an ack or nack racing only extends of the
//! same owner must answer true.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::spin;
use coord_core::{
    Lane, Message, MessageId, NewMessage, OwnerToken, PopAttempt, Queue, QueueConfig, QueueStats,
    async_trait,
};
use tokio::time::sleep;

mod ends;
mod pops;
mod pushes;

pub use ends::{ack_racing_extend, ack_racing_nack, nack_racing_extend, two_acks};
pub use pops::{ack_racing_next_pop_ordered, pops_of_one_consumer};
pub use pushes::push_racing_pop_of_its_group;

/// A client's raw queue.
pub type Q = Arc<dyn Queue>;

/// Rounds per scenario.
pub const ROUNDS: u64 = 100;
/// The visibility of every delivery and extend (never runs out within a
/// round).
pub const VIS: Duration = Duration::from_secs(3);
/// Settling after the last round, on top of [`VIS`].
pub const SETTLE: Duration = Duration::from_secs(2);
/// The delay of the older message that makes a delivery not its group's
/// head (never comes due within a test).
const OLDER: Duration = Duration::from_secs(600);

/// What the store holds of a queue, read past the queue's own calls where
/// the test can.
#[async_trait]
pub trait Probe: Send + Sync {
    /// What names message `id` of queue `q` (empty: nothing).
    async fn of(&self, q: &str, id: u64) -> Vec<String>;
    /// Everything of queue `q` (empty: nothing).
    async fn all(&self, q: &str) -> Vec<String>;
}

/// A [`Probe`] through `peek` of both lanes (for stores whose raw layout
/// the test does not read).
pub struct PeekProbe(pub Q);

impl PeekProbe {
    async fn ids(&self, q: &str) -> Vec<(u64, Lane)> {
        let mut out = Vec::new();
        for lane in [Lane::Main, Lane::Dead] {
            for m in self.0.peek(q, lane, 1000).await.unwrap() {
                out.push((m.id.get(), lane));
            }
        }
        out
    }
}

#[async_trait]
impl Probe for PeekProbe {
    async fn of(&self, q: &str, id: u64) -> Vec<String> {
        self.ids(q)
            .await
            .into_iter()
            .filter(|(i, _)| *i == id)
            .map(|(i, l)| format!("message {i} in lane {l:?}"))
            .collect()
    }

    async fn all(&self, q: &str) -> Vec<String> {
        self.ids(q)
            .await
            .into_iter()
            .map(|(i, l)| format!("message {i} in lane {l:?}"))
            .collect()
    }
}

/// The clients of one scenario: `c`, the one client under test; `c0`,
/// another client that makes deliveries for `c`'s owner when `c` must not
/// know them; `c2`, the checker's client; `probe`, what the store holds.
pub struct Env {
    /// The one client under test.
    pub c: Q,
    /// Makes deliveries for `c`'s owner that `c` does not know of.
    pub c0: Q,
    /// The checker's client.
    pub c2: Q,
    /// What the store holds.
    pub probe: Box<dyn Probe>,
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// The delay of round `i` of a sweep: 0 to 750 µs in 50 µs steps, spun.
fn sweep(i: u64) -> Duration {
    Duration::from_micros((i % 16) * 50)
}

/// The rounds' variations: which call starts first, the sweep's delay.
fn order_and_delay(i: u64) -> (bool, Duration) {
    ((i / 4) % 2 == 1, sweep(i / 8))
}

async fn push(c: &Q, q: &str, delay: Duration, group: Option<&str>) -> u64 {
    let m = NewMessage::new(b"x").in_group(group).delayed(delay);
    c.push(q, &m).await.unwrap().id.get()
}

async fn pop(
    c: &Q,
    q: &str,
    o: &OwnerToken,
    vis: Duration,
    cfg: &QueueConfig,
) -> coord_core::Result<Option<Message>> {
    Ok(match c.try_pop(q, Lane::Main, o, vis, cfg).await? {
        PopAttempt::Delivered { message, .. } => Some(message),
        PopAttempt::Empty { .. } => None,
    })
}

/// Start `first` on a task of its own and poll it until it waits on the
/// store, spin `d`, then run `second` here: both answers.
async fn race<A, B>(first: A, d: Duration, second: B) -> (A::Output, B::Output)
where
    A: Future + Send + 'static,
    A::Output: Send + 'static,
    B: Future,
{
    let h = tokio::spawn(first);
    tokio::task::yield_now().await;
    spin(d);
    let b = second.await;
    (h.await.unwrap(), b)
}

/// [`race`] of `a` and `b` with `b` started first when `b_first`: their
/// answers, in the order (a, b) either way.
async fn race_in_order<A, B>(a: A, b: B, b_first: bool, d: Duration) -> (A::Output, B::Output)
where
    A: Future + Send + 'static,
    A::Output: Send + 'static,
    B: Future + Send + 'static,
    B::Output: Send + 'static,
{
    if b_first {
        let (rb, ra) = race(b, d, a).await;
        (ra, rb)
    } else {
        race(a, d, b).await
    }
}

/// The id a pop delivered (`None`: empty); a failed pop is recorded in
/// `bad` for round `i`.
fn delivered_id(
    got: coord_core::Result<Option<Message>>,
    i: u64,
    bad: &mut Vec<(u64, String)>,
) -> Option<u64> {
    match got {
        Ok(Some(m)) => Some(m.id.get()),
        Ok(None) => None,
        Err(e) => {
            bad.push((i, format!("the pop failed: {e}")));
            None
        }
    }
}

/// One call of an owner on its delivery.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Call {
    Ack,
    Nack(Duration),
    Extend,
}

fn answer(r: coord_core::Result<bool>) -> String {
    match r {
        Ok(true) => "true".into(),
        Ok(false) => "false".into(),
        Err(e) => format!("error: {e}"),
    }
}

async fn call(c: Q, q: &'static str, id: u64, o: OwnerToken, what: Call) -> String {
    let id = MessageId(id);
    answer(match what {
        Call::Ack => c.ack(q, Lane::Main, id, &o).await,
        Call::Nack(d) => c.nack(q, Lane::Main, id, &o, d).await,
        Call::Extend => c.extend(q, Lane::Main, id, &o, VIS).await,
    })
}

/// `a` and `b` of owner `o` on delivery `id` through `c`, started together
/// (`b_first`: `b` is started first), `d` spun between: their answers, in
/// the order (a, b).
async fn pair(
    c: &Q,
    q: &'static str,
    id: u64,
    o: OwnerToken,
    (a, b): (Call, Call),
    b_first: bool,
    d: Duration,
) -> (String, String) {
    let (ca, cb) = (call(c.clone(), q, id, o, a), call(c.clone(), q, id, o, b));
    race_in_order(ca, cb, b_first, d).await
}

/// A delivery of one round: queue `q`, message `id` in flight to `o` (for
/// [`VIS`]); `older`: the delayed older message of its group, if any.
struct Delivered {
    q: &'static str,
    id: u64,
    older: Option<u64>,
    o: OwnerToken,
}

/// Round `i`'s delivery: through `c` itself (even `i`) or through `c0`
/// with the same owner token (odd `i`: `c` made no delivery); the message
/// is its group's head unless `(i / 2) % 2 == 1` (then an older message of
/// the group waits, delayed, before it). With `next`, a second message of
/// the group is pushed after it (its id is returned too).
async fn deliver(env: &Env, tag: &str, i: u64, cfg: &QueueConfig, next: bool) -> (Delivered, u64) {
    let q = leak(format!("{tag}{i}"));
    let older = match (i / 2) % 2 {
        1 => Some(push(&env.c, q, OLDER, None).await),
        _ => None,
    };
    let id = push(&env.c, q, Duration::ZERO, None).await;
    let n = match next {
        true => push(&env.c, q, Duration::ZERO, None).await,
        false => 0,
    };
    let o = OwnerToken::random();
    let via = if i % 2 == 0 { &env.c } else { &env.c0 };
    let m = pop(via, q, &o, VIS, cfg)
        .await
        .unwrap()
        .expect("the message just pushed is delivered");
    assert_eq!(m.id.get(), id);
    (Delivered { q, id, older, o }, n)
}

/// What another client finds of a queue after settling: the messages it is
/// delivered (id, attempts), each acked at once; problems seen on the way.
async fn drain(c2: &Q, q: &str, cfg: &QueueConfig) -> (Vec<(u64, u32)>, Vec<String>) {
    let z = OwnerToken::random();
    let mut got = Vec::new();
    let mut bad = Vec::new();
    for _ in 0..20 {
        match pop(c2, q, &z, VIS, cfg).await {
            Ok(Some(m)) => {
                got.push((m.id.get(), m.attempts));
                match c2.ack(q, Lane::Main, m.id, &z).await {
                    Ok(true) => {}
                    r => bad.push(format!("the drain's ack of {} answered {r:?}", m.id)),
                }
            }
            Ok(None) => return (got, bad),
            Err(e) => {
                bad.push(format!("the drain's pop failed: {e}"));
                return (got, bad);
            }
        }
    }
    bad.push("the drain did not end in 20 pops".into());
    (got, bad)
}

/// The final check of a one-delivery round, after settling: the drain
/// delivers exactly `want` (id, attempts); afterwards the queue holds only
/// its older message (if any): stats, what the store holds of `d.id`, a
/// purge's count.
async fn settle_check(env: &Env, d: &Delivered, want: &[(u64, u32)]) -> Vec<String> {
    let mut bad = Vec::new();
    let (got, mut b) = drain(&env.c2, d.q, &QueueConfig::default()).await;
    bad.append(&mut b);
    if got != want {
        bad.push(format!(
            "the drain after settling found {got:?} (message {}), expected {want:?}",
            d.id
        ));
    }
    let older = u64::from(d.older.is_some());
    let s = env.c2.stats(d.q).await.unwrap();
    let want_s = QueueStats {
        delayed: older,
        ..QueueStats::default()
    };
    if s != want_s {
        bad.push(format!("stats after the drain {s:?}, expected {want_s:?}"));
    }
    let left = env.probe.of(d.q, d.id).await;
    if !left.is_empty() {
        bad.push(format!(
            "left of message {} after the drain: {left:?}",
            d.id
        ));
    }
    let purged = env.c2.purge(d.q).await.unwrap();
    if purged != older {
        bad.push(format!(
            "the purge deleted {purged} messages, expected {older}"
        ));
    }
    bad
}

/// After the owner's calls ended delivery `d` (acked, or given back: not
/// in flight to it any more): a late extend, ack and nack of the owner
/// through `c` answer false and leave what the store holds of the message
/// as it was.
async fn late_calls(env: &Env, d: &Delivered) -> Vec<String> {
    let mut bad = Vec::new();
    let before = env.probe.of(d.q, d.id).await;
    for what in [Call::Extend, Call::Ack, Call::Nack(Duration::ZERO)] {
        let r = call(env.c.clone(), d.q, d.id, d.o, what).await;
        if r != "false" {
            bad.push(format!(
                "a late {what:?} of the ended delivery answered {r}"
            ));
        }
    }
    let after = env.probe.of(d.q, d.id).await;
    if after != before {
        bad.push(format!(
            "late calls changed what the store holds of the message: {before:?} -> {after:?}"
        ));
    }
    bad
}

/// Report and assert: `bad` holds (round, problem).
fn verdict(test: &str, counts: &HashMap<String, u32>, bad: &[(u64, String)]) {
    let mut c: Vec<_> = counts.iter().collect();
    c.sort();
    let rounds_bad: HashSet<u64> = bad.iter().map(|(i, _)| *i).collect();
    println!(
        "{test}: {ROUNDS} rounds, answers {c:?}; {} violations in {} rounds",
        bad.len(),
        rounds_bad.len()
    );
    for (i, b) in bad.iter().take(20) {
        println!("  round {i}: {b}");
    }
    assert!(
        bad.is_empty(),
        "{test}: {} violations in {} of {ROUNDS} rounds; first: {:?}",
        bad.len(),
        rounds_bad.len(),
        bad.iter().take(5).collect::<Vec<_>>()
    );
}
