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
    let Attempt::Granted(t) = b
        .try_acquire("l", a.step(), &req(2, long, false))
        .await
        .unwrap()
    else {
        panic!("2 of 3 free permits refused");
    };
    let kvs = keys(&prefix).await;
    // The grant key, named by its lease (the owner is in the value), and
    // two of the three slots (chosen at random).
    let lease = kvs
        .iter()
        .find(|kv| kv.value_str().unwrap().starts_with(&a.to_hex()))
        .expect("a key whose value names the owner")
        .lease();
    let hold = format!("sem/l/h/{lease:x}");
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
        format!("{} 2 3 {}", a.to_hex(), slots.join(",")),
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
    let again = b
        .try_acquire("l", a.step(), &req(2, long, false))
        .await
        .unwrap();
    assert!(matches!(again, Attempt::Granted(x) if x == t), "{again:?}");
    // 2 more do not fit: refused without queueing leaves nothing behind.
    let refused = b
        .try_acquire("l", c.step(), &req(2, long, false))
        .await
        .unwrap();
    assert!(matches!(refused, Attempt::Held { .. }), "{refused:?}");
    assert_eq!(
        keys(&prefix).await.len(),
        3,
        "a refused single attempt wrote something"
    );
    assert!(b.release("l", a.step()).await.unwrap());
    assert!(!b.release("l", a.step()).await.unwrap(), "released twice");
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
        .try_acquire("i", holder.step(), &req(3, short, false))
        .await
        .unwrap();
    assert!(matches!(got, Attempt::Granted(_)), "{got:?}");
    // A waiter queues for 2, then is killed: it never attempts again.
    let queued_at = Instant::now();
    let held = b
        .try_acquire("i", waiter.step(), &req(2, short, true))
        .await
        .unwrap();
    assert!(matches!(held, Attempt::Held { .. }), "{held:?}");
    // The place is named by its lease; its value names the owner.
    let kvs = keys(&prefix).await;
    let lease = kvs
        .iter()
        .find(|kv| {
            kv.key_str().unwrap().contains("/w/")
                && kv.value_str().unwrap().starts_with(&waiter.to_hex())
        })
        .expect("the waiter did not queue")
        .lease();
    let place = format!("sem/i/w/{lease:x}");
    assert!(
        names(&keys(&prefix).await, &prefix).contains(&place),
        "the waiter did not queue"
    );
    // The crashed holder's grant and slots go at its TTL (the server's
    // expiry, within a second or two); the place stays and keeps FIFO.
    sleep(short + Duration::from_secs(3)).await;
    assert_eq!(names(&keys(&prefix).await, &prefix), vec![place.clone()]);
    let blocked = b
        .try_acquire("i", later.step(), &req(2, short, false))
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
        .try_acquire("i", later.step(), &req(2, short, false))
        .await
        .unwrap();
    assert!(matches!(now, Attempt::Granted(_)), "{now:?}");
    assert!(b.release("i", later.step()).await.unwrap());
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

/// The grant and place keys of `name`, each with the owner its value
/// names (grant and place keys are named by leases, the owner is in the
/// value).
async fn owned(prefix: &str, name: &str) -> Vec<(String, String, i64)> {
    let dir = format!("sem/{name}/");
    keys(prefix)
        .await
        .into_iter()
        .filter_map(|kv| {
            let k = kv.key_str().unwrap()[prefix.len()..].to_string();
            let rest = k.strip_prefix(&dir)?;
            if rest.starts_with("s/") {
                return None;
            }
            let owner = kv.value_str().unwrap().split(' ').next()?.to_string();
            Some((k, owner, kv.create_revision()))
        })
        .collect()
}

/// Keys named by leases: two owners of one client on one name at once each
/// have their own grant key and their own place; an owner this client has
/// never seen is released and extended through another client by the key
/// whose value names it; a stale release of an owner whose key (lease) was
/// reused by a later owner of the same client touches nothing of the new
/// holder's, and the reused key's token rises.
#[tokio::test]
async fn keys_are_named_by_leases_and_owners_are_found_in_values() {
    let prefix = format!("semlease-{}/", std::process::id());
    let b = backend(&prefix).await;
    let other = backend(&prefix).await;
    let long = Duration::from_secs(30);
    let (a, c, w1, w2) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let granted = |x: Attempt| match x {
        Attempt::Granted(t) => t.get(),
        other => panic!("expected a grant: {other:?}"),
    };
    // Two grants of one client: two keys, each naming its owner.
    granted(
        b.try_acquire("k", a.step(), &req(1, long, false))
            .await
            .unwrap(),
    );
    let tc = granted(
        b.try_acquire("k", c.step(), &req(1, long, false))
            .await
            .unwrap(),
    );
    // Two waiters of one client for more than is left: two places.
    for w in [&w1, &w2] {
        let r = b
            .try_acquire("k", w.step(), &req(2, long, true))
            .await
            .unwrap();
        assert!(matches!(r, Attempt::Held { .. }), "{r:?}");
    }
    let got = owned(&prefix, "k").await;
    assert_eq!(got.len(), 4, "{got:?}");
    for o in [&a, &c, &w1, &w2] {
        assert_eq!(
            got.iter().filter(|(_, v, _)| *v == o.to_hex()).count(),
            1,
            "{got:?}"
        );
    }
    assert!(
        got.iter().all(|(k, v, _)| !k.contains(v.as_str())),
        "a key named by its owner: {got:?}"
    );
    // Through another client (no record of these owners): the waiters'
    // places go, c's grant is extended to another TTL (its key and token
    // kept), a's grant goes.
    assert!(!other.release("k", w1.step()).await.unwrap());
    assert!(!other.release("k", w2.step()).await.unwrap());
    let c_key = got
        .iter()
        .find(|(_, v, _)| *v == c.to_hex())
        .unwrap()
        .0
        .clone();
    assert!(
        other
            .extend("k", c.step(), Duration::from_secs(40))
            .await
            .unwrap()
    );
    assert!(other.release("k", a.step()).await.unwrap());
    assert!(
        !other.release("k", a.step()).await.unwrap(),
        "released twice"
    );
    let got = owned(&prefix, "k").await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((&got[0].0, got[0].2 as u64), (&c_key, tc));
    // The client that granted a no longer holds it either.
    assert!(!b.release("k", a.step()).await.unwrap());
    assert!(!b.extend("k", a.step(), long).await.unwrap());
    assert!(b.release("k", c.step()).await.unwrap());
    assert!(keys(&prefix).await.is_empty(), "{:?}", keys(&prefix).await);

    // A released grant's lease is reused by the next grant of the client:
    // the same key, a new create revision (a higher token); a stale
    // release or extend of the old owner leaves the new holder alone.
    let t1 = granted(
        b.try_acquire("r", a.step(), &req(3, long, false))
            .await
            .unwrap(),
    );
    let k1 = owned(&prefix, "r").await;
    assert!(b.release("r", a.step()).await.unwrap());
    let t2 = granted(
        b.try_acquire("r", c.step(), &req(3, long, false))
            .await
            .unwrap(),
    );
    let k2 = owned(&prefix, "r").await;
    assert_eq!(k1.len(), 1);
    assert_eq!(k2.len(), 1);
    assert_eq!(k1[0].0, k2[0].0, "the lease (and key) was not reused");
    assert!(t2 > t1, "tokens {t1} then {t2}");
    assert!(
        !b.release("r", a.step()).await.unwrap(),
        "stale release said held"
    );
    assert!(
        !b.extend("r", a.step(), long).await.unwrap(),
        "stale extend said held"
    );
    assert!(!other.release("r", a.step()).await.unwrap());
    assert_eq!(
        owned(&prefix, "r").await,
        k2,
        "the stale owner touched c's grant"
    );
    assert_eq!(keys(&prefix).await.len(), 4, "grant and 3 slots");
    assert!(b.release("r", c.step()).await.unwrap());
    assert!(keys(&prefix).await.is_empty());
}
