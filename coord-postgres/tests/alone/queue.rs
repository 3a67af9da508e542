//! Work queues on the real server: what they leave in the store (nothing
//! once a queue is acked or purged and its dedup ids expired), pops that
//! find nothing write nothing, payloads as they are, wake-ups from other
//! clients, the exact delivery order against a model of the rule,
//! messages and tokens through a crash, and the upgrade of a layout 7
//! schema. The cases run one after the other (one counts transaction ids
//! server-wide, one crashes the cluster).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use conformance::testkit::postgres::{cluster, pgbouncer};
use coord_core::{
    Lane, MessageId, NewMessage, OwnerToken, PopAttempt, PushOptions, Queue, QueueConfig,
};
use coord_postgres::PostgresBackend;

const LONG: Duration = Duration::from_secs(60);

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A client on a schema of its own (so its rows can be counted), without
/// the background sweep.
async fn backend(url: &str, schema: &str, grace: Duration) -> Arc<PostgresBackend> {
    coord_postgres::builder(url)
        .schema(schema)
        .idle_grace(grace)
        .sweep_every(None)
        .connect_backend()
        .await
        .expect("connect to the test cluster")
}

/// Rows of (queue_messages, queue_groups, queue_lanes, queue_dedup).
async fn rows(b: &PostgresBackend) -> [i64; 4] {
    let c = b.pool().get().await.unwrap();
    let s = b.schema();
    let row = c
        .query_one(
            &format!(
                "SELECT (SELECT count(*) FROM \"{s}\".queue_messages), \
                        (SELECT count(*) FROM \"{s}\".queue_groups), \
                        (SELECT count(*) FROM \"{s}\".queue_lanes), \
                        (SELECT count(*) FROM \"{s}\".queue_dedup)"
            ),
            &[],
        )
        .await
        .unwrap();
    [row.get(0), row.get(1), row.get(2), row.get(3)]
}

/// Whether the bookkeeping of `queue` matches its messages: a group row
/// per (lane, group) with messages, with their lowest id and lowest ready
/// id, and a lane row per lane with groups, counting them.
async fn check_bookkeeping(b: &PostgresBackend, queue: &str) {
    let c = b.pool().get().await.unwrap();
    let s = b.schema();
    let row = c
        .query_one(
            &format!(
                "WITH want AS (SELECT m.lane, m.grp, min(m.id) AS first_id, \
                                      min(m.id) FILTER (WHERE m.due_at IS NULL) AS ready_id \
                                 FROM \"{s}\".queue_messages m WHERE m.queue = $1 \
                                GROUP BY m.lane, m.grp), \
                      have AS (SELECT g.lane, g.grp, g.first_id, g.ready_id \
                                 FROM \"{s}\".queue_groups g WHERE g.queue = $1), \
                      lanes AS (SELECT l.lane, l.groups::int8 AS n FROM \"{s}\".queue_lanes l \
                                 WHERE l.queue = $1), \
                      counted AS (SELECT w.lane, count(*) AS n FROM want w GROUP BY w.lane) \
                 SELECT (SELECT count(*) FROM ((SELECT * FROM want EXCEPT SELECT * FROM have) \
                                        UNION ALL (SELECT * FROM have EXCEPT SELECT * FROM want)) x), \
                        (SELECT count(*) FROM ((SELECT * FROM lanes EXCEPT SELECT * FROM counted) \
                                        UNION ALL (SELECT * FROM counted EXCEPT SELECT * FROM lanes)) y)"
            ),
            &[&queue],
        )
        .await
        .unwrap();
    let (groups, lanes): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(
        (groups, lanes),
        (0, 0),
        "{queue}: group or lane rows disagree with the messages"
    );
}

fn msg<'a>(payload: &'a [u8], group: Option<&'a str>) -> NewMessage<'a> {
    NewMessage {
        payload,
        delay: Duration::ZERO,
        group,
        dedup_id: None,
        dedup_window: Duration::ZERO,
    }
}

async fn pop(b: &PostgresBackend, q: &str, lane: Lane, cfg: &QueueConfig) -> PopAttempt {
    b.try_pop(q, lane, &OwnerToken::random(), LONG, cfg)
        .await
        .unwrap()
}

/// Acked messages (of groups, delayed, nacked, dead-lettered and
/// redriven) leave no message, group or clock row; dedup ids stay until
/// they expire and the sweep deletes them after the grace. A purge
/// deletes every row of the queue at once. Ids keep rising for the name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acked_or_purged_queue_leaves_no_rows() {
    let _alone = crate::ALONE.lock().await;
    let grace = Duration::from_millis(200);
    let b = backend(&cluster().url(), &unique("qrows"), grace).await;
    let coord = b.coord().with_poll_interval(Duration::from_secs(60));
    let q = coord
        .queues()
        .unwrap()
        .with_config(QueueConfig::default().max_deliveries(1));
    let name = unique("rows");
    let window = Duration::from_secs(3);
    let mut last = MessageId(0);
    for i in 0..6 {
        let mut opts = PushOptions::new()
            .dedup_id(format!("d{i}"))
            .dedup_window(window);
        if i % 3 != 0 {
            opts = opts.group(format!("g{}", i % 3));
        }
        if i == 5 {
            opts = opts.delay(Duration::from_millis(200));
        }
        last = q.push_with(&name, [i as u8], &opts).await.unwrap().id;
    }
    // Every dedup id expires by then.
    let pushed = Instant::now();
    assert_eq!(rows(&b).await, [6, 3, 1, 6]);
    // One nacked (to the dead lane at its next delivery), then redriven.
    let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    d.nack(Duration::ZERO).await.unwrap();
    let mut acked = 0;
    while let Some(d) = q.pop(&name, LONG, Duration::from_secs(1)).await.unwrap() {
        d.ack().await.unwrap();
        acked += 1;
    }
    assert_eq!(acked, 5);
    assert_eq!(rows(&b).await, [1, 1, 1, 6], "only the dead letter is left");
    assert_eq!(q.redrive(&name, 10).await.unwrap(), 1);
    let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    d.ack().await.unwrap();
    assert_eq!(rows(&b).await, [0, 0, 0, 6], "acked messages left rows");
    b.sweep().await.unwrap();
    assert_eq!(rows(&b).await[3], 6, "the sweep deleted live dedup ids");
    tokio::time::sleep_until((pushed + window + grace + Duration::from_millis(100)).into()).await;
    assert!(b.sweep().await.unwrap() >= 6);
    assert_eq!(rows(&b).await, [0, 0, 0, 0], "expired dedup ids were kept");

    // A purge: every row at once, whatever the messages' state.
    for i in 0..50u8 {
        let opts = PushOptions::new()
            .group(format!("g{}", i % 4))
            .dedup_id(format!("p{i}"));
        q.push_with(&name, [i], &opts).await.unwrap();
    }
    let held = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(q.purge(&name).await.unwrap(), 50);
    assert_eq!(rows(&b).await, [0, 0, 0, 0], "a purge left rows");
    assert!(held.ack().await.is_err(), "an ack after the purge");
    let again = q.push(&name, b"again").await.unwrap();
    assert!(
        again > last,
        "ids rise for a queue name whose rows went away"
    );
    q.purge(&name).await.unwrap();
    assert_eq!(rows(&b).await, [0, 0, 0, 0]);
}

/// A pop that finds nothing deliverable (an unknown queue, messages only
/// in flight or delayed, an ordered group waiting for its head, an empty
/// dead lane) takes no lock, no transaction id and writes nothing: 400
/// such pops use no transaction id and leave the rows as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_pop_writes_nothing() {
    let _alone = crate::ALONE.lock().await;
    let b = backend(&cluster().url(), &unique("qempty"), LONG).await;
    let unknown = unique("unknown");
    let name = unique("busy");
    let ordered = QueueConfig::default().ordered_groups(true);
    let plain = QueueConfig::default();
    b.push(&name, &msg(b"a1", Some("a"))).await.unwrap();
    b.push(&name, &msg(b"a2", Some("a"))).await.unwrap();
    let delayed = NewMessage {
        delay: LONG,
        ..msg(b"later", None)
    };
    b.push(&name, &delayed).await.unwrap();
    assert!(matches!(
        pop(&b, &name, Lane::Main, &ordered).await,
        PopAttempt::Delivered { .. }
    ));
    assert!(matches!(
        pop(&b, &name, Lane::Main, &plain).await,
        PopAttempt::Delivered { .. }
    ));
    let before_rows = rows(&b).await;
    let xids = crate::XidCount::start().await;
    for i in 0..100 {
        for (q, lane, cfg) in [
            (&unknown, Lane::Main, &plain),
            (&name, Lane::Main, &plain),
            (&name, Lane::Main, &ordered),
            (&name, Lane::Dead, &plain),
        ] {
            match pop(&b, q, lane, cfg).await {
                PopAttempt::Empty { .. } => {}
                other => panic!("pop {i} of {q} ({lane:?}, {cfg:?}): {other:?}"),
            }
        }
    }
    let used = xids.used();
    assert!(used <= 3, "400 empty pops used {used} transaction ids");
    assert_eq!(rows(&b).await, before_rows, "empty pops changed rows");
    match pop(&b, &name, Lane::Main, &plain).await {
        PopAttempt::Empty { next_in } => {
            let next_in = next_in.expect("the delayed message's time");
            assert!(next_in > LONG / 2 && next_in <= LONG, "{next_in:?}");
        }
        other => panic!("{other:?}"),
    }
    b.purge(&name).await.unwrap();
    assert_eq!(rows(&b).await, [0, 0, 0, 0]);
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

/// A pop blocked on an empty queue (polling every 60 s) is woken by a push
/// from another client; a redrive wakes every waiter of the main lane; an
/// ack of an ordered group's head wakes a waiter for its next message.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn blocked_pops_are_woken_by_other_clients() {
    let _alone = crate::ALONE.lock().await;
    let schema = unique("qwake");
    let waiter = backend(&cluster().url(), &schema, LONG).await;
    let other = backend(&cluster().url(), &schema, LONG).await;
    assert!(waiter.capabilities().notifications);
    let poll = Duration::from_secs(60);
    let qw = waiter.coord().with_poll_interval(poll).queues().unwrap();
    let qo = other.coord().queues().unwrap();
    // From the reply of the call that should wake: a poll (60 s, jittered:
    // 30 s at the soonest) comes after the pops' 20 s wait; a notification
    // within a few seconds however loaded the machine.
    let prompt = Duration::from_secs(3);

    let name = unique("push");
    let (q, n) = (qw.clone(), name.clone());
    let task = tokio::spawn(async move { q.pop(&n, LONG, Duration::from_secs(20)).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    qo.push(&name, b"wake").await.unwrap();
    let pushed = Instant::now();
    let d = task.await.unwrap().unwrap().expect("the pushed message");
    assert!(
        pushed.elapsed() <= prompt,
        "woken {:?} after the push's reply",
        pushed.elapsed()
    );
    d.ack().await.unwrap();

    // Two dead letters, two waiters on one client: a redrive wakes both.
    let name = unique("redrive");
    let dead = qo
        .clone()
        .with_config(QueueConfig::default().max_deliveries(1));
    for p in [b"x", b"y"] {
        dead.push(&name, p).await.unwrap();
        let d = dead
            .pop(&name, LONG, Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        d.nack(Duration::ZERO).await.unwrap();
    }
    assert!(
        dead.pop(&name, LONG, Duration::ZERO)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(qo.stats(&name).await.unwrap().dead, 2);
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (q, n) = (qw.clone(), name.clone());
        tasks.push(tokio::spawn(async move {
            let d = q.pop(&n, LONG, Duration::from_secs(20)).await;
            (d, Instant::now())
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(qo.redrive(&name, 10).await.unwrap(), 2);
    let redriven = Instant::now();
    for t in tasks {
        let (d, woken) = t.await.unwrap();
        let d = d.unwrap().expect("a redriven message");
        assert!(
            woken.saturating_duration_since(redriven) <= prompt,
            "woken {:?} after the redrive's reply",
            woken.saturating_duration_since(redriven)
        );
        d.ack().await.unwrap();
    }

    // Ordered: the group's second message waits for the first's ack.
    let name = unique("ordered");
    let cfg = QueueConfig::default().ordered_groups(true);
    let (ow, oo) = (qw.clone().with_config(cfg), qo.clone().with_config(cfg));
    let g = PushOptions::new().group("g");
    oo.push_with(&name, b"1", &g).await.unwrap();
    let second = oo.push_with(&name, b"2", &g).await.unwrap().id;
    let first = oo.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    let n = name.clone();
    let task = tokio::spawn(async move { ow.pop(&n, LONG, Duration::from_secs(20)).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    first.ack().await.unwrap();
    let acked = Instant::now();
    let d = task
        .await
        .unwrap()
        .unwrap()
        .expect("the group's next message");
    assert_eq!(d.id(), second);
    assert!(
        acked.elapsed() <= prompt,
        "woken {:?} after the ack's reply",
        acked.elapsed()
    );
    d.ack().await.unwrap();
}

/// Random pushes to groups of uneven sizes, pops of both lanes (ordered
/// or not, dead-lettering or not), acks, nacks, acks by the wrong consumer
/// and redrives: every delivery is the one coord-core's queue state
/// machine picks (id, attempts, group), tokens rise, stats and peeks agree
/// (`conformance::queue_rule`); the group and lane rows agree with the
/// messages every 50 steps, and a purge leaves no row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_follow_the_rule_exactly() {
    let _alone = crate::ALONE.lock().await;
    let b = backend(&cluster().url(), &unique("qrule"), LONG).await;
    let checked = b.clone();
    conformance::queue_rule::deliveries_follow_the_state_machine(
        b.clone() as Arc<dyn Queue>,
        500,
        async |name: &str| check_bookkeeping(&checked, name).await,
    )
    .await;
    assert_eq!(rows(&b).await, [0, 0, 0, 0]);
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
        "INSERT INTO \"{s}\".queue_messages (queue, lane, id, grp, attempts, enqueued_at, due_at, owner, payload) \
         SELECT '{name}', 0, {first} + i, 'g' || (i % 4), 1, now(), \
                now() - interval '1 second' - (i * interval '1 millisecond'), '\\x01', 'x' \
           FROM generate_series(1, {n}) i; \
         INSERT INTO \"{s}\".queue_groups (queue, lane, grp, turn, first_id, ready_id) \
         SELECT '{name}', 0, 'g' || k, 0, {first} + k, NULL FROM generate_series(1, 3) k; \
         UPDATE \"{s}\".queue_lanes SET groups = 4 WHERE queue = '{name}'; \
         INSERT INTO \"{s}\".queue_dedup (queue, dedup_id, id, expires_at) \
         SELECT '{name}', 'd' || i, i, now() + interval '1 hour' FROM generate_series(1, {n}) i"
    ))
    .await
    .unwrap();
    check_bookkeeping(&b, &name).await;
    // The first message's delivery is still live: group g0's turn is 1,
    // the others' 0, so the rule picks the lowest id of g1..g3 (due the
    // latest).
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
    assert_eq!(rows(&b).await, [0, 0, 0, 0], "a large purge left rows");

    // 6,000 messages delivered too often, then a good one: a pop moves
    // them to the dead lane in bounded steps and then delivers it.
    let last = b.push(&name, &msg(b"good", Some("p"))).await.unwrap().id.0;
    let dead = 6_000;
    c.batch_execute(&format!(
        "INSERT INTO \"{s}\".queue_messages (queue, lane, id, grp, attempts, enqueued_at, payload) \
         SELECT '{name}', 0, {last} - i, 'p', 3, now(), 'x' FROM generate_series(1, {dead}) i; \
         UPDATE \"{s}\".queue_groups SET first_id = {last} - {dead}, ready_id = {last} - {dead} \
          WHERE queue = '{name}'"
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
    assert_eq!(rows(&b).await, [0, 0, 0, 0]);
}

/// Pushes, deliveries and acks survive a crash although their steps
/// commit asynchronously: a role whose default is `synchronous_commit =
/// off` and a WAL writer that flushes only every 10 s, then a crash
/// (`pg_ctl stop -m immediate`) right after. After the restart the pushed
/// messages are there (a dedup id still remembered), the delivered one is
/// still in flight, the acked one is gone, and the next token is above
/// every token issued before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_and_tokens_survive_a_crash() {
    let _alone = crate::ALONE.lock().await;
    let db = unique("qdurable");
    cluster().create_database(&db);
    let user = unique("q_async_role");
    let url = cluster().create_role(&user, "Async-pw1", &db);
    cluster().psql(
        "postgres",
        &format!("ALTER ROLE \"{user}\" SET synchronous_commit = off"),
    );
    cluster().psql("postgres", "ALTER SYSTEM SET wal_writer_delay = '10s'");
    cluster().psql("postgres", "SELECT pg_reload_conf()");
    let b = coord_postgres::builder(&url)
        .listen(false)
        .connect_backend()
        .await
        .expect("connect as the role");
    cluster().psql(&db, "CHECKPOINT");
    tokio::time::sleep(Duration::from_secs(1)).await;

    let name = unique("durable");
    let cfg = QueueConfig::default();
    let acked = b.push(&name, &msg(b"acked", None)).await.unwrap().id;
    let held = b.push(&name, &msg(b"held", None)).await.unwrap().id;
    let dedup = NewMessage {
        dedup_id: Some("once"),
        dedup_window: LONG,
        ..msg(b"kept", None)
    };
    let kept = b.push(&name, &dedup).await.unwrap().id;
    let mut tokens = Vec::new();
    for want in [acked, held] {
        let owner = OwnerToken::random();
        match b
            .try_pop(&name, Lane::Main, &owner, LONG, &cfg)
            .await
            .unwrap()
        {
            PopAttempt::Delivered { message, token } => {
                assert_eq!(message.id, want);
                tokens.push(token);
            }
            other => panic!("{other:?}"),
        }
        if want == acked {
            assert!(b.ack(&name, Lane::Main, acked, &owner).await.unwrap());
        }
    }
    drop(b);
    tokio::task::spawn_blocking(|| {
        cluster().crash();
        cluster().start();
    })
    .await
    .unwrap();
    cluster().psql("postgres", "ALTER SYSTEM RESET wal_writer_delay");
    cluster().psql("postgres", "SELECT pg_reload_conf()");

    let b = coord_postgres::builder(&url)
        .listen(false)
        .connect_backend()
        .await
        .expect("connect after the restart");
    let deadline = Instant::now() + Duration::from_secs(10);
    let stats = loop {
        match b.stats(&name).await {
            Ok(s) => break s,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(
        (stats.ready, stats.in_flight),
        (1, 1),
        "after the crash: {stats:?}"
    );
    let again = b.push(&name, &dedup).await.unwrap();
    assert_eq!((again.id, again.duplicate), (kept, true), "the dedup id");
    let peeked: Vec<(MessageId, u32)> = b
        .peek(&name, Lane::Main, 10)
        .await
        .unwrap()
        .iter()
        .map(|m| (m.id, m.attempts))
        .collect();
    assert_eq!(
        peeked,
        [(held, 1), (kept, 0)],
        "the acked message came back"
    );
    let max = tokens.iter().max().copied().unwrap();
    match b
        .try_pop(&name, Lane::Main, &OwnerToken::random(), LONG, &cfg)
        .await
        .unwrap()
    {
        PopAttempt::Delivered { message, token } => {
            assert_eq!(message.id, kept);
            assert!(
                token > max,
                "a token after the crash ({token:?}) is not above those before it ({tokens:?})"
            );
        }
        other => panic!("{other:?}"),
    }
}
