//! The etcd semaphore's own tests, on the raw trait and the keys it
//! writes, against a real single-node etcd: the layout (grant key and slot
//! keys on one lease, the token its create revision), and bounded state
//! (a crashed holder's keys go at its TTL, a killed waiter's place lapses,
//! and then nothing is left of the name), and concurrent attempts that
//! find permits free are not refused.

use std::sync::Arc;
use std::time::Duration;

use conformance::testkit::etcd;
use coord_core::{Attempt, OwnerToken, PermitRequest, Semaphore};
use coord_etcd::{EtcdBackend, EtcdOptions};
use etcd_client::{GetOptions, KeyValue};
use tokio::time::{Instant, sleep};

async fn backend(prefix: &str) -> std::sync::Arc<EtcdBackend> {
    let url = format!("{}?prefix={prefix}", etcd::shared().url());
    EtcdBackend::connect(EtcdOptions::parse(&url).unwrap())
        .await
        .expect("connect to the test etcd")
}

async fn keys(prefix: &str) -> Vec<KeyValue> {
    let mut raw = etcd_client::Client::connect([etcd::shared().endpoint()], None)
        .await
        .unwrap();
    let mut resp = raw
        .get(prefix.as_bytes(), Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    resp.take_kvs()
}

fn names(kvs: &[KeyValue], prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = kvs
        .iter()
        .map(|kv| kv.key_str().unwrap()[prefix.len()..].to_string())
        .collect();
    v.sort();
    v
}

fn req(permits: u32, ttl: Duration, queue: bool) -> PermitRequest {
    PermitRequest {
        permits,
        total: 3,
        ttl,
        queue,
    }
}

#[tokio::test]
async fn grant_is_a_key_and_its_slots_on_one_lease_token_its_create_revision() {
    let prefix = format!("semlayout-{}/", std::process::id());
    let b = backend(&prefix).await;
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let long = Duration::from_secs(30);
    let Attempt::Granted(t) = b.try_acquire("l", &a, &req(2, long, false)).await.unwrap() else {
        panic!("2 of 3 free permits refused");
    };
    let kvs = keys(&prefix).await;
    let hold = format!("sem/l/h/{}", a.to_hex());
    // The grant key and two of the three slots (chosen at random).
    let got = names(&kvs, &prefix);
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[0], hold);
    assert!(
        got[1] < got[2]
            && got[1..]
                .iter()
                .all(|k| ["sem/l/s/0", "sem/l/s/1", "sem/l/s/2"].contains(&k.as_str())),
        "{got:?}"
    );
    let value = kvs
        .iter()
        .find(|kv| kv.key_str().unwrap().ends_with(&hold))
        .unwrap()
        .value_str()
        .unwrap()
        .to_string();
    let slots: Vec<&str> = got[1..].iter().map(|k| &k["sem/l/s/".len()..]).collect();
    assert_eq!(
        value,
        format!("2 3 {}", slots.join(",")),
        "the grant names its slots"
    );
    let h = kvs
        .iter()
        .find(|kv| kv.key_str().unwrap().ends_with(&hold))
        .unwrap();
    assert_eq!(
        h.create_revision() as u64,
        t.get(),
        "the token is the grant key's create revision"
    );
    assert!(
        h.lease() != 0 && kvs.iter().all(|kv| kv.lease() == h.lease()),
        "one lease per grant"
    );
    // A retry of the same owner: the same token, nothing new written.
    let again = b.try_acquire("l", &a, &req(2, long, false)).await.unwrap();
    assert!(matches!(again, Attempt::Granted(x) if x == t), "{again:?}");
    // 2 more do not fit: refused without queueing leaves nothing behind.
    let refused = b.try_acquire("l", &c, &req(2, long, false)).await.unwrap();
    assert!(matches!(refused, Attempt::Held { .. }), "{refused:?}");
    assert_eq!(
        keys(&prefix).await.len(),
        3,
        "a refused single attempt wrote something"
    );
    assert!(b.release("l", &a).await.unwrap());
    assert!(!b.release("l", &a).await.unwrap(), "released twice");
    assert!(keys(&prefix).await.is_empty(), "a release left keys behind");
}

#[tokio::test]
async fn crashed_holder_and_killed_waiter_leave_nothing_behind() {
    let prefix = format!("semidle-{}/", std::process::id());
    let b = backend(&prefix).await;
    let short = b.capabilities().min_ttl;
    let (holder, waiter, later) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let got = b
        .try_acquire("i", &holder, &req(3, short, false))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Granted(_)), "{got:?}");
    // A waiter queues for 2, then is killed: it never attempts again.
    let queued_at = Instant::now();
    let held = b
        .try_acquire("i", &waiter, &req(2, short, true))
        .await
        .unwrap();
    assert!(matches!(held, Attempt::Held { .. }), "{held:?}");
    let place = format!("sem/i/w/{}", waiter.to_hex());
    assert!(
        names(&keys(&prefix).await, &prefix).contains(&place),
        "the waiter did not queue"
    );
    // The crashed holder's grant and slots go at its TTL (the server's
    // expiry, within a second or two); the place stays and keeps FIFO.
    sleep(short + Duration::from_secs(3)).await;
    assert_eq!(names(&keys(&prefix).await, &prefix), vec![place.clone()]);
    let blocked = b
        .try_acquire("i", &later, &req(2, short, false))
        .await
        .unwrap();
    assert!(
        matches!(blocked, Attempt::Held { .. }),
        "a later request for 2 overtook the queued request for 2: {blocked:?}"
    );
    // Nobody renews the place: it lapses after the queue TTL (30 s), and
    // the name is empty again; the later request then gets its permits.
    let lapse = Duration::from_secs(30);
    let deadline = queued_at + lapse + Duration::from_secs(5);
    loop {
        if keys(&prefix).await.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the killed waiter's place never lapsed"
        );
        sleep(Duration::from_millis(500)).await;
    }
    assert!(
        queued_at.elapsed() + Duration::from_secs(1) >= lapse,
        "the place lapsed early"
    );
    let now = b
        .try_acquire("i", &later, &req(2, short, false))
        .await
        .unwrap();
    assert!(matches!(now, Attempt::Granted(_)), "{now:?}");
    assert!(b.release("i", &later).await.unwrap());
    assert!(keys(&prefix).await.is_empty(), "state left after release");
}

/// `clients` separate clients (each its own connection, all connected
/// before contending) start together and each try_acquire 1 of `total`
/// permits of `name`, held 30 s: how many were granted. Every client then
/// releases what it holds.
async fn contend(prefix: &str, name: &str, clients: usize, total: u32) -> usize {
    let url = format!("{}?prefix={prefix}", etcd::shared().url());
    let mut sems = Vec::new();
    for _ in 0..clients {
        let c = coord_etcd::connect(&url).await.expect("connect");
        sems.push(c.semaphores().unwrap());
    }
    let start = Arc::new(tokio::sync::Barrier::new(clients));
    let mut tasks = Vec::new();
    for sem in sems {
        let (start, name) = (start.clone(), name.to_string());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let got = sem
                .try_acquire(&name, total, Duration::from_secs(30))
                .await
                .expect("try_acquire");
            (sem, got)
        }));
    }
    let mut granted = Vec::new();
    for t in tasks {
        let (sem, got) = t.await.unwrap();
        if let Some(p) = got {
            granted.push((sem, p));
        }
    }
    let n = granted.len();
    for (_sem, p) in granted {
        p.release().await.unwrap();
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_try_acquire_with_free_permits_is_never_refused() {
    let prefix = format!("semconc-{}/", std::process::id());
    // As many permits as clients: every attempt finds one free, so none
    // may be refused (a refusal says no permit was free at that moment).
    let all = contend(&prefix, "all", 32, 32).await;
    assert_eq!(all, 32, "{} of 32 refused with 32 permits free", 32 - all);
    // Half as many: exactly the 16 permits are granted, no fewer.
    let half = contend(&prefix, "half", 32, 16).await;
    assert_eq!(half, 16, "{half} of 32 granted with 16 permits");
    assert!(keys(&prefix).await.is_empty(), "state left after release");
}
