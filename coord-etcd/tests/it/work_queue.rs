//! The etcd work queue's own tests, against a real etcd: the key layout,
//! bounded state (an acked, redriven or purged queue leaves no keys), bytes
//! stored as they are, wake-ups from another client, concurrent consumers
//! (exactly once; ordered groups one at a time), and durability across a
//! restart of etcd (the message survives, the next token is higher).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::testkit::etcd::{self, EtcdServer};
use coord_core::{
    Coord, FencingToken, Lane, NewMessage, OwnerToken, PopAttempt, PopOptions, PushOptions,
    QueueConfig, Queues,
};
use etcd_client::{GetOptions, KeyValue};
use tokio::time::{Instant, sleep};

const LONG: Duration = Duration::from_secs(30);

async fn client_at(url: &str, prefix: &str) -> Coord {
    coord_etcd::connect(&format!("{url}?prefix={prefix}"))
        .await
        .expect("connect to the test etcd")
        .with_poll_interval(Duration::from_secs(60))
}

async fn client(prefix: &str) -> Coord {
    client_at(&etcd::shared().url(), prefix).await
}

/// Every key under `prefix`.
async fn keys(prefix: &str) -> Vec<KeyValue> {
    let mut raw = etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap();
    raw.get(prefix.as_bytes(), Some(GetOptions::new().with_prefix()))
        .await
        .unwrap()
        .take_kvs()
}

/// The queue keys under `prefix` (`<prefix>wq/...`), without the prefix,
/// sorted. The only other key pushes write is `<prefix>fence/`, the one
/// counter of message ids and fencing tokens of the whole prefix.
async fn names(prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = keys(&format!("{prefix}wq/"))
        .await
        .iter()
        .map(|kv| kv.key_str().unwrap()[prefix.len()..].to_string())
        .collect();
    v.sort();
    v
}

fn message(payload: &[u8]) -> NewMessage<'_> {
    NewMessage::new(payload)
}

fn id20(n: u64) -> String {
    format!("{n:020}")
}

#[tokio::test]
async fn layout_is_records_lists_and_indexes_and_the_token_is_the_revision() {
    let prefix = format!("wqlayout-{}/", std::process::id());
    let c = client(&prefix).await;
    let raw = c.raw_queue().unwrap();
    let id = raw.push("jobs", &message(b"x")).await.unwrap().id.get();
    let i = id20(id);
    let z = id20(1);
    assert_eq!(
        names(&prefix).await,
        vec![
            format!("wq/jobs/a/M/_/{i}"),
            "wq/jobs/g/M/_".to_string(),
            "wq/jobs/h/M/_".to_string(),
            format!("wq/jobs/i/M/o/{z}/{i}"),
            format!("wq/jobs/i/M/u/{z}/{i}"),
            format!("wq/jobs/m/M/{i}"),
            format!("wq/jobs/p/M/{i}"),
            format!("wq/jobs/r/M/_/{i}"),
        ],
        "a ready message in the group \"\" of a new lane (turn 1: after the clock, 0)"
    );
    let value = |kvs: &[KeyValue], tail: &str| {
        kvs.iter()
            .find(|kv| kv.key_str().unwrap().ends_with(tail))
            .map(|kv| kv.value_str().unwrap().to_string())
    };
    let kvs = keys(&format!("{prefix}wq/")).await;
    assert_eq!(
        value(&kvs, "g/M/_").as_deref(),
        Some(format!("1 {id}").as_str()),
        "the group record: turn, lowest ready id"
    );
    assert_eq!(value(&kvs, "h/M/_"), Some(i.clone()), "the group's head");
    let me = OwnerToken::random();
    let got = raw
        .try_pop("jobs", Lane::Main, &me, LONG, &QueueConfig::default())
        .await
        .unwrap();
    let PopAttempt::Delivered { message, token } = got else {
        panic!("no delivery: {got:?}");
    };
    assert_eq!(message.id.get(), id);
    let kvs = keys(&format!("{prefix}wq/")).await;
    let meta = kvs
        .iter()
        .find(|kv| kv.key_str().unwrap().ends_with(&format!("m/M/{i}")))
        .unwrap();
    assert_eq!(
        meta.mod_revision() as u64,
        token.get(),
        "the token is the revision of the delivering transaction"
    );
    let got = names(&prefix).await;
    assert!(
        got.contains(&"wq/jobs/c/M".to_string())
            && got.iter().any(|k| k.starts_with("wq/jobs/i/M/t/"))
            && !got
                .iter()
                .any(|k| k.starts_with("wq/jobs/r/") || k.starts_with("wq/jobs/i/M/u/")),
        "in flight: on the timeline, off the ready list and the index; the clock set: {got:?}"
    );
    assert!(raw.ack("jobs", Lane::Main, message.id, &me).await.unwrap());
    assert!(names(&prefix).await.is_empty(), "an ack left keys");
}

#[tokio::test]
async fn acked_redriven_and_purged_queues_leave_no_keys() {
    let prefix = format!("wqidle-{}/", std::process::id());
    let c = client(&prefix).await;
    let q = c
        .queues()
        .unwrap()
        .with_config(QueueConfig::default().max_deliveries(1));
    // Several groups, a delayed message, a nack, a dead letter redriven.
    for i in 0..6 {
        let opts = PushOptions::new().group(format!("g{}", i % 3));
        q.push_with("a", format!("m{i}"), &opts).await.unwrap();
    }
    let delay = Duration::from_millis(300);
    q.push_with("a", b"later", &PushOptions::new().delay(delay))
        .await
        .unwrap();
    let first = q.pop("a", LONG, Duration::ZERO).await.unwrap().unwrap();
    first.nack(Duration::ZERO).await.unwrap();
    // The nacked one is dead at its next delivery; the rest are delivered.
    let mut done = 0;
    while let Some(d) = q.pop("a", LONG, Duration::from_secs(2)).await.unwrap() {
        d.ack().await.unwrap();
        done += 1;
    }
    assert_eq!(done, 6);
    assert_eq!(q.stats("a").await.unwrap().dead, 1);
    assert_eq!(q.redrive("a", 10).await.unwrap(), 1);
    let d = q.pop("a", LONG, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(d.attempts(), 1);
    d.ack().await.unwrap();
    assert_eq!(q.stats("a").await.unwrap(), Default::default());
    assert_eq!(
        names(&prefix).await,
        Vec::<String>::new(),
        "a drained queue left keys"
    );
    // A purged queue with messages in every state.
    for i in 0..5 {
        q.push_with("b", format!("{i}"), &PushOptions::new().group("x"))
            .await
            .unwrap();
    }
    q.push_with("b", b"d", &PushOptions::new().delay(LONG))
        .await
        .unwrap();
    let held = q.pop("b", LONG, Duration::ZERO).await.unwrap().unwrap();
    let with_dedup = PushOptions::new().dedup_id("once");
    q.push_with("b", b"dd", &with_dedup).await.unwrap();
    assert!(!names(&prefix).await.is_empty());
    assert_eq!(q.purge("b").await.unwrap(), 7);
    assert!(
        names(&prefix).await.is_empty(),
        "a purge left keys (dedup ids included)"
    );
    assert!(held.ack().await.is_err(), "an ack after a purge succeeded");
}

#[tokio::test]
async fn a_dedup_id_is_on_a_lease_that_outlives_its_window() {
    let prefix = format!("wqdedup-{}/", std::process::id());
    let c = client(&prefix).await;
    let q = c.queues().unwrap();
    let window = Duration::from_secs(2);
    let opts = PushOptions::new().dedup_id("k").dedup_window(window);
    let first = q.push_with("d", b"1", &opts).await.unwrap();
    let d = q.pop("d", LONG, Duration::ZERO).await.unwrap().unwrap();
    d.ack().await.unwrap();
    let kvs = keys(&format!("{prefix}wq/")).await;
    assert_eq!(kvs.len(), 1, "only the dedup id stays after the ack");
    let lease = kvs[0].lease();
    assert!(lease != 0, "the dedup id is not on a lease");
    let mut raw = etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap();
    let ttl = raw.lease_time_to_live(lease, None).await.unwrap().ttl();
    assert!(
        ttl >= window.as_secs() as i64,
        "the lease ({ttl} s) ends before the window ({window:?})"
    );
    let again = q.push_with("d", b"2", &opts).await.unwrap();
    assert_eq!((again.id, again.duplicate), (first.id, true));
    // Gone with its lease: at most the window, two call timeouts and 3 s
    // after the push.
    let until =
        Instant::now() + window + 2 * coord_etcd::DEFAULT_CALL_TIMEOUT + Duration::from_secs(5);
    while !names(&prefix).await.is_empty() {
        assert!(Instant::now() < until, "the dedup id outlived its lease");
        sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn payloads_with_every_byte_value_come_back_unchanged() {
    let prefix = format!("wqbytes-{}/", std::process::id());
    let c = client(&prefix).await;
    let q = c.queues().unwrap();
    let mut all: Vec<u8> = (0..=255u8).collect();
    all.extend((0..=255u8).rev());
    all.extend(b"|1|2|3|R|\n\0%2F/");
    let id = q.push("bytes", &all).await.unwrap();
    let peeked = q.peek("bytes", Lane::Main, 10).await.unwrap();
    assert_eq!(peeked.len(), 1);
    assert!(peeked[0].payload == all, "peek changed the payload");
    let d = q.pop("bytes", LONG, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(d.id(), id);
    assert!(d.payload() == &all[..], "the payload came back changed");
    d.ack().await.unwrap();
    // Group names and dedup ids with the characters keys are made of.
    let odd = PushOptions::new().group("a/b%2F c|1").dedup_id("x/y%");
    q.push_with("bytes", b"odd", &odd).await.unwrap();
    let d = q.pop("bytes", LONG, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(d.group(), Some("a/b%2F c|1"));
    d.ack().await.unwrap();
    q.purge("bytes").await.unwrap();
}

#[tokio::test]
async fn a_waiting_pop_is_woken_by_another_clients_push() {
    let prefix = format!("wqwake-{}/", std::process::id());
    let (waiter, pusher) = (client(&prefix).await, client(&prefix).await);
    let qw = waiter.queues().unwrap();
    let qp = pusher.queues().unwrap();
    for round in 0..3 {
        let qw2 = qw.clone();
        let task = tokio::spawn(async move { qw2.pop("w", LONG, Duration::from_secs(20)).await });
        sleep(Duration::from_millis(400)).await;
        let body = format!("wake {round}");
        qp.push("w", &body).await.unwrap();
        // From the push's reply: a poll (60 s, jittered: 30 s at the
        // soonest) comes after the pop's 20 s wait; a woken pop within a
        // few seconds however loaded the machine.
        let pushed = Instant::now();
        let d = task.await.unwrap().unwrap().expect("woken with the push");
        let took = pushed.elapsed();
        assert!(
            took < Duration::from_secs(3),
            "round {round}: the push reached the waiter {took:?} after its reply (polling is 60 s)"
        );
        assert_eq!(d.payload(), body.as_bytes());
        d.ack().await.unwrap();
    }
    // A delayed push wakes the waiter too: it learns when the message is
    // due instead of at its next poll.
    let qw2 = qw.clone();
    let task = tokio::spawn(async move { qw2.pop("w", LONG, Duration::from_secs(20)).await });
    sleep(Duration::from_millis(400)).await;
    let delay = Duration::from_millis(800);
    // Not due before the push was sent; due a delay after its reply at
    // the latest, and then delivered within a few seconds (not at a poll).
    let sent = Instant::now();
    qp.push_with("w", b"late", &PushOptions::new().delay(delay))
        .await
        .unwrap();
    let answered = Instant::now();
    let d = task.await.unwrap().unwrap().expect("the delayed message");
    let (since_sent, since_answered) = (sent.elapsed(), answered.elapsed());
    assert!(
        since_sent + Duration::from_millis(50) >= delay
            && since_answered < delay + Duration::from_secs(3),
        "a message delayed {delay:?} came {since_sent:?} after the push was sent, \
         {since_answered:?} after its reply"
    );
    d.ack().await.unwrap();
}

/// Called at a delivery (`true`) and before its ack (`false`).
type Check = Arc<dyn Fn(&coord_core::Delivery, bool) + Send + Sync>;

/// `consumers` consumers on their own clients take every message of `name`
/// (acking each after `work`), checking with `check` before the ack; the
/// deliveries (payload, token).
async fn drain(
    prefix: &str,
    name: &str,
    consumers: usize,
    config: QueueConfig,
    work: Duration,
    check: Check,
) -> Vec<(String, FencingToken)> {
    let mut qs: Vec<Queues> = Vec::new();
    for _ in 0..consumers {
        qs.push(client(prefix).await.queues().unwrap().with_config(config));
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for q in qs {
        let (name, seen, check) = (name.to_string(), seen.clone(), check.clone());
        tasks.push(tokio::spawn(async move {
            while let Some(d) = q
                .pop(&name, LONG, Duration::from_millis(500))
                .await
                .expect("a pop among many consumers")
            {
                assert_eq!(d.attempts(), 1, "a message was delivered again");
                check(&d, true);
                let body = String::from_utf8(d.payload().to_vec()).unwrap();
                seen.lock().unwrap().push((body, d.fencing_token()));
                sleep(work).await;
                check(&d, false);
                d.ack().await.expect("the ack of a live delivery");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    seen.lock().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_pops_never_deliver_a_message_twice() {
    let prefix = format!("wqonce-{}/", std::process::id());
    let q = client(&prefix).await.queues().unwrap();
    const N: usize = 120;
    for i in 0..N {
        let opts = PushOptions::new().group(format!("g{}", i % 3));
        q.push_with("once", format!("m{i}"), &opts).await.unwrap();
    }
    let none = Arc::new(|_: &coord_core::Delivery, _: bool| {});
    let seen = drain(
        &prefix,
        "once",
        10,
        QueueConfig::default(),
        Duration::ZERO,
        none,
    )
    .await;
    let bodies: HashSet<&String> = seen.iter().map(|(b, _)| b).collect();
    assert_eq!(seen.len(), N, "{} deliveries of {N} messages", seen.len());
    assert_eq!(bodies.len(), N, "a message was delivered twice");
    let tokens: HashSet<FencingToken> = seen.iter().map(|(_, t)| *t).collect();
    assert_eq!(tokens.len(), N, "two deliveries shared a fencing token");
    assert!(names(&prefix).await.is_empty(), "keys left after the acks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_pops_of_ordered_groups_hold_one_message_per_group() {
    let prefix = format!("wqordered-{}/", std::process::id());
    let q = client(&prefix).await.queues().unwrap();
    const N: usize = 60;
    for i in 0..N {
        let opts = PushOptions::new().group(format!("g{}", i % 4));
        q.push_with("ord", format!("g{}/{i}", i % 4), &opts)
            .await
            .unwrap();
    }
    // Group -> (in flight now, the payloads in delivery order).
    type Groups = HashMap<String, (bool, Vec<usize>)>;
    let groups: Arc<Mutex<Groups>> = Arc::default();
    let g2 = groups.clone();
    let check = Arc::new(move |d: &coord_core::Delivery, start: bool| {
        let g = d.group().unwrap().to_string();
        let n: usize = String::from_utf8_lossy(d.payload())
            .split('/')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let mut m = g2.lock().unwrap();
        let e = m.entry(g.clone()).or_default();
        if start {
            assert!(!e.0, "two messages of ordered group {g} in flight at once");
            e.0 = true;
            e.1.push(n);
        } else {
            e.0 = false;
        }
    });
    let ordered = QueueConfig::default().ordered_groups(true);
    let seen = drain(&prefix, "ord", 8, ordered, Duration::from_millis(5), check).await;
    assert_eq!(seen.len(), N);
    for (g, (_, order)) in groups.lock().unwrap().iter() {
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "group {g} out of order: {order:?}"
        );
    }
    assert!(names(&prefix).await.is_empty(), "keys left after the acks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_survive_an_etcd_restart_and_tokens_keep_rising() {
    let server = Arc::new(EtcdServer::start());
    let prefix = "wqrestart/";
    let c = client_at(&server.url(), prefix).await;
    let q = c.queues().unwrap();
    q.push("r", b"first").await.unwrap();
    let id = q.push("r", b"second").await.unwrap();
    q.push_with(
        "r",
        b"third",
        &PushOptions::new().delay(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let d = q.pop("r", LONG, Duration::ZERO).await.unwrap().unwrap();
    let t1 = d.fencing_token();
    d.ack().await.unwrap();
    // In flight when etcd dies, its visibility lapses meanwhile.
    let vis = Duration::from_secs(1);
    let lapsing = q
        .pop_with("r", PopOptions::new(vis))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(lapsing.id(), id);
    let lapses = Instant::now() + vis;
    let t2 = lapsing.fencing_token();
    assert!(t2 > t1);
    std::mem::forget(lapsing);
    let s = server.clone();
    tokio::task::spawn_blocking(move || {
        s.kill();
        s.start_again();
    })
    .await
    .unwrap();
    // Both are due when the restarted store is asked (the delayed one came
    // due before the delivery lapsed): the lower id goes first.
    tokio::time::sleep_until(lapses + Duration::from_millis(200)).await;
    let mut got = Vec::new();
    while got.len() < 2 {
        match q.pop("r", LONG, Duration::from_secs(10)).await {
            Ok(Some(d)) => got.push(d),
            Ok(None) => panic!("the messages did not survive the restart"),
            Err(e) if e.is_retryable() => sleep(Duration::from_millis(200)).await,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(
        (got[0].id(), got[0].payload(), got[0].attempts()),
        (id, &b"second"[..], 2),
        "the lapsed delivery comes back first, its attempt counted"
    );
    assert_eq!(got[1].payload(), b"third");
    assert!(
        got[0].fencing_token() > t2 && got[1].fencing_token() > got[0].fencing_token(),
        "tokens after the restart ({}, {}) not above {t2}",
        got[0].fencing_token(),
        got[1].fencing_token()
    );
    for d in got {
        d.ack().await.unwrap();
    }
    assert_eq!(q.stats("r").await.unwrap(), Default::default());
}

/// Random pushes, pops of both lanes (ordered or not, dead-lettering or
/// not), acks, nacks, acks by the wrong consumer and redrives: every
/// delivery is the one coord-core's queue state machine picks, and stats
/// and peeks agree with it (`conformance::queue_rule`).
#[tokio::test]
async fn deliveries_follow_the_rule_as_the_state_machine_does() {
    let prefix = format!("wqrule-{}/", std::process::id());
    let raw = client(&prefix).await.raw_queue().unwrap();
    conformance::queue_rule::deliveries_follow_the_state_machine(
        raw,
        coord_core::queue_state::Turns::PerGroup,
        600,
        async |_| {},
    )
    .await;
}
