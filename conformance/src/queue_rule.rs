//! A store's work queue against coord-core's queue state machine
//! (`coord_core::queue_state`), step by step: random pushes to groups of
//! uneven sizes, pops of both lanes (ordered groups or not, dead-lettering
//! or not), acks, nacks, acks by the wrong consumer, redrives, stats and
//! peeks, all far within the visibility (no time passes that matters).
//! Every pop must deliver the message the state machine delivers, with
//! its attempts and group; tokens rise; a wrong consumer's ack is refused;
//! stats, peeks and redrives agree with it. One scenario, run by every
//! store's tests on its raw [`Queue`].

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use coord_core::queue_state::{Ack, QueueState, Turns};
use coord_core::{Lane, MessageId, NewMessage, OwnerToken, PopAttempt, Queue, QueueConfig};
use tokio::time::Instant;

use crate::unique;

/// Far longer than the scenario: no delivery lapses while it runs.
const LONG: Duration = Duration::from_secs(600);

/// A small xorshift generator: the same steps on every store.
struct Steps(u64);

impl Steps {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

fn message(group: &str) -> NewMessage<'_> {
    NewMessage::new(b"m").in_group((!group.is_empty()).then_some(group))
}

/// Run `steps` random steps for each of four step seeds on `queue`
/// (fresh queue names under it), comparing every answer with the state
/// machine's, which keeps its turns as the store does (`turns`); every 50
/// steps `check(queue name)` runs a store's own check of its bookkeeping.
/// Panics with the seed, step and operation at the first difference; also
/// if some kind of step (deliveries of each lane, dead-letterings,
/// redriven messages, refused wrong-consumer acks) never happened, as the
/// run would then prove little.
pub async fn deliveries_follow_the_state_machine(
    queue: Arc<dyn Queue>,
    turns: Turns,
    steps: usize,
    check: impl AsyncFn(&str),
) {
    let b = queue;
    let groups = ["big", "big", "big", "", "a", "b", "c"];
    let mut seen = [0usize; 5];
    for seed in [1u64, 7, 42, 1234] {
        let name = unique("q-rule");
        let mut rng = Steps(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let owners: Vec<OwnerToken> = (0..4).map(|_| OwnerToken::random()).collect();
        let mut model = QueueState::with_turns(turns);
        // Deliveries in flight: (lane, id, index of the owner).
        let mut held: Vec<(Lane, MessageId, usize)> = Vec::new();
        let mut last_token = 0;
        for step in 0..steps {
            let now = Instant::now();
            let what = rng.below(10);
            let lane = [Lane::Main, Lane::Main, Lane::Dead][rng.below(3)];
            let ctx = format!("seed {seed} step {step} op {what} lane {lane:?}");
            match what {
                0..=2 => {
                    let group = groups[rng.below(groups.len())];
                    let m = message(group);
                    let id = b.push(&name, &m).await.unwrap().id;
                    model.push(now, &m, SystemTime::now(), || id.0);
                }
                3..=5 => {
                    let o = rng.below(owners.len());
                    let cfg = QueueConfig {
                        max_deliveries: [None, Some(2)][rng.below(2)]
                            .filter(|_| lane == Lane::Main),
                        ordered_groups: rng.below(2) == 0,
                    };
                    let dead_before = model.stats(now).dead;
                    let want = model.pop(now, lane, &owners[o], LONG, &cfg, || 0);
                    seen[2] += (model.stats(now).dead - dead_before) as usize;
                    let got = b
                        .try_pop(&name, lane, &owners[o], LONG, &cfg)
                        .await
                        .unwrap();
                    match (want, got) {
                        (PopAttempt::Empty { .. }, PopAttempt::Empty { .. }) => {}
                        (
                            PopAttempt::Delivered { message: w, .. },
                            PopAttempt::Delivered { message, token },
                        ) => {
                            seen[usize::from(lane == Lane::Dead)] += 1;
                            assert_eq!(
                                (message.id, message.attempts, message.group),
                                (w.id, w.attempts, w.group),
                                "{ctx}: the delivery (id, attempts, group)"
                            );
                            assert!(token.get() > last_token, "{ctx}: tokens must rise");
                            last_token = token.get();
                            held.push((lane, message.id, o));
                        }
                        (w, g) => panic!("{ctx}: the state machine gave {w:?}, the store {g:?}"),
                    }
                }
                6 | 7 if !held.is_empty() => {
                    let (lane, id, o) = held.swap_remove(rng.below(held.len()));
                    let wrong = &owners[(o + 1) % owners.len()];
                    assert!(
                        !b.ack(&name, lane, id, wrong).await.unwrap(),
                        "{ctx}: another consumer's ack was accepted"
                    );
                    assert_eq!(model.ack(now, lane, id, wrong), Ack::Refused);
                    seen[4] += 1;
                    if what == 6 {
                        assert!(b.ack(&name, lane, id, &owners[o]).await.unwrap(), "{ctx}");
                        assert!(matches!(
                            model.ack(now, lane, id, &owners[o]),
                            Ack::Deleted { .. }
                        ));
                    } else {
                        let nacked = b.nack(&name, lane, id, &owners[o], Duration::ZERO);
                        assert!(nacked.await.unwrap(), "{ctx}");
                        assert!(model.nack(now, lane, id, &owners[o], Duration::ZERO));
                    }
                }
                8 => {
                    let limit = 1 + rng.below(3);
                    let want = model.redrive(now, limit);
                    seen[3] += want as usize;
                    assert_eq!(
                        b.redrive(&name, limit).await.unwrap(),
                        want,
                        "{ctx}: redrive"
                    );
                }
                _ => {
                    let (s, w) = (b.stats(&name).await.unwrap(), model.stats(now));
                    assert_eq!(
                        (s.ready, s.in_flight, s.delayed, s.dead),
                        (w.ready, w.in_flight, w.delayed, w.dead),
                        "{ctx}: stats"
                    );
                    let shown = |ms: Vec<coord_core::Message>| -> Vec<(MessageId, u32)> {
                        ms.iter().map(|m| (m.id, m.attempts)).collect()
                    };
                    assert_eq!(
                        shown(b.peek(&name, lane, 1000).await.unwrap()),
                        shown(model.peek(lane, 1000)),
                        "{ctx}: peek"
                    );
                }
            }
            if step % 50 == 49 {
                check(&name).await;
            }
        }
        b.purge(&name).await.unwrap();
    }
    assert!(
        seen.iter().all(|n| *n > 10),
        "some kind of step hardly happened (main and dead deliveries, \
         dead-letterings, redriven, refused acks): {seen:?}"
    );
}
