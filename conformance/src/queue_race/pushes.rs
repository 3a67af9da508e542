//! Races of a push with a pop of its group.

use super::*;

/// (g) A push racing a pop that takes its group's last ready message:
/// one message of a group is ready, then a pop (of another consumer) and
/// a push of a second message of the same group start together, through
/// one client, the delay swept both ways. Half the rounds use a named
/// group, half none. Whichever lands first, the second message must be
/// deliverable afterwards: a push that counted on the first message
/// staying its group's candidate, and landed after the pop took it,
/// would leave the second ready but never offered.
///
/// Checks: the pop delivers the first message (the group's oldest ready
/// one) and the owner's ack of it answers true; the push answers; another
/// client then drains exactly the second message (first delivery), and
/// nothing of the queue is left.
pub async fn push_racing_pop_of_its_group(env: &Env) {
    let mut counts: HashMap<String, u32> = HashMap::new();
    let mut bad = Vec::new();
    let cfg = QueueConfig::default();
    for i in 0..ROUNDS {
        let q = leak(format!("h{i}"));
        let group = ((i / 2) % 2 == 1).then_some("g");
        let first = push(&env.c, q, Duration::ZERO, group).await;
        let (push_first, delay) = order_and_delay(i);
        let o = OwnerToken::random();
        let c = env.c.clone();
        let popped = async move { pop(&c, q, &o, VIS, &cfg).await };
        let c = env.c.clone();
        let pushed = async move { push(&c, q, Duration::ZERO, group).await };
        let (got, second) = race_in_order(popped, pushed, push_first, delay).await;
        let got = delivered_id(got, i, &mut bad);
        *counts
            .entry(format!(
                "push {}, pop {}",
                if push_first { "first" } else { "second" },
                if got.is_some() { "delivered" } else { "empty" }
            ))
            .or_default() += 1;
        if got != Some(first) {
            bad.push((
                i,
                format!("the pop delivered {got:?}; the group's oldest ready message is {first}"),
            ));
        }
        if let Some(g) = got {
            match env.c.ack(q, Lane::Main, MessageId(g), &o).await {
                Ok(true) => {}
                r => bad.push((i, format!("the owner's ack of {g} answered {r:?}"))),
            }
        }
        let (drained, b) = drain(&env.c2, q, &cfg).await;
        for b in b {
            bad.push((i, b));
        }
        let want: Vec<(u64, u32)> = match got {
            Some(g) if g == first => vec![(second, 1)],
            _ => Vec::new(),
        };
        if got == Some(first) && drained != want {
            bad.push((
                i,
                format!(
                    "after the race another client drained {drained:?}, expected {want:?} \
                     (the pushed message {second} must stay deliverable)"
                ),
            ));
        }
        let left = env.probe.all(q).await;
        if !left.is_empty() {
            bad.push((i, format!("left after the drain: {left:?}")));
        }
    }
    verdict("push_racing_pop_of_its_group", &counts, &bad);
}
