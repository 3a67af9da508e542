//! Deliveries: payloads of every byte value round-trip, deliveries follow
//! the rule exactly, and a burst of due messages and a large purge take
//! bounded steps.

use std::sync::Arc;
use std::time::Duration;

use conformance::testkit::postgres::{cluster, pgbouncer};
use coord_core::{Lane, OwnerToken, PopAttempt, Queue, QueueConfig};
use coord_postgres::PostgresBackend;

use super::{LONG, backend, msg, rows, unique};

/// Whether the bookkeeping of `queue` matches its messages: every ready
/// message has a turn, a group with turned messages in a lane has a row
/// whose last turn is at least theirs, and no row is left for a group
/// without messages there.
async fn check_bookkeeping(b: &PostgresBackend, queue: &str) {
    let c = b.pool().get().await.unwrap();
    let s = b.schema();
    let row = c
        .query_one(
            &format!(
                "WITH want AS (SELECT m.lane, m.grp, max(m.turn) AS top \
                                 FROM \"{s}\".queue_messages m WHERE m.queue = $1 \
                                GROUP BY m.lane, m.grp), \
                      have AS (SELECT g.lane, g.grp, g.last \
                                 FROM \"{s}\".queue_groups g WHERE g.queue = $1) \
                 SELECT (SELECT count(*) FROM have h \
                          WHERE NOT EXISTS (SELECT 1 FROM want w \
                                             WHERE w.lane = h.lane AND w.grp = h.grp)), \
                        (SELECT count(*) FROM want w LEFT JOIN have h USING (lane, grp) \
                          WHERE w.top IS NOT NULL AND (h.last IS NULL OR h.last < w.top)), \
                        (SELECT count(*) FROM \"{s}\".queue_messages m \
                          WHERE m.queue = $1 AND m.due_at IS NULL AND m.turn IS NULL)"
            ),
            &[&queue],
        )
        .await
        .unwrap();
    let counts: (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(
        counts,
        (0, 0, 0),
        "{queue}: (group rows without messages, groups whose row is missing or behind \
         their turns, ready messages without a turn)"
    );
}

/// Payloads are stored as they are: every byte value (NUL included), an
/// empty one, and one of the maximum size of random bytes, on a direct
/// connection and through PgBouncer, by pop and by peek; odd queue and
/// group names (quotes, colons, unicode, SQL) are ordinary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_of_every_byte_value_round_trip() {
    let _alone = crate::ALONE.lock().await;
    let schema = unique("qbytes");
    let direct = backend(&cluster().url(), &schema, LONG).await;
    let bounced = coord_postgres::builder(&pgbouncer().url())
        .schema(&schema)
        .listen(false)
        .sweep_every(None)
        .connect_backend()
        .await
        .expect("connect through pgbouncer");
    assert_eq!(direct.max_payload(), 256 * 1024);
    assert!(direct.durable());
    let every: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let random: Vec<u8> = (0..direct.max_payload())
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect();
    for (b, name, group) in [
        (&direct, "q'\"; DROP TABLE x; --", "g:1:é"),
        (&bounced, "q:dead:ü\\", "'); --"),
    ] {
        for payload in [&every[..], &[][..], &random[..], &[0u8][..]] {
            let id = b.push(name, &msg(payload, Some(group))).await.unwrap().id;
            let peeked = b.peek(name, Lane::Main, 10).await.unwrap();
            assert_eq!(peeked.len(), 1);
            assert!(peeked[0].payload == payload, "peek changed the payload");
            let owner = OwnerToken::random();
            match b
                .try_pop(name, Lane::Main, &owner, LONG, &QueueConfig::default())
                .await
                .unwrap()
            {
                PopAttempt::Delivered { message, .. } => {
                    assert_eq!(message.id, id);
                    assert_eq!(message.group.as_deref(), Some(group));
                    assert!(
                        message.payload == payload,
                        "a {}-byte payload came back changed",
                        payload.len()
                    );
                    let age = message.enqueued_at.elapsed().unwrap_or_default();
                    assert!(age < Duration::from_secs(10), "enqueued {age:?} ago");
                }
                other => panic!("{other:?}"),
            }
            assert!(b.ack(name, Lane::Main, id, &owner).await.unwrap());
        }
    }
}

/// Random pushes to groups of uneven sizes, pops of both lanes (ordered
/// or not, dead-lettering or not), acks, nacks, acks by the wrong consumer
/// and redrives: every delivery is the one coord-core's queue state
/// machine picks with turns kept per message (id, attempts, group), tokens
/// rise, stats and peeks agree (`conformance::queue_rule`); the group rows
/// agree with the messages every 50 steps, and a purge leaves no row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_follow_the_rule_exactly() {
    let _alone = crate::ALONE.lock().await;
    let b = backend(&cluster().url(), &unique("qrule"), LONG).await;
    let checked = b.clone();
    conformance::queue_rule::deliveries_follow_the_state_machine(
        b.clone() as Arc<dyn Queue>,
        coord_core::queue_state::Turns::PerMessage,
        500,
        async |name: &str| check_bookkeeping(&checked, name).await,
    )
    .await;
    assert_eq!(rows(&b).await, [0, 0, 0]);
}

/// 12,000 deliveries that lapsed at once (the earliest id lapsing last)
/// are made ready in bounded steps, and the pop that follows still
/// delivers what the rule picks (the lowest id), with its attempts kept;
/// a purge of more than one step's worth of messages and dedup ids
/// deletes them all and leaves no row; 6,000 messages due for the dead
/// lane are moved in bounded steps before the next good one is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_due_messages_and_a_large_purge_take_bounded_steps() {
    let _alone = crate::ALONE.lock().await;
    let b = backend(&cluster().url(), &unique("qburst"), LONG).await;
    let s = b.schema().to_string();
    let name = unique("burst");
    let n = 12_000;
    let first = b.push(&name, &msg(b"seed", Some("g0"))).await.unwrap().id.0;
    let owner = OwnerToken::random();
    let cfg = QueueConfig::default();
    assert!(matches!(
        b.try_pop(&name, Lane::Main, &owner, LONG, &cfg)
            .await
            .unwrap(),
        PopAttempt::Delivered { .. }
    ));
    let c = b.pool().get().await.unwrap();
    c.batch_execute(&format!(
        "INSERT INTO \"{s}\".queue_messages (queue, lane, id, grp, attempts, enqueued_at, due_at, owner, turn, payload) \
         SELECT '{name}', 0, {first} + i, 'g' || (i % 4), 1, now(), \
                now() - interval '1 second' - (i * interval '1 millisecond'), '\\x01', 0, 'x' \
           FROM generate_series(1, {n}) i; \
         INSERT INTO \"{s}\".queue_groups (queue, lane, grp, last) \
         SELECT '{name}', 0, 'g' || k, 0 FROM generate_series(1, 3) k; \
         INSERT INTO \"{s}\".queue_dedup (queue, dedup_id, id, expires_at) \
         SELECT '{name}', 'd' || i, i, now() + interval '1 hour' FROM generate_series(1, {n}) i"
    ))
    .await
    .unwrap();
    check_bookkeeping(&b, &name).await;
    // The first message's delivery is still live; the lapsed ones all keep
    // turn 0 (V is 0), so the rule picks the lowest id (due the latest).
    let q = b.coord().queues().unwrap();
    let d = q
        .pop(&name, LONG, Duration::from_secs(20))
        .await
        .unwrap()
        .expect("a lapsed delivery");
    assert_eq!((d.id().0, d.attempts()), (first + 1, 2));
    check_bookkeeping(&b, &name).await;
    let due = c
        .query_one(
            &format!(
                "SELECT count(*) FROM \"{s}\".queue_messages WHERE queue = $1 AND due_at <= now()"
            ),
            &[&name],
        )
        .await
        .unwrap();
    assert_eq!(due.get::<_, i64>(0), 0, "due messages were left behind");
    std::mem::forget(d);
    assert_eq!(q.purge(&name).await.unwrap(), n as u64 + 1);
    assert_eq!(rows(&b).await, [0, 0, 0], "a large purge left rows");

    // 6,000 messages delivered too often, then a good one: a pop moves
    // them to the dead lane in bounded steps and then delivers it.
    let last = b.push(&name, &msg(b"good", Some("p"))).await.unwrap().id.0;
    let dead = 6_000;
    c.batch_execute(&format!(
        "INSERT INTO \"{s}\".queue_messages (queue, lane, id, grp, attempts, enqueued_at, turn, payload) \
         SELECT '{name}', 0, {last} - i, 'p', 3, now(), 0, 'x' FROM generate_series(1, {dead}) i"
    ))
    .await
    .unwrap();
    check_bookkeeping(&b, &name).await;
    let q3 = q
        .clone()
        .with_config(QueueConfig::default().max_deliveries(3));
    let d = q3
        .pop(&name, LONG, Duration::from_secs(20))
        .await
        .unwrap()
        .expect("the good message, after the dead letters");
    assert_eq!(d.id().0, last);
    d.ack().await.unwrap();
    check_bookkeeping(&b, &name).await;
    assert_eq!(q.stats(&name).await.unwrap().dead, dead as u64);
    assert_eq!(q.purge(&name).await.unwrap(), dead as u64);
    assert_eq!(rows(&b).await, [0, 0, 0]);
}
