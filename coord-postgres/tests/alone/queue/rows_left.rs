//! What a queue leaves in the store: no rows once acked or purged, and
//! nothing written by a pop that finds nothing.

use std::time::{Duration, Instant};

use conformance::testkit::postgres::cluster;
use coord_core::{Lane, MessageId, OwnerToken, PopAttempt, PushOptions, Queue, QueueConfig};
use coord_postgres::PostgresBackend;

use super::{LONG, backend, msg, rows, unique};

async fn pop(b: &PostgresBackend, q: &str, lane: Lane, cfg: &QueueConfig) -> PopAttempt {
    b.try_pop(q, lane, &OwnerToken::random(), LONG, cfg)
        .await
        .unwrap()
}

/// Acked messages (of groups, delayed, nacked, dead-lettered and
/// redriven) leave no message or group row; dedup ids stay until
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
    assert_eq!(rows(&b).await, [6, 3, 6]);
    // One nacked (to the dead lane at its next delivery), then redriven.
    let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    d.nack(Duration::ZERO).await.unwrap();
    let mut acked = 0;
    while let Some(d) = q.pop(&name, LONG, Duration::from_secs(1)).await.unwrap() {
        d.ack().await.unwrap();
        acked += 1;
    }
    assert_eq!(acked, 5);
    assert_eq!(rows(&b).await, [1, 1, 6], "only the dead letter is left");
    assert_eq!(q.redrive(&name, 10).await.unwrap(), 1);
    let d = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    d.ack().await.unwrap();
    assert_eq!(rows(&b).await, [0, 0, 6], "acked messages left rows");
    b.sweep().await.unwrap();
    assert_eq!(rows(&b).await[2], 6, "the sweep deleted live dedup ids");
    tokio::time::sleep_until((pushed + window + grace + Duration::from_millis(100)).into()).await;
    assert!(b.sweep().await.unwrap() >= 6);
    assert_eq!(rows(&b).await, [0, 0, 0], "expired dedup ids were kept");

    // A purge: every row at once, whatever the messages' state.
    for i in 0..50u8 {
        let opts = PushOptions::new()
            .group(format!("g{}", i % 4))
            .dedup_id(format!("p{i}"));
        q.push_with(&name, [i], &opts).await.unwrap();
    }
    let held = q.pop(&name, LONG, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(q.purge(&name).await.unwrap(), 50);
    assert_eq!(rows(&b).await, [0, 0, 0], "a purge left rows");
    assert!(held.ack().await.is_err(), "an ack after the purge");
    let again = q.push(&name, b"again").await.unwrap();
    assert!(
        again > last,
        "ids rise for a queue name whose rows went away"
    );
    q.purge(&name).await.unwrap();
    assert_eq!(rows(&b).await, [0, 0, 0]);
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
    let delayed = msg(b"later", None).delayed(LONG);
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
    assert_eq!(rows(&b).await, [0, 0, 0]);
}
