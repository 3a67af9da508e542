//! Races that end one delivery: acks, nacks and extends of it.

use super::*;

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
    // Rounds whose message another client took and acked after its delay.
    let mut acked_late = HashSet::new();
    for i in 0..ROUNDS {
        let (d, _) = deliver(env, tag, i, &cfg, false).await;
        let (b_first, delay) = order_and_delay(i);
        let calls = (Call::Nack(nd), Call::Extend);
        let sent = std::time::Instant::now();
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
        // What a delayed nack left is judged only while its delay has not
        // passed since the nack was sent (a loaded machine can stall the
        // test past it, and the message is then due, rightly).
        let judged = nd.is_zero() || sent.elapsed() < nd;
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
        if s != want && judged {
            bad.push((
                i,
                format!("nack {nack}, extend {ext}: stats right after {s:?}, expected {want:?}"),
            ));
        }
        if !nd.is_zero() && judged {
            let w = OwnerToken::random();
            let r = pop(&env.c2, d.q, &w, VIS, &cfg).await;
            // Delivered only after the delay passed: not judged (and the
            // settling check below then sees one delivery more).
            match r {
                Ok(None) => {}
                r if sent.elapsed() < nd => bad.push((
                    i,
                    format!("another client's pop before the delay passed: {r:?}"),
                )),
                r => {
                    *counts
                        .entry("a pop after the delay passed (not judged)".to_string())
                        .or_default() += 1;
                    if let Ok(Some(m)) = r {
                        if env.c2.ack(d.q, Lane::Main, m.id, &w).await.is_ok_and(|a| a) {
                            acked_late.insert(i);
                        }
                    }
                }
            }
        }
        if !judged {
            *counts
                .entry("stalled past the delay (not judged)".to_string())
                .or_default() += 1;
        }
        for b in late_calls(env, &d).await {
            bad.push((i, b));
        }
        rounds.push(d);
    }
    sleep(VIS + SETTLE).await;
    for (i, d) in rounds.iter().enumerate() {
        let want: &[(u64, u32)] = if acked_late.contains(&(i as u64)) {
            &[]
        } else {
            &[(d.id, 2)]
        };
        for b in settle_check(env, d, want).await {
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
