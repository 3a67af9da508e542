//! Names and queues whose ranges hold more than one gRPC answer's worth of
//! keys (gRPC's default limit is 4 MiB): a semaphore with thousands of
//! grants under a long name still grants, lists, releases (also through a
//! client with no record of the grant) and starts its watch, and a queue
//! with thousands of delayed messages with long names still counts them.
//! Every range read is paged or count-only.

use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance::testkit::etcd;
use coord_core::{Attempt, OwnerToken, PermitRequest, PushOptions, Semaphore};
use coord_etcd::{EtcdBackend, EtcdOptions};
use etcd_client::{Client, Txn, TxnOp};

/// Grants written beside the test's own: with a 500-byte name, their
/// keys and values (about 5 MiB) and slot keys (about 4.5 MiB) are each
/// more than one default-sized answer.
const HELD: u32 = 8_000;

/// Puts per transaction (etcd's default limit is 128 operations).
const BATCH: usize = 100;

fn prefix(case: &str) -> String {
    format!("large-{case}-{}/", std::process::id())
}

async fn backend(prefix: &str) -> Arc<EtcdBackend> {
    let url = format!("{}?prefix={prefix}", etcd::shared().url());
    EtcdBackend::connect(EtcdOptions::parse(&url).unwrap())
        .await
        .expect("connect to the test etcd")
}

async fn raw() -> Client {
    Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap()
}

/// Write `kvs` in transactions of [`BATCH`] puts, a few at a time.
async fn put_all(kvs: Vec<(Vec<u8>, Vec<u8>)>) {
    let c = raw().await;
    let batches: Vec<Vec<(Vec<u8>, Vec<u8>)>> = kvs.chunks(BATCH).map(<[_]>::to_vec).collect();
    for group in batches.chunks(8) {
        futures::future::join_all(group.iter().map(|b| {
            let mut kv = c.kv_client();
            let ops: Vec<TxnOp> = b
                .iter()
                .map(|(k, v)| TxnOp::put(k.clone(), v.clone(), None))
                .collect();
            async move { kv.txn(Txn::new().and_then(ops)).await.unwrap() }
        }))
        .await;
    }
}

/// [`HELD`] grants of one permit each (one per owner, slot `i` for the
/// `i`th) on semaphore `name` of `total` permits, in the layout coord
/// writes (`semaphore.rs`): `h/<lease hex>` with the owner, permits,
/// total and slots, and `s/<i>` with the owner.
async fn hold_many(prefix: &str, name: &str, total: u32) {
    let base = format!("{prefix}sem/{name}/");
    let mut kvs = Vec::new();
    for i in 0..HELD {
        let owner = format!("{:032x}", 0xabc0_0000u64 + u64::from(i));
        let lease = 0x7000_0000_0000_0000u64 + u64::from(i);
        kvs.push((
            format!("{base}h/{lease:x}").into_bytes(),
            format!("{owner} 1 {total} {i}").into_bytes(),
        ));
        kvs.push((format!("{base}s/{i}").into_bytes(), owner.into_bytes()));
    }
    put_all(kvs).await;
}

fn request(total: u32, queue: bool) -> PermitRequest {
    PermitRequest {
        permits: 1,
        total,
        ttl: Duration::from_secs(30),
        queue,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_with_thousands_of_grants_under_a_long_name_still_works() {
    let p = prefix("sem");
    let name = "n".repeat(500);
    let total = HELD + 2;
    hold_many(&p, &name, total).await;
    let (a, b) = (backend(&p).await, backend(&p).await);
    let o = OwnerToken::random();
    // An attempt reads every grant, waiter and slot of the name.
    let first = Semaphore::try_acquire(&*a, &name, o.step(), &request(total, false))
        .await
        .expect("an attempt on a name with many grants");
    assert!(matches!(first, Attempt::Granted(_)), "{first:?}");
    // inspect lists every grant.
    let record = Semaphore::inspect(&*a, &name).await.expect("inspect");
    assert_eq!(record.holders.len(), HELD as usize + 1);
    assert_eq!(record.waiters, Some(0));
    // A client with no record of the grant finds it by its value.
    assert!(
        Semaphore::release(&*b, &name, o.step())
            .await
            .expect("a release found by the owner's value")
    );
    // Full but for one permit: the next owner gets it, the one after it
    // queues, and a waiter's watch loads the whole name first.
    let (o2, o3) = (OwnerToken::random(), OwnerToken::random());
    let two = Semaphore::try_acquire(&*a, &name, o2.step(), &request(total, false))
        .await
        .unwrap();
    assert!(matches!(two, Attempt::Granted(_)), "{two:?}");
    let two_more = Semaphore::try_acquire(&*a, &name, o3.step(), &request(total, false))
        .await
        .unwrap();
    assert!(matches!(two_more, Attempt::Granted(_)), "{two_more:?}");
    let o4 = OwnerToken::random();
    let since = Instant::now();
    let _waiter = Semaphore::subscribe(&*b, &name, &o4).await.unwrap();
    // The subscription waits for the watch's first read (at most the call
    // timeout, 5 s by default, when that read fails).
    assert!(
        since.elapsed() < Duration::from_secs(4),
        "the watch's first read took {:?}",
        since.elapsed()
    );
    let queued = Semaphore::try_acquire(&*b, &name, o4.step(), &request(total, true))
        .await
        .unwrap();
    assert!(matches!(queued, Attempt::Held { .. }), "{queued:?}");
    assert_eq!(
        Semaphore::inspect(&*a, &name).await.unwrap().waiters,
        Some(1)
    );
    assert!(Semaphore::release(&*a, &name, o2.step()).await.unwrap());
    let granted = Semaphore::try_acquire(&*b, &name, o4.step(), &request(total, true))
        .await
        .unwrap();
    assert!(matches!(granted, Attempt::Granted(_)), "{granted:?}");
    for o in [&o3, &o4] {
        assert!(Semaphore::release(&*a, &name, o.step()).await.unwrap());
    }
    assert!(Semaphore::force_release(&*a, &name).await.unwrap());
    assert!(
        Semaphore::inspect(&*a, &name)
            .await
            .unwrap()
            .holders
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_stats_count_thousands_of_delayed_messages_with_long_names() {
    let p = prefix("queue");
    let c = coord_etcd::connect(&format!("{}?prefix={p}", etcd::shared().url()))
        .await
        .expect("connect to the test etcd");
    let q = c.queues().unwrap();
    let queue = "q".repeat(500);
    // Each delayed message's timeline entry: a key of about 570 bytes, a
    // value naming its group (500 bytes): about 6 MiB in all.
    const DELAYED: usize = 6_000;
    let opts = PushOptions::new()
        .delay(Duration::from_secs(600))
        .group("g".repeat(500));
    let pushes: Vec<usize> = (0..DELAYED).collect();
    for group in pushes.chunks(64) {
        futures::future::join_all(group.iter().map(|i| {
            let (q, queue, opts) = (&q, &queue, &opts);
            async move { q.push_with(queue, format!("{i}"), opts).await.unwrap() }
        }))
        .await;
    }
    q.push(&queue, b"now").await.unwrap();
    let s = q.stats(&queue).await.expect("stats of a long queue");
    assert_eq!(s.delayed, DELAYED as u64);
    assert_eq!(s.ready, 1);
    assert_eq!(s.in_flight, 0);
    assert_eq!(s.dead, 0);
    assert_eq!(q.purge(&queue).await.unwrap(), DELAYED as u64 + 1);
}
