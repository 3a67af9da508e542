//! Thousands of random steps on one semaphore agree with a reference
//! model of the contract.

use crate::common;

use common::SEC;
use conformance::testkit::redis::RedisServer;
use coord_core::{Attempt, Error, OwnerToken, Semaphore};

use super::{XorShift, backend, hget, req};

/// A reference model of the contract (no expiry: every TTL is long): a
/// FIFO semaphore with `total` binding while anybody holds or waits.
#[derive(Default)]
struct Model {
    total: u32,
    holders: Vec<(usize, u32, u64)>,
    queue: Vec<(usize, u32)>,
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Granted,
    Held,
    BadTotal,
}

impl Model {
    fn attempt(&mut self, o: usize, p: u32, total: u32, queue: bool) -> (Outcome, Option<u64>) {
        if self.holders.is_empty() && self.queue.is_empty() {
            self.total = total;
        } else if self.total != total {
            return (Outcome::BadTotal, None);
        }
        if let Some(h) = self.holders.iter().find(|h| h.0 == o) {
            return (Outcome::Granted, Some(h.2));
        }
        let pos = self.queue.iter().position(|w| w.0 == o);
        let ahead: u32 = self.queue[..pos.unwrap_or(self.queue.len())]
            .iter()
            .map(|w| w.1)
            .sum();
        let held: u32 = self.holders.iter().map(|h| h.1).sum();
        if ahead + p <= self.total - held {
            if let Some(i) = pos {
                self.queue.remove(i);
            }
            self.holders.push((o, p, 0));
            (Outcome::Granted, None)
        } else {
            if queue && pos.is_none() {
                self.queue.push((o, p));
            }
            (Outcome::Held, None)
        }
    }
    fn release(&mut self, o: usize) -> bool {
        let had = self.holders.iter().any(|h| h.0 == o);
        self.holders.retain(|h| h.0 != o);
        self.queue.retain(|w| w.0 != o);
        had
    }
    fn force(&mut self) -> bool {
        let had = !self.holders.is_empty();
        self.holders.clear();
        had
    }
}

/// Thousands of random steps (attempts of 1-3 permits, queueing or not,
/// sometimes with another total; releases; extends; force releases) on
/// Redis and on the reference model agree step by step, and Redis's
/// tokens behave: a fresh grant's token is above every earlier one, a
/// holder's retry gets its own token back.
#[tokio::test]
async fn random_steps_agree_with_a_reference_model() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let owners: Vec<OwnerToken> = (0..10).map(|_| OwnerToken::random()).collect();
    let mut rng = XorShift(0xDEAD_BEEF_1234_5678);
    let mut model = Model::default();
    let mut top = 0u64;
    for step in 0..3000 {
        let o = rng.below(owners.len() as u64) as usize;
        let who = &owners[o];
        match rng.below(20) {
            0..=11 => {
                let p = 1 + rng.below(3) as u32;
                let total = if rng.below(25) == 0 { 4 } else { 5 };
                let queue = rng.below(3) != 0;
                let (want, tok) = model.attempt(o, p, total, queue);
                let got = b
                    .try_acquire("model", who.step(), &req(p, total, 600 * SEC, queue))
                    .await;
                let got_kind = match &got {
                    Ok(Attempt::Granted(_)) => Outcome::Granted,
                    Ok(Attempt::Held { .. }) => Outcome::Held,
                    Err(Error::InvalidArgument { field, .. }) if *field == "permits_total" => {
                        Outcome::BadTotal
                    }
                    Err(e) => panic!("step {step}: {e}"),
                };
                assert_eq!(
                    got_kind, want,
                    "step {step}: owner {o} asks {p} of {total} (queue {queue}); model holders {:?} queue {:?}",
                    model.holders, model.queue
                );
                if let Ok(Attempt::Granted(t)) = got {
                    match tok {
                        Some(prev) => {
                            assert_eq!(t.get(), prev, "step {step}: retry changed the token")
                        }
                        None => {
                            assert!(t.get() > top, "step {step}: token did not rise");
                            top = t.get();
                            model.holders.last_mut().unwrap().2 = t.get();
                        }
                    }
                }
            }
            12..=16 => {
                let want = model.release(o);
                assert_eq!(
                    b.release("model", who.step()).await.unwrap(),
                    want,
                    "step {step}: release"
                );
            }
            17..=18 => {
                let want = model.holders.iter().any(|h| h.0 == o);
                assert_eq!(
                    b.extend("model", who.step(), 600 * SEC).await.unwrap(),
                    want,
                    "step {step}: extend"
                );
            }
            _ => {
                if rng.below(4) == 0 {
                    let want = model.force();
                    assert_eq!(
                        b.force_release("model").await.unwrap(),
                        want,
                        "step {step}: force"
                    );
                }
            }
        }
        if step % 100 == 0 {
            let held: u32 = model.holders.iter().map(|h| h.1).sum();
            let qsum: u32 = model.queue.iter().map(|w| w.1).sum();
            let st = "coord:semaphore:{model}";
            if !(model.holders.is_empty() && model.queue.is_empty()) {
                assert_eq!(
                    hget(&server, st, "held"),
                    Some(held.to_string()),
                    "step {step}: held"
                );
                assert_eq!(
                    hget(&server, st, "qsum"),
                    Some(qsum.to_string()),
                    "step {step}: qsum"
                );
            }
        }
    }
}
