//! Race scenarios for any store's raw `coord_core::Queue`: concurrent
//! calls on ONE delivery (or of one consumer) through ONE client. Used by
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
    let m = NewMessage {
        payload: b"x",
        delay,
        group,
        dedup_id: None,
        dedup_window: Duration::ZERO,
    };
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
    if b_first {
        let (rb, ra) = race(cb, d, ca).await;
        (ra, rb)
    } else {
        race(ca, d, cb).await
    }
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

/// (a) An ack racing an extend of the same delivery, both of its owner,
/// through one client. The ack must answer true (an extend never ends a
/// delivery); nothing of the message is left right after; a late extend,
/// ack or nack answers false and brings nothing back; after the
/// visibility lapsed and two seconds more another client finds nothing to
/// deliver. Fails if the extend, answered after the ack deleted the
/// message, writes it (or its deadline) back, or if a record of the client
/// overwritten by the racing call makes the ack refuse a live delivery.
pub async fn ack_racing_extend(env: &Env) {
    let mut rounds = Vec::new();
    let mut counts = HashMap::new();
    let mut bad = Vec::new();
    let cfg = QueueConfig::default();
    for i in 0..ROUNDS {
        let (d, _) = deliver(env, "a", i, &cfg, false).await;
        let (b_first, delay) = order_and_delay(i);
        let calls = (Call::Ack, Call::Extend);
        let (ack, ext) = pair(&env.c, d.q, d.id, d.o, calls, b_first, delay).await;
        *counts
            .entry(format!("ack {ack}, extend {ext}"))
            .or_default() += 1;
        if ack != "true" {
            bad.push((
                i,
                format!("the ack of a live delivery answered {ack} (extend {ext})"),
            ));
        }
        let left = env.probe.of(d.q, d.id).await;
        if !left.is_empty() {
            bad.push((
                i,
                format!("ack {ack}, extend {ext}: left right after: {left:?}"),
            ));
        }
        for b in late_calls(env, &d).await {
            bad.push((i, b));
        }
        rounds.push(d);
    }
    sleep(VIS + SETTLE).await;
    for (i, d) in rounds.iter().enumerate() {
        for b in settle_check(env, d, &[]).await {
            bad.push((i as u64, b));
        }
    }
    verdict("ack_racing_extend", &counts, &bad);
}

/// (b) An ack racing a nack (zero delay in rounds 0-127 and 256-319, 300 ms
/// in 128-255) of the same delivery, both of its owner, through one
/// client. Exactly one answers true (the other finds it no longer in
/// flight to the owner). Ack true: the message is gone for good (nothing
/// of it right after, nothing delivered after settling). Nack true: it is
/// delivered again exactly once (attempts 2) and nothing else. Late calls
/// of the owner answer false and change nothing.
pub async fn ack_racing_nack(env: &Env) {
    let mut rounds = Vec::new();
    let mut counts = HashMap::new();
    let mut bad = Vec::new();
    let cfg = QueueConfig::default();
    for i in 0..ROUNDS {
        let (d, _) = deliver(env, "b", i, &cfg, false).await;
        let (b_first, delay) = order_and_delay(i);
        let nd = match (i / 128) % 2 {
            0 => Duration::ZERO,
            _ => Duration::from_millis(300),
        };
        let calls = (Call::Ack, Call::Nack(nd));
        let (ack, nack) = pair(&env.c, d.q, d.id, d.o, calls, b_first, delay).await;
        *counts
            .entry(format!("ack {ack}, nack({nd:?}) {nack}"))
            .or_default() += 1;
        let redelivered = match (ack.as_str(), nack.as_str()) {
            ("true", "false") => {
                let left = env.probe.of(d.q, d.id).await;
                if !left.is_empty() {
                    bad.push((i, format!("ack true: left right after: {left:?}")));
                }
                false
            }
            ("false", "true") => true,
            _ => {
                bad.push((i, format!("ack {ack}, nack {nack}: not exactly one true")));
                nack == "true"
            }
        };
        for b in late_calls(env, &d).await {
            bad.push((i, b));
        }
        rounds.push((d, redelivered));
    }
    sleep(VIS + SETTLE).await;
    for (i, (d, redelivered)) in rounds.iter().enumerate() {
        let want: &[(u64, u32)] = if *redelivered { &[(d.id, 2)] } else { &[] };
        for b in settle_check(env, d, want).await {
            bad.push((i as u64, b));
        }
    }
    verdict("ack_racing_nack", &counts, &bad);
}

/// (c) Two acks of the same delivery (a retried ack) through one client.
/// An ack acts only on a message in flight to the owner, and deletes it:
/// exactly one answers true, never both (an ack is not idempotent), never
/// neither; nothing of the message is left right after or delivered after
/// settling; late calls answer false.
pub async fn two_acks(env: &Env) {
    let mut rounds = Vec::new();
    let mut counts = HashMap::new();
    let mut bad = Vec::new();
    let cfg = QueueConfig::default();
    for i in 0..ROUNDS {
        let (d, _) = deliver(env, "c", i, &cfg, false).await;
        let (b_first, delay) = order_and_delay(i);
        let calls = (Call::Ack, Call::Ack);
        let (a1, a2) = pair(&env.c, d.q, d.id, d.o, calls, b_first, delay).await;
        *counts
            .entry(format!("first {a1}, second {a2}"))
            .or_default() += 1;
        let trues = [&a1, &a2].iter().filter(|r| r.as_str() == "true").count();
        if trues != 1 {
            bad.push((i, format!("acks answered {a1} and {a2}: {trues} true")));
        }
        let left = env.probe.of(d.q, d.id).await;
        if !left.is_empty() {
            bad.push((i, format!("left right after: {left:?}")));
        }
        for b in late_calls(env, &d).await {
            bad.push((i, b));
        }
        rounds.push(d);
    }
    sleep(VIS + SETTLE).await;
    for (i, d) in rounds.iter().enumerate() {
        for b in settle_check(env, d, &[]).await {
            bad.push((i as u64, b));
        }
    }
    verdict("two_acks", &counts, &bad);
}

/// (d) A nack racing an extend of the same delivery, both of its owner,
/// through one client: with a 1 s delay (`nack_with_delay_racing_extend`)
/// or none (`nack_racing_extend`). The nack must answer true (an extend
/// never ends a delivery); right after, the message is delayed (or ready)
/// and not in flight (stats), and, delayed, another client's pop finds
/// nothing; late calls of the owner answer false; after settling it is
/// delivered again exactly once (attempts 2) and nothing else, and leaves
/// nothing once acked. Fails if the extend, answered after the nack, puts
/// the message back in flight (or leaves its deadline on the timeline), or
/// if the nack is refused.
pub async fn nack_racing_extend(env: &Env, nd: Duration) {
    let mut rounds = Vec::new();
    let mut counts = HashMap::new();
    let mut bad = Vec::new();
    let cfg = QueueConfig::default();
    let tag = if nd.is_zero() { "f" } else { "d" };
    for i in 0..ROUNDS {
        let (d, _) = deliver(env, tag, i, &cfg, false).await;
        let (b_first, delay) = order_and_delay(i);
        let calls = (Call::Nack(nd), Call::Extend);
        let (nack, ext) = pair(&env.c, d.q, d.id, d.o, calls, b_first, delay).await;
        *counts
            .entry(format!("nack {nack}, extend {ext}"))
            .or_default() += 1;
        if nack != "true" {
            bad.push((
                i,
                format!("the nack of a live delivery answered {nack} (extend {ext})"),
            ));
        }
        let s = env.c2.stats(d.q).await.unwrap();
        let older = u64::from(d.older.is_some());
        let want = match nd.is_zero() {
            true => QueueStats {
                ready: 1,
                delayed: older,
                ..QueueStats::default()
            },
            false => QueueStats {
                delayed: 1 + older,
                ..QueueStats::default()
            },
        };
        if s != want {
            bad.push((
                i,
                format!("nack {nack}, extend {ext}: stats right after {s:?}, expected {want:?}"),
            ));
        }
        if !nd.is_zero() {
            let w = OwnerToken::random();
            match pop(&env.c2, d.q, &w, VIS, &cfg).await {
                Ok(None) => {}
                r => bad.push((
                    i,
                    format!("another client's pop before the delay passed: {r:?}"),
                )),
            }
        }
        for b in late_calls(env, &d).await {
            bad.push((i, b));
        }
        rounds.push(d);
    }
    sleep(VIS + SETTLE).await;
    for (i, d) in rounds.iter().enumerate() {
        for b in settle_check(env, d, &[(d.id, 2)]).await {
            bad.push((i as u64, b));
        }
    }
    let test = if nd.is_zero() {
        "nack_racing_extend"
    } else {
        "nack_with_delay_racing_extend"
    };
    verdict(test, &counts, &bad);
}

/// (e) Pops of ONE consumer token racing each other through one client.
/// Four shapes of queue, by round:
/// - 0: three ready messages, two pops;
/// - 1: two ordered groups of two messages each (`ordered_groups`), three
///   pops: exactly two deliverable, one per group;
/// - 2: a delivery to another consumer that lapsed (1 ms visibility) and a
///   ready message, two pops (both race to make the lapsed one ready);
/// - 3: a message delayed 1 ms (due) and a ready one, two pops.
///
/// Checks: the racing pops deliver distinct messages, as many as are
/// deliverable (a pop answering empty while a message is deliverable loses
/// it for now); with ordered groups at most one per group; each delivery
/// is acked by the owner through the client (must answer true); after
/// settling, another client drains exactly the messages the owner did not
/// get, each once, and the queue is left with nothing.
pub async fn pops_of_one_consumer(env: &Env) {
    let mut rounds = Vec::new();
    let mut counts: HashMap<String, u32> = HashMap::new();
    let mut bad = Vec::new();
    for i in 0..ROUNDS {
        let q = leak(format!("e{i}"));
        let shape = i % 4;
        let delay = sweep(i / 4);
        let ordered = shape == 1;
        let cfg = QueueConfig::default().ordered_groups(ordered);
        let mut pushed: Vec<(u64, Option<&'static str>)> = Vec::new();
        let (pops, deliverable) = match shape {
            0 => {
                for _ in 0..3 {
                    pushed.push((push(&env.c, q, Duration::ZERO, None).await, None));
                }
                (2, 2)
            }
            1 => {
                for g in ["g0", "g1", "g0", "g1"] {
                    pushed.push((push(&env.c, q, Duration::ZERO, Some(g)).await, Some(g)));
                }
                (3, 2)
            }
            2 => {
                for _ in 0..2 {
                    pushed.push((push(&env.c, q, Duration::ZERO, None).await, None));
                }
                let x = OwnerToken::random();
                let m = pop(&env.c2, q, &x, Duration::from_millis(1), &cfg)
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(m.id.get(), pushed[0].0);
                spin(Duration::from_millis(3));
                (2, 2)
            }
            _ => {
                pushed.push((push(&env.c, q, Duration::from_millis(1), None).await, None));
                pushed.push((push(&env.c, q, Duration::ZERO, None).await, None));
                spin(Duration::from_millis(3));
                (2, 2)
            }
        };
        let o = OwnerToken::random();
        let one = move |c: Q| async move { pop(&c, q, &o, VIS, &cfg).await };
        let got: Vec<coord_core::Result<Option<Message>>> = if pops == 2 {
            let (a, b) = race(one(env.c.clone()), delay, one(env.c.clone())).await;
            vec![a, b]
        } else {
            let h1 = tokio::spawn(one(env.c.clone()));
            tokio::task::yield_now().await;
            spin(delay);
            let (a, b) = race(one(env.c.clone()), delay, one(env.c.clone())).await;
            vec![h1.await.unwrap(), a, b]
        };
        let mut ids = Vec::new();
        for r in &got {
            match r {
                Ok(Some(m)) => ids.push(m.id.get()),
                Ok(None) => {}
                Err(e) => bad.push((i, format!("shape {shape}: a pop failed: {e}"))),
            }
        }
        *counts
            .entry(format!("shape {shape}: {} delivered", ids.len()))
            .or_default() += 1;
        let distinct: HashSet<u64> = ids.iter().copied().collect();
        if distinct.len() != ids.len() {
            bad.push((
                i,
                format!("shape {shape}: one consumer's racing pops delivered {ids:?}"),
            ));
        }
        if ids.len() != deliverable {
            bad.push((
                i,
                format!(
                    "shape {shape}: {} of {pops} pops delivered ({ids:?}), {deliverable} deliverable",
                    ids.len()
                ),
            ));
        }
        if ordered {
            let groups: Vec<_> = ids
                .iter()
                .map(|id| pushed.iter().find(|(p, _)| p == id).map(|p| p.1))
                .collect();
            let g: HashSet<_> = groups.iter().collect();
            if g.len() != groups.len() {
                bad.push((
                    i,
                    format!("ordered groups: two of one group in flight: {ids:?} {groups:?}"),
                ));
            }
        }
        for id in &distinct {
            match env.c.ack(q, Lane::Main, MessageId(*id), &o).await {
                Ok(true) => {}
                r => bad.push((
                    i,
                    format!("shape {shape}: the owner's ack of its delivery {id} answered {r:?}"),
                )),
            }
        }
        rounds.push((q, cfg, pushed, distinct));
    }
    sleep(SETTLE).await;
    for (i, (q, cfg, pushed, acked)) in rounds.iter().enumerate() {
        let i = i as u64;
        let (got, b) = drain(&env.c2, q, cfg).await;
        for b in b {
            bad.push((i, b));
        }
        let mut want: Vec<u64> = pushed
            .iter()
            .map(|(id, _)| *id)
            .filter(|id| !acked.contains(id))
            .collect();
        want.sort();
        let mut found: Vec<u64> = got.iter().map(|(id, _)| *id).collect();
        found.sort();
        if found != want {
            bad.push((i, format!("after settling another client drained {found:?}; not acked by the owner: {want:?}")));
        }
        let left = env.probe.all(q).await;
        if !left.is_empty() {
            bad.push((i, format!("left after the drain: {left:?}")));
        }
    }
    verdict("pops_of_one_consumer", &counts, &bad);
}

/// (f) The owner's ack of its delivery racing its own next pop, on a queue
/// with ordered groups (a worker that fetches its next message while
/// acking the last): two messages of one group, the first delivered. The
/// ack must answer true; the pop delivers the second message (once the ack
/// landed) or nothing, never the first (the delay swept 0 to 3 ms); a
/// delivered second one is acked by the owner (true); after settling
/// another client drains the second message iff the pop did not get it,
/// and nothing is left.
pub async fn ack_racing_next_pop_ordered(env: &Env) {
    let mut rounds = Vec::new();
    let mut counts = HashMap::new();
    let mut bad = Vec::new();
    let cfg = QueueConfig::default().ordered_groups(true);
    for i in 0..ROUNDS {
        // Ordered: the delivery is always its group's head (an older
        // delayed message would hold the group), so no `older` here.
        let i2 = i & !2;
        let (d, next) = deliver(env, &format!("g{i}-"), i2, &cfg, true).await;
        // Wider than the other sweeps: an ack of a group's head reads
        // before it writes, the pop goes through in one round trip.
        let (b_first, delay) = ((i / 4) % 2 == 1, Duration::from_micros((i / 8 % 16) * 200));
        let ack = call(env.c.clone(), d.q, d.id, d.o, Call::Ack);
        let (q, o) = (d.q, d.o);
        let c = env.c.clone();
        let next_pop = async move { pop(&c, q, &o, VIS, &cfg).await };
        let (ack, got) = if b_first {
            let (g, a) = race(next_pop, delay, ack).await;
            (a, g)
        } else {
            race(ack, delay, next_pop).await
        };
        let got = match got {
            Ok(Some(m)) => Some(m.id.get()),
            Ok(None) => None,
            Err(e) => {
                bad.push((i, format!("the pop failed: {e}")));
                None
            }
        };
        *counts
            .entry(format!(
                "ack {ack}, pop {}",
                if got.is_some() { "delivered" } else { "empty" }
            ))
            .or_default() += 1;
        if ack != "true" {
            bad.push((i, format!("the ack of a live delivery answered {ack}")));
        }
        if got.is_some_and(|g| g != next) {
            bad.push((i, format!("the pop delivered {got:?}; only {next} may be")));
        }
        if let Some(g) = got {
            match env.c.ack(q, Lane::Main, MessageId(g), &o).await {
                Ok(true) => {}
                r => bad.push((i, format!("the owner's ack of {g} answered {r:?}"))),
            }
        }
        rounds.push((d, next, got == Some(next)));
    }
    sleep(VIS + SETTLE).await;
    for (i, (d, next, taken)) in rounds.iter().enumerate() {
        let i = i as u64;
        let (got, b) = drain(&env.c2, d.q, &cfg).await;
        for b in b {
            bad.push((i, b));
        }
        let want: Vec<(u64, u32)> = if *taken { vec![] } else { vec![(*next, 1)] };
        if got != want {
            bad.push((
                i,
                format!("after settling another client drained {got:?}, expected {want:?}"),
            ));
        }
        let left = env.probe.all(d.q).await;
        if !left.is_empty() {
            bad.push((i, format!("left after the drain: {left:?}")));
        }
    }
    verdict("ack_racing_next_pop_ordered", &counts, &bad);
}

/// The tests of this module's scenarios for one store, each on fresh queues:
/// `$env` names an `async fn(&str) -> Env` of the calling test file (its
/// argument, a tag of letters and underscores, names the clients' prefix
/// or schema).
#[macro_export]
macro_rules! queue_race_tests {
    ($env:ident) => {
        /// (a) See [`conformance::queue_race::ack_racing_extend`].
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn ack_racing_extend_of_one_delivery() {
            $crate::queue_race::ack_racing_extend(&$env("rwq_ack_ext").await).await;
        }

        /// (b) See [`conformance::queue_race::ack_racing_nack`].
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn ack_racing_nack_of_one_delivery() {
            $crate::queue_race::ack_racing_nack(&$env("rwq_ack_nack").await).await;
        }

        /// (c) See [`conformance::queue_race::two_acks`].
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn two_acks_of_one_delivery() {
            $crate::queue_race::two_acks(&$env("rwq_ack_ack").await).await;
        }

        /// (d) See [`conformance::queue_race::nack_racing_extend`]: a 1 s
        /// delay.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn nack_with_delay_racing_extend_of_one_delivery() {
            let e = $env("rwq_nackd_ext").await;
            $crate::queue_race::nack_racing_extend(&e, std::time::Duration::from_secs(1)).await;
        }

        /// (d') See [`conformance::queue_race::nack_racing_extend`]: no
        /// delay (ready at once: the read-then-write path with the
        /// group's keys).
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn nack_racing_extend_of_one_delivery() {
            let e = $env("rwq_nack_ext").await;
            $crate::queue_race::nack_racing_extend(&e, std::time::Duration::ZERO).await;
        }

        /// (e) See [`conformance::queue_race::pops_of_one_consumer`].
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn pops_of_one_consumer_racing() {
            $crate::queue_race::pops_of_one_consumer(&$env("rwq_pop_pop").await).await;
        }

        /// (f) See [`conformance::queue_race::ack_racing_next_pop_ordered`].
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn ack_racing_the_owners_next_pop_in_an_ordered_group() {
            $crate::queue_race::ack_racing_next_pop_ordered(&$env("rwq_ack_pop").await).await;
        }
    };
}
