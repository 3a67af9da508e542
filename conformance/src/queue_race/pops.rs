//! Races of one consumer's pops, and of an ack with the next pop.

use super::*;

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
        let (ack, got) = race_in_order(ack, next_pop, b_first, delay).await;
        let got = delivered_id(got, i, &mut bad);
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

        /// (g) See [`conformance::queue_race::push_racing_pop_of_its_group`].
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn push_racing_a_pop_of_its_groups_last_ready_message() {
            $crate::queue_race::push_racing_pop_of_its_group(&$env("rwq_push_pop").await).await;
        }
    };
}
