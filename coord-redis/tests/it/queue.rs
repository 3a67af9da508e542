//! Redis work queues beyond the shared cases: what stays in Redis (nothing
//! once acked or purged), the request count of an uncontended push, pop
//! and ack, binary payloads, names with braces, a pop woken by another
//! client's push (and no `PUBLISH` while nobody waits), fencing tokens and
//! ids after the server lost its data, a mass lapse larger than one step's
//! batch, lost keys, the delivery rule against a model of it, and some
//! shared queue cases in the PHP layout.

use crate::common;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use common::{SEC, eventually, unique};
use conformance::testkit::redis::{self as kit, CountingProxy, RedisServer};
use conformance::testkit::wait::until;
use coord_core::{
    Lane, MessageId, NewMessage, OwnerToken, PopAttempt, PushOptions, Queue, QueueConfig,
};
use coord_redis::{RedisBackend, RedisOptions};
use tokio::time::{Instant, sleep, timeout};

const MS: Duration = Duration::from_millis(1);
const LONG: Duration = Duration::from_secs(60);

async fn backend(url: &str) -> RedisBackend {
    RedisBackend::connect(RedisOptions::new(url))
        .await
        .expect("connect")
}

fn dbsize(server: &RedisServer) -> i64 {
    server.command(&["DBSIZE"]).as_int().unwrap()
}

fn keys(server: &RedisServer) -> Vec<String> {
    match server.command(&["KEYS", "*"]) {
        kit::Resp::Array(Some(items)) => items
            .iter()
            .filter_map(|k| k.as_str().map(str::to_string))
            .collect(),
        other => panic!("KEYS: {other:?}"),
    }
}

/// How many times the server ran `cmd` (scripts' calls included).
fn calls(server: &RedisServer, cmd: &str) -> i64 {
    server
        .info("commandstats", &format!("cmdstat_{cmd}"))
        .split(',')
        .find_map(|f| f.strip_prefix("calls="))
        .map_or(0, |n| n.parse().unwrap())
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

/// The id and token of a delivery; panics on an empty attempt.
fn delivered(a: PopAttempt) -> (coord_core::Message, u64) {
    match a {
        PopAttempt::Delivered { message, token } => (message, token.get()),
        other => panic!("expected a delivery, got {other:?}"),
    }
}

#[tokio::test]
async fn an_acked_or_purged_queue_leaves_no_keys() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let cfg = QueueConfig::default().max_deliveries(1);
    let me = OwnerToken::random();

    // Acked: nothing left at once.
    let name = unique("q-keys");
    let id = b.push(&name, &msg(b"x", Some("g"))).await.unwrap().id;
    assert!(dbsize(&server) > 0);
    let (m, _) = delivered(b.try_pop(&name, Lane::Main, &me, LONG, &cfg).await.unwrap());
    assert_eq!(m.id, id);
    assert!(b.ack(&name, Lane::Main, id, &me).await.unwrap());
    assert_eq!(
        dbsize(&server),
        0,
        "an acked queue left {:?}",
        keys(&server)
    );

    // Every state at once (ready, delayed, in flight, dead, several
    // groups), then purged: nothing left.
    for i in 0..20u8 {
        let group = ["a", "b", "c"][i as usize % 3];
        let body = [i];
        let m = NewMessage {
            delay: if i % 4 == 0 { 10 * SEC } else { Duration::ZERO },
            ..msg(&body, Some(group))
        };
        b.push(&name, &m).await.unwrap();
    }
    for _ in 0..6 {
        let (m, _) = delivered(b.try_pop(&name, Lane::Main, &me, LONG, &cfg).await.unwrap());
        assert!(
            b.nack(&name, Lane::Main, m.id, &me, Duration::ZERO)
                .await
                .unwrap()
        );
    }
    delivered(b.try_pop(&name, Lane::Main, &me, LONG, &cfg).await.unwrap());
    delivered(b.try_pop(&name, Lane::Dead, &me, LONG, &cfg).await.unwrap());
    let s = b.stats(&name).await.unwrap();
    assert_eq!((s.delayed, s.in_flight, s.dead), (5, 1, 6), "{s:?}");
    assert_eq!(b.purge(&name).await.unwrap(), 20);
    assert_eq!(
        dbsize(&server),
        0,
        "a purged queue left {:?}",
        keys(&server)
    );
    assert_eq!(b.stats(&name).await.unwrap(), Default::default());

    // A dedup id outlives its message for its window, on a TTL, and only it.
    let d = NewMessage {
        dedup_id: Some("once"),
        dedup_window: 700 * MS,
        ..msg(b"d", None)
    };
    let id = b.push(&name, &d).await.unwrap().id;
    let (m, _) = delivered(b.try_pop(&name, Lane::Main, &me, LONG, &cfg).await.unwrap());
    assert!(b.ack(&name, Lane::Main, m.id, &me).await.unwrap());
    let left = keys(&server);
    assert_eq!(left.len(), 2, "{left:?}");
    for k in &left {
        assert!(k.contains(":dedup"), "{k}");
        let ttl = server.command(&["PTTL", k]).as_int().unwrap();
        assert!(ttl > 0 && ttl <= 701, "{k}: PTTL {ttl}");
    }
    let again = b.push(&name, &d).await.unwrap();
    assert!(again.duplicate && again.id == id);
    sleep(800 * MS).await;
    // KEYS leaves out keys whose TTL ran out (DBSIZE counts them until
    // active expiry reaps them, later on a loaded machine).
    let left = keys(&server);
    assert!(left.is_empty(), "{left:?}");

    // A waiting pop on an empty queue leaves its mark on a TTL only.
    let coord = backend(&server.url()).await.into_coord();
    let q = coord.queues().unwrap();
    assert!(q.pop(&name, LONG, 300 * MS).await.unwrap().is_none());
    let left = keys(&server);
    assert_eq!(left.len(), 1, "{left:?}");
    let ttl = server.command(&["PTTL", &left[0]]).as_int().unwrap();
    // 60 s, rounded up to the next millisecond (`tidy` sets floor + 1 ms so
    // the key outlives the mark): 60,001 when read within the millisecond.
    assert!(ttl > 0 && ttl <= 60_001, "the mark's PTTL {ttl}");
}

#[tokio::test]
async fn uncontended_push_pop_and_ack_cost_one_request_each() {
    let proxy = CountingProxy::start(kit::server().port());
    let q = backend(&proxy.url()).await.into_coord().queues().unwrap();
    let name = unique("q-requests");
    // Warm up (first use of the connection).
    q.push(&name, b"warm").await.unwrap();
    q.pop(&name, LONG, Duration::ZERO)
        .await
        .unwrap()
        .unwrap()
        .ack()
        .await
        .unwrap();
    for i in 0..3 {
        let mut sent = Vec::new();
        let before = proxy.command_names().len();
        q.push(&name, format!("m{i}")).await.unwrap();
        sent.push(proxy.command_names()[before..].to_vec());
        let before = proxy.command_names().len();
        let d = q.pop(&name, LONG, SEC).await.unwrap().expect("a message");
        sent.push(proxy.command_names()[before..].to_vec());
        let before = proxy.command_names().len();
        d.ack().await.unwrap();
        sent.push(proxy.command_names()[before..].to_vec());
        for (op, names) in ["push", "pop", "ack"].iter().zip(&sent) {
            assert_eq!(names, &["EVALSHA"], "{op} sent {names:?}");
        }
    }
}

#[tokio::test]
async fn payloads_with_every_byte_value_round_trip() {
    let b = backend(&kit::url()).await;
    let name = unique("q-bytes");
    let me = OwnerToken::random();
    let every: Vec<u8> = (0..=255u8).cycle().take(256 * 3).collect();
    let tricky: &[&[u8]] = &[
        &every,
        b"",
        b"\0",
        b"%d %s [^]*$ \\0",
        b"a:b:c:d",
        &[0xff; 17],
    ];
    let group = "t\u{e9}nant:7 {x}";
    for p in tricky {
        b.push(&name, &msg(p, Some(group))).await.unwrap();
    }
    let peeked = b.peek(&name, Lane::Main, 100).await.unwrap();
    assert_eq!(peeked.len(), tricky.len());
    for (m, p) in peeked.iter().zip(tricky) {
        assert_eq!(&m.payload[..], *p, "peek changed a payload");
        assert_eq!(m.group.as_deref(), Some(group));
    }
    let cfg = QueueConfig::default();
    for p in tricky {
        let (m, _) = delivered(b.try_pop(&name, Lane::Main, &me, LONG, &cfg).await.unwrap());
        assert_eq!(&m.payload[..], *p, "a delivery changed a payload");
        assert_eq!(m.group.as_deref(), Some(group));
        assert!(b.ack(&name, Lane::Main, m.id, &me).await.unwrap());
    }
}

#[tokio::test]
async fn names_with_braces_work_and_keep_one_hash_slot() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let me = OwnerToken::random();
    let cfg = QueueConfig::default();
    let names = ["{", "}", "a}{b", "{x}", "%7D", "}}{{:main:meta"];
    for name in names {
        b.push(name, &msg(name.as_bytes(), Some("}{")))
            .await
            .unwrap();
        b.push(name, &msg(b"delayed", None).delayed(10 * SEC))
            .await
            .unwrap();
    }
    // Each name's keys share one hash tag (so one Cluster slot), and no two
    // names share a key.
    let mut tags: HashMap<String, usize> = HashMap::new();
    for k in keys(&server) {
        let open = k.find('{').expect("a hash tag");
        let close = open + k[open..].find('}').expect("a closed hash tag");
        *tags.entry(k[open + 1..close].to_string()).or_default() += 1;
    }
    assert_eq!(tags.len(), names.len(), "{tags:?}");
    for name in names {
        let (m, _) = delivered(b.try_pop(name, Lane::Main, &me, LONG, &cfg).await.unwrap());
        assert_eq!(m.payload, name.as_bytes());
        assert_eq!(m.group.as_deref(), Some("}{"));
        assert!(b.ack(name, Lane::Main, m.id, &me).await.unwrap());
        let s = b.stats(name).await.unwrap();
        assert_eq!((s.ready, s.delayed), (0, 1), "{name}: {s:?}");
        assert_eq!(b.purge(name).await.unwrap(), 1);
    }
    assert_eq!(dbsize(&server), 0);
}

trait Delayed {
    fn delayed(self, d: Duration) -> Self;
}

impl Delayed for NewMessage<'_> {
    fn delayed(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }
}

#[tokio::test]
async fn a_pop_is_woken_by_another_clients_push_and_nobody_waiting_costs_no_publish() {
    let server = RedisServer::start();
    let pusher = backend(&server.url()).await.into_coord().queues().unwrap();
    let waiter = backend(&server.url())
        .await
        .into_coord()
        .with_poll_interval(Duration::from_secs(30))
        .queues()
        .unwrap();
    let name = unique("q-wake");
    let pubs = calls(&server, "publish");
    for _ in 0..3 {
        pusher.push(&name, b"nobody waits").await.unwrap();
        let d = pusher.pop(&name, LONG, Duration::ZERO).await.unwrap();
        d.unwrap().ack().await.unwrap();
    }
    assert_eq!(
        calls(&server, "publish"),
        pubs,
        "published with nobody waiting"
    );

    for round in 0..3 {
        let (w, n) = (waiter.clone(), name.clone());
        let task = tokio::spawn(async move { w.pop(&n, LONG, 20 * SEC).await });
        sleep(300 * MS).await;
        let pushed_at = Instant::now();
        pusher.push(&name, format!("wake {round}")).await.unwrap();
        let d = timeout(5 * SEC, task)
            .await
            .expect("the pop returned")
            .unwrap()
            .unwrap()
            .expect("the pushed message");
        assert!(
            pushed_at.elapsed() < SEC,
            "woken only after {:?}",
            pushed_at.elapsed()
        );
        assert_eq!(d.payload(), format!("wake {round}").as_bytes());
        d.ack().await.unwrap();
    }
    assert!(calls(&server, "publish") > pubs);

    // A delayed push wakes a waiter only when it comes due before anything
    // else the waiter was told of. The pop waits once its attempt after
    // subscribing has refreshed the lane's waiting mark (the mark of the
    // rounds above is still live, so the pushes would publish without it:
    // only the pop's own refresh says it listens).
    let state = format!("coord:queue:{{{name}}}");
    let mark = || {
        server
            .command(&["HGET", &state, "w0"])
            .as_str()
            .map(|v| v.parse::<i64>().unwrap())
    };
    let before = mark();
    let (w, n) = (waiter.clone(), name.clone());
    let task = tokio::spawn(async move { w.pop(&n, LONG, 5 * SEC).await });
    until("the pop waits", 5 * SEC, || async { mark() > before }).await;
    let pubs = calls(&server, "publish");
    let later = PushOptions::new().delay(20 * SEC);
    pusher.push_with(&name, b"in 20 s", &later).await.unwrap();
    assert_eq!(
        calls(&server, "publish"),
        pubs + 1,
        "the soonest delayed push"
    );
    let latest = PushOptions::new().delay(30 * SEC);
    pusher.push_with(&name, b"in 30 s", &latest).await.unwrap();
    assert_eq!(calls(&server, "publish"), pubs + 1, "a later delayed push");
    assert!(task.await.unwrap().unwrap().is_none());
    assert_eq!(pusher.purge(&name).await.unwrap(), 2);
}

#[tokio::test]
async fn fencing_tokens_and_ids_keep_rising_after_the_server_lost_its_data() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let name = unique("q-fence");
    let me = OwnerToken::random();
    let cfg = QueueConfig::default();
    let mut last = (MessageId(0), 0u64);
    let x = msg(b"x", None);
    for round in 0..3 {
        for _ in 0..5 {
            let id = eventually("push", || b.push(&name, &x)).await.id;
            let (m, token) = delivered(
                eventually("pop", || b.try_pop(&name, Lane::Main, &me, LONG, &cfg)).await,
            );
            assert_eq!(m.id, id);
            assert!(
                id > last.0 && token > last.1,
                "round {round}: id {id} token {token} after {last:?}"
            );
            last = (id, token);
        }
        match round {
            0 => {
                server.command(&["FLUSHALL"]);
            }
            _ => server.restart(),
        }
    }
}

#[tokio::test]
async fn a_lapse_larger_than_one_steps_batch_redelivers_everything() {
    let b = Arc::new(backend(&kit::url()).await);
    let name = unique("q-mass-lapse");
    let (me, other) = (OwnerToken::random(), OwnerToken::random());
    let cfg = QueueConfig::default();
    const N: usize = 600;
    for i in 0..N {
        let group = ["a", "b", "c"][i % 3];
        b.push(&name, &msg(b"m", Some(group))).await.unwrap();
    }
    // Every delivery lapses at the same moment (give or take the pops).
    // No delivery may lapse before the last pop: eight consumers' pops
    // run at once, within a visibility that leaves a loaded machine room.
    let vis = 10 * SEC;
    let start = Instant::now();
    let mut pops = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (b, name) = (b.clone(), name.clone());
        pops.spawn(async move {
            for _ in 0..N / 8 {
                delivered(b.try_pop(&name, Lane::Main, &me, vis, &cfg).await.unwrap());
            }
        });
    }
    while let Some(done) = pops.join_next().await {
        done.unwrap();
    }
    let empty = b.try_pop(&name, Lane::Main, &me, LONG, &cfg).await.unwrap();
    assert!(start.elapsed() < vis, "the pops took {:?}", start.elapsed());
    assert!(
        matches!(empty, PopAttempt::Empty { next_in: Some(n) } if n <= vis),
        "{empty:?}"
    );
    sleep(vis + 100 * MS).await;
    assert_eq!(b.stats(&name).await.unwrap().ready, N as u64);
    let mut seen = BTreeSet::new();
    for _ in 0..N {
        let (m, _) = delivered(
            b.try_pop(&name, Lane::Main, &other, LONG, &cfg)
                .await
                .unwrap(),
        );
        assert_eq!(m.attempts, 2);
        assert!(seen.insert(m.id), "{} delivered twice", m.id);
        assert!(!b.ack(&name, Lane::Main, m.id, &me).await.unwrap());
        assert!(b.ack(&name, Lane::Main, m.id, &other).await.unwrap());
    }
    assert_eq!(b.stats(&name).await.unwrap(), Default::default());
}

#[tokio::test]
async fn a_queue_whose_keys_were_lost_never_fails_and_works_after_a_purge() {
    let server = RedisServer::start();
    let b = backend(&server.url()).await;
    let name = "lost";
    let me = OwnerToken::random();
    let cfg = QueueConfig::default().ordered_groups(true);
    for lost in [
        ":bodies",
        ":main:meta",
        ":main:all",
        ":main:ready",
        ":main:groups",
        "",
    ] {
        for i in 0..4u8 {
            b.push(name, &msg(&[i], Some(["a", "b"][i as usize % 2])))
                .await
                .unwrap();
        }
        server.command(&["DEL", &format!("coord:queue:{{{name}}}{lost}")]);
        for _ in 0..8 {
            match b.try_pop(name, Lane::Main, &me, LONG, &cfg).await.unwrap() {
                PopAttempt::Delivered { message, .. } => {
                    b.ack(name, Lane::Main, message.id, &me).await.unwrap();
                }
                PopAttempt::Empty { .. } => break,
            }
        }
        b.stats(name).await.unwrap();
        b.peek(name, Lane::Main, 10).await.unwrap();
        b.purge(name).await.unwrap();
        // Working again.
        let id = b.push(name, &msg(b"ok", None)).await.unwrap().id;
        let (m, _) = delivered(b.try_pop(name, Lane::Main, &me, LONG, &cfg).await.unwrap());
        assert_eq!(m.id, id, "after losing {lost:?}");
        assert!(b.ack(name, Lane::Main, id, &me).await.unwrap());
        assert_eq!(
            dbsize(&server),
            0,
            "after losing {lost:?}: {:?}",
            keys(&server)
        );
    }
}

/// Random pushes, pops (ordered or not, with dead-lettering), acks, nacks,
/// acks by the wrong consumer and redrives: every pop delivers what
/// coord-core's queue state machine delivers, and stats and peeks agree
/// with it (`conformance::queue_rule`).
#[tokio::test]
async fn deliveries_follow_the_rule_as_the_state_machine_does() {
    let b: Arc<dyn Queue> = Arc::new(backend(&kit::url()).await);
    conformance::queue_rule::deliveries_follow_the_state_machine(b, 600, async |_| {}).await;
    // Pushing through the handle with options works as the raw trait.
    let q = backend(&kit::url()).await.into_coord().queues().unwrap();
    let name = unique("q-handle");
    let p = q
        .push_with(&name, b"x", &PushOptions::new().group("g").dedup_id("d"))
        .await
        .unwrap();
    assert!(!p.duplicate);
    q.purge(&name).await.unwrap();
}

async fn php_coord() -> coord_core::Coord {
    RedisBackend::connect(RedisOptions::new(&kit::url()).layout(coord_redis::Layout::Php))
        .await
        .expect("connect")
        .into_coord()
}

/// Queues are offered in [`Layout::Php`](coord_redis::Layout::Php) too
/// (the PHP key names include no queue keys; they live under the prefix,
/// as leases do): some of the shared queue cases run there as well.
macro_rules! php_layout_cases {
    ($($case:ident),* $(,)?) => {
        mod php_layout {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let f = conformance::Factory::new(super::php_coord);
                    conformance::cases::$case(&f).await;
                }
            )*
        }
    };
}

php_layout_cases!(
    queue_stale_consumer_is_refused_and_fenced_out,
    queue_fifo_within_a_group_and_ordered_groups_one_at_a_time,
    queue_dead_letters_after_max_deliveries_and_redrive,
    queue_binary_payloads_round_trip,
    queue_blocked_pop_is_woken_by_a_push,
);
