//! What a busy lock name leaves in etcd's key index between compactions.
//!
//! etcd keeps an index entry for every key ever written until a compaction
//! removes the deleted ones, and a range read (the queue read of every
//! attempt, the empty-queue compare of a first attempt) visits every entry
//! in its range, deleted or not. A claim key per acquire
//! (`<queue>/<owner hex>`, a new owner token each time) makes each
//! attempt on a name cost more with every earlier cycle on it: measured
//! with such keys, an uncontended cycle on one name went from 711 to
//! 3526 µs of server CPU over about 10,000 cycles
//! (`examples/lock_speed.rs 2 6 coord 1`), where etcd's lock RPC, whose
//! key is `<name>/<lease>` and so reused, stayed flat. So claim keys are
//! named by their lease too (`<queue>/<lease hex>`, the owner in the
//! value).
//!
//! Pinned here by what etcd's history says, not by time: N cycles on one
//! name must not write N distinct keys. The other tests hold the key per
//! lease to the contract: owner-checked release and extend after a key
//! was reused, two waiters of one client, rising tokens, elections.

use crate::history_support;
use std::time::Duration;

use conformance::testkit::etcd::EtcdServer;
use coord_core::{Attempt, Lock, OwnerToken};

use history_support::{distinct_keys, revision};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cycles_on_one_name_do_not_grow_the_key_index() {
    let server = EtcdServer::start();
    let coord = coord_etcd::connect(&server.url()).await.unwrap();
    let locks = coord.locks().unwrap();
    let ttl = Duration::from_secs(30);
    // Warm up: the first claims grant leases.
    for _ in 0..10 {
        locks
            .try_acquire("busy", ttl)
            .await
            .unwrap()
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let from = revision(&server).await + 1;
    const CYCLES: u32 = 500;
    for _ in 0..CYCLES {
        locks
            .try_acquire("busy", ttl)
            .await
            .unwrap()
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let to = revision(&server).await;
    let grown = distinct_keys(&server, "coord:lock/busy/", from, to).await;
    eprintln!("{CYCLES} cycles on one name wrote {grown} distinct keys");
    assert!(
        grown < 50,
        "{CYCLES} cycles on one name wrote {grown} distinct keys, each an entry in \
         etcd's key index until a compaction"
    );
}

/// The raw backend of a client of `server` (the `Lock`/`Election` traits).
async fn backend(server: &EtcdServer) -> std::sync::Arc<coord_etcd::EtcdBackend> {
    coord_etcd::EtcdBackend::connect(coord_etcd::EtcdOptions::parse(&server.url()).unwrap())
        .await
        .unwrap()
}

/// The keys under `dir` now, in create order.
async fn keys_now(server: &EtcdServer, dir: &str) -> Vec<etcd_client::KeyValue> {
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let mut kvs = raw
        .get(dir, Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap()
        .take_kvs();
    kvs.sort_by_key(|kv| kv.create_revision());
    kvs
}

fn granted(a: coord_core::Result<Attempt>) -> u64 {
    match a {
        Ok(Attempt::Granted(t)) => t.get(),
        a => panic!("expected a grant: {a:?}"),
    }
}

/// The value of a claim key: the owner's hex (then a space and the
/// metadata or candidate, if any).
fn owner_of(kv: &etcd_client::KeyValue) -> Vec<u8> {
    kv.value().split(|b| *b == b' ').next().unwrap().to_vec()
}

/// A released owner's key is reused by this client's next claim on the
/// name (its spare lease): a second, stale release or extend by the
/// released owner must change nothing and say not held; so must a release
/// by an owner nobody saw, from this client or another. Tokens rise on the
/// reused key. A release of the holder by another client of its owner
/// finds the key by its value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_release_after_the_key_was_reused_changes_nothing() {
    let server = EtcdServer::start();
    let b = backend(&server).await;
    let other = backend(&server).await;
    let ttl = Duration::from_secs(30);
    let dir = "coord:lock/n/";
    let mut last = 0;
    let mut name_of_key = None;
    for _ in 0..20 {
        let o = OwnerToken::random();
        let t = granted(b.try_acquire("n", o.step(), ttl).await);
        assert!(t > last, "token {t} after {last} on a reused key");
        last = t;
        let k = keys_now(&server, dir).await;
        assert_eq!(k.len(), 1);
        assert_eq!(owner_of(&k[0]), o.to_hex().into_bytes());
        assert_eq!(k[0].create_revision() as u64, t);
        name_of_key.get_or_insert_with(|| k[0].key().to_vec());
        assert!(b.release("n", o.step()).await.unwrap());
    }
    let a = OwnerToken::random();
    let ta = granted(b.try_acquire("n", a.step(), ttl).await);
    assert!(b.release("n", a.step()).await.unwrap());
    let o = OwnerToken::random();
    let t = granted(b.try_acquire("n", o.step(), ttl).await);
    assert!(t > ta);
    let before = keys_now(&server, dir).await;
    assert_eq!(before.len(), 1);
    assert_eq!(
        Some(before[0].key().to_vec()),
        name_of_key,
        "a cycle on one name wrote a new key"
    );
    // Stale: the released owner, whose key (and lease) now carry `o`.
    assert!(
        !b.release("n", a.step()).await.unwrap(),
        "a stale release said held"
    );
    assert!(
        !b.extend("n", a.step(), ttl).await.unwrap(),
        "a stale extend said held"
    );
    // An owner nobody saw, from this client and another.
    assert!(!b.release("n", OwnerToken::random().step()).await.unwrap());
    assert!(!other.release("n", a.step()).await.unwrap());
    assert!(!other.extend("n", o.step(), ttl).await.unwrap());
    let after = keys_now(&server, dir).await;
    assert_eq!(after.len(), 1);
    assert_eq!(
        (
            after[0].key(),
            after[0].create_revision(),
            after[0].mod_revision(),
            after[0].lease()
        ),
        (
            before[0].key(),
            before[0].create_revision(),
            before[0].mod_revision(),
            before[0].lease()
        ),
        "a release or extend by an owner that does not hold changed the key"
    );
    let r = coord_core::Lock::inspect(&*other, "n").await.unwrap();
    assert_eq!(r.holders.len(), 1);
    assert_eq!((r.holders[0].owner, r.holders[0].token.get()), (o, t));
    assert!(b.extend("n", o.step(), ttl).await.unwrap());
    // The holder's owner released through another client.
    assert!(other.release("n", o.step()).await.unwrap());
    assert!(keys_now(&server, dir).await.is_empty());
    assert!(!b.release("n", o.step()).await.unwrap(), "its key is gone");
    let z = OwnerToken::random();
    assert!(granted(b.try_acquire("n", z.step(), ttl).await) > t);
    assert!(b.release("n", z.step()).await.unwrap());
}

/// Two owners of one client wait on one name at once, behind a third:
/// each has a key and a lease of its own, in line by create revision, and
/// each is granted in turn with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_waiters_of_one_client_have_keys_of_their_own() {
    let server = EtcdServer::start();
    let b = backend(&server).await;
    let ttl = Duration::from_secs(30);
    let dir = "coord:lock/w/";
    // Spare leases first, so that the waiters could share one if the
    // pool handed a lease to two claims.
    for _ in 0..3 {
        let o = OwnerToken::random();
        granted(b.try_acquire("w", o.step(), ttl).await);
        assert!(b.release("w", o.step()).await.unwrap());
    }
    let (h, w1, w2) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let th = granted(b.try_acquire("w", h.step(), ttl).await);
    let mut waiters = Vec::new();
    for w in [&w1, &w2] {
        assert!(matches!(
            b.try_acquire("w", w.step(), ttl).await.unwrap(),
            Attempt::Held { .. }
        ));
        waiters.push(coord_core::Lock::subscribe(&*b, "w", w).await.unwrap());
        assert!(matches!(
            b.try_acquire("w", w.step(), ttl).await.unwrap(),
            Attempt::Held { .. }
        ));
    }
    let k = keys_now(&server, dir).await;
    let owners: Vec<Vec<u8>> = k.iter().map(owner_of).collect();
    let want: Vec<Vec<u8>> = [&h, &w1, &w2]
        .iter()
        .map(|o| o.to_hex().into_bytes())
        .collect();
    assert_eq!(owners, want, "the line is not holder, w1, w2");
    let names: std::collections::HashSet<&[u8]> = k.iter().map(|kv| kv.key()).collect();
    let leases: std::collections::HashSet<i64> = k.iter().map(|kv| kv.lease()).collect();
    assert_eq!(
        (names.len(), leases.len()),
        (3, 3),
        "claims share a key or a lease"
    );
    assert!(b.release("w", h.step()).await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), waiters[0].notified())
        .await
        .expect("w1 is woken");
    let t1 = granted(b.try_acquire("w", w1.step(), ttl).await);
    assert!(t1 > th);
    assert!(matches!(
        b.try_acquire("w", w2.step(), ttl).await.unwrap(),
        Attempt::Held { .. }
    ));
    assert!(
        !b.release("w", h.step()).await.unwrap(),
        "a stale release said held"
    );
    assert!(b.release("w", w1.step()).await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), waiters[1].notified())
        .await
        .expect("w2 is woken");
    let t2 = granted(b.try_acquire("w", w2.step(), ttl).await);
    assert!(t2 > t1);
    assert!(!b.release("w", w1.step()).await.unwrap());
    assert!(b.release("w", w2.step()).await.unwrap());
    assert!(keys_now(&server, dir).await.is_empty());
}

/// Elections name their keys as locks do: terms on one name reuse a key,
/// and rise; the candidate (spaces and all, or empty) and the owner are
/// read back from the value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_terms_reuse_a_key_and_keep_the_candidate() {
    use coord_core::Election;
    let server = EtcdServer::start();
    let b = backend(&server).await;
    let ttl = Duration::from_secs(30);
    let mut names = std::collections::HashSet::new();
    let mut last = 0;
    for i in 0..20 {
        let o = OwnerToken::random();
        let candidate = if i % 2 == 0 { "node a 1" } else { "" };
        let t = granted(b.try_campaign("e", candidate, o.step(), ttl).await);
        assert!(t > last);
        last = t;
        let leader = b.leader("e").await.unwrap().expect("a leader");
        assert_eq!(
            (leader.candidate.as_str(), leader.term.get()),
            (candidate, t)
        );
        let r = Election::inspect(&*b, "e")
            .await
            .unwrap()
            .expect("a leader");
        assert_eq!((r.candidate.as_str(), r.holder.owner), (candidate, o));
        assert!(!b.resign("e", OwnerToken::random().step()).await.unwrap());
        for kv in keys_now(&server, "coord:election/e/").await {
            names.insert(kv.key().to_vec());
        }
        assert!(b.resign("e", o.step()).await.unwrap());
        assert!(!b.resign("e", o.step()).await.unwrap());
    }
    assert!(names.len() <= 2, "20 terms wrote {} keys", names.len());
}
