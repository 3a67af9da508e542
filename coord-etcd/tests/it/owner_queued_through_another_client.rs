//! One owner through several etcd clients: a refused attempt whose head
//! is the owner's own claim never queues; a release of an owner this
//! client only queued, or whose attempt's outcome is unknown, frees the
//! owner's claim held through another client but never its place in
//! another client's queue; a named lease granted again to its owner
//! through a second client moves the key onto the lease just granted; an
//! unknown-owner release of a named lease deletes the key at its create
//! revision; every extend also compares the key's lease.
//!
//! Each test drives the shared real etcd with a key prefix of its own and
//! reads keys and leases from etcd directly. What must hold (docs/guarantees.md §4):
//! never two holders, tokens never repeat or go back, no client ends a
//! lease it did not create (such a lease may carry that client's next
//! claim), `remaining()` never exceeds what the server would say, a
//! legitimate holder's renewals keep working, nothing is left behind.

use crate::claim_support;
use std::time::Duration;

use conformance::testkit::etcd;
use conformance::testkit::proxy::FaultProxy;
use coord_core::{Attempt, Election, Lease, Lock, OwnerToken};
use etcd_client::{KeyValue, LeaseTimeToLiveOptions};
use tokio::time::{Instant, sleep, timeout};

use claim_support::{
    all_keys, claim_keys, client, client_at, granted, owner_of, raw_etcd as raw, unique,
};

const TTL: Duration = Duration::from_secs(30);

fn refused(a: coord_core::Result<Attempt>, what: &str) {
    match a {
        Ok(Attempt::Held { .. }) => {}
        a => panic!("{what}: expected Held, got {a:?}"),
    }
}

/// The named lease's key `<prefix>lease/<name>` (names here need no escape).
async fn lease_kv(prefix: &str, name: &str) -> Option<KeyValue> {
    let key = format!("{prefix}lease/{name}");
    raw()
        .await
        .get(key.as_bytes(), None)
        .await
        .unwrap()
        .take_kvs()
        .into_iter()
        .next()
}

/// A lease's remaining TTL (-1: gone) and the keys it carries.
async fn lease_state(id: i64) -> (i64, Vec<Vec<u8>>) {
    let r = raw()
        .await
        .lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap();
    (r.ttl(), r.keys().to_vec())
}

/// Wait up to `limit` for `cond`.
async fn eventually<F, Fut>(limit: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + limit;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------
// Named leases moved by a grant through a second client
// ---------------------------------------------------------------------

/// The moved key keeps its create revision (the token), its value (owner
/// and metadata); the second client's grant never ends the first client's
/// lease (it only leaves it without keys); the first client's renewal then
/// says lost and ends its own lease; releases through either client leave
/// no key and no lease carrying one; the next owner's token is higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_keeps_token_and_metadata_and_leaks_nothing() {
    let prefix = unique("move");
    let (c1, c2, c3) = (
        client(&prefix).await,
        client(&prefix).await,
        client(&prefix).await,
    );
    let owner = OwnerToken::random();
    let t = granted(Lease::grant_with_metadata(&*c1, "job", &owner, TTL, b"{\"m\":1}").await);
    let before = lease_kv(&prefix, "job").await.expect("the key");
    let l1 = before.lease();
    let t2 = granted(Lease::grant_with_metadata(&*c2, "job", &owner, TTL, b"{\"m\":2}").await);
    assert_eq!(
        t2, t,
        "the same owner through a second client got another token"
    );
    let after = lease_kv(&prefix, "job")
        .await
        .expect("the key after the move");
    assert_eq!(after.create_revision(), before.create_revision());
    assert_eq!(after.value(), before.value(), "the move changed the value");
    let l2 = after.lease();
    assert_ne!(
        l2, l1,
        "the key was not moved onto the second client's lease"
    );
    let (ttl1, keys1) = lease_state(l1).await;
    assert!(ttl1 > 0, "client 2 ended client 1's lease (ttl {ttl1})");
    assert!(keys1.is_empty(), "client 1's lease still carries {keys1:?}");
    // What a third client sees: the first grant, its metadata.
    let rec = Lease::inspect(&*c3, "job").await.unwrap();
    assert_eq!(rec.holders.len(), 1);
    assert_eq!(rec.holders[0].token.get(), t);
    assert_eq!(rec.holders[0].owner, owner);
    assert_eq!(rec.holders[0].metadata.as_deref(), Some(&b"{\"m\":1}"[..]));
    refused(
        Lease::grant(&*c3, "job", &OwnerToken::random(), TTL).await,
        "another owner while the moved lease lives",
    );
    // Client 1: lost at its renewal; its lease ends (it was its own).
    assert!(!Lease::renew(&*c1, "job", &owner, TTL).await.unwrap());
    assert!(
        eventually(Duration::from_secs(3), || async {
            lease_state(l1).await.0 < 0
        })
        .await,
        "client 1's lease, left without keys and dropped, still lives"
    );
    assert_eq!(
        lease_kv(&prefix, "job").await.map(|kv| kv.lease()),
        Some(l2)
    );
    // Client 2 renews (same TTL, then another TTL, then back).
    assert!(Lease::renew(&*c2, "job", &owner, TTL).await.unwrap());
    assert!(
        Lease::renew(&*c2, "job", &owner, Duration::from_secs(20))
            .await
            .unwrap()
    );
    assert!(Lease::renew(&*c2, "job", &owner, TTL).await.unwrap());
    let kv = lease_kv(&prefix, "job").await.unwrap();
    assert_eq!(kv.create_revision() as u64, t);
    assert_eq!(kv.value(), before.value());
    assert!(Lease::revoke(&*c2, "job", &owner).await.unwrap());
    assert!(!Lease::revoke(&*c1, "job", &owner).await.unwrap());
    assert!(lease_kv(&prefix, "job").await.is_none());
    for id in [l1, l2, kv.lease()] {
        let (_, keys) = lease_state(id).await;
        assert!(keys.is_empty(), "lease {id:x} still carries {keys:?}");
    }
    let next = granted(Lease::grant(&*c1, "job", &OwnerToken::random(), TTL).await);
    assert!(next > t, "token {next} after {t}");
    assert_eq!(all_keys(&prefix).await.len(), 1);
}

/// A second client's grant of the same owner with a SHORTER TTL moves the
/// key onto a lease that ends sooner. The first client still has its own
/// entry for that create revision, so its `remaining()` answers from its
/// local deadline (the first grant's TTL), not from the lease that now
/// carries the key: it reports more time than the store will keep the
/// key, and `Some` after the key is gone is impossible only because it
/// reads the key first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remaining_on_the_first_client_never_exceeds_the_moved_keys_lease() {
    let prefix = unique("remaining");
    let (c1, c2) = (client(&prefix).await, client(&prefix).await);
    let owner = OwnerToken::random();
    let short = Duration::from_secs(2);
    let t = granted(Lease::grant(&*c1, "job", &owner, TTL).await);
    assert_eq!(granted(Lease::grant(&*c2, "job", &owner, short).await), t);
    let kv = lease_kv(&prefix, "job").await.unwrap();
    let (server_ttl, _) = lease_state(kv.lease()).await;
    assert!(
        server_ttl <= 2,
        "the key's lease is not the 2 s one: {server_ttl}"
    );
    let on2 = Lease::remaining(&*c2, "job").await.unwrap().unwrap();
    assert!(on2 <= short, "client 2 says {on2:?}");
    let on1 = Lease::remaining(&*c1, "job").await.unwrap();
    assert!(
        on1.is_some_and(|d| d <= Duration::from_secs(server_ttl as u64 + 1)),
        "client 1 says {on1:?} of a key whose lease has {server_ttl} s left"
    );
    // And the store keeps its word: the key ends with client 2's lease.
    sleep(Duration::from_secs(4)).await;
    assert!(lease_kv(&prefix, "job").await.is_none());
    assert_eq!(Lease::remaining(&*c1, "job").await.unwrap(), None);
    assert!(!Lease::renew(&*c1, "job", &owner, TTL).await.unwrap());
}

/// Does the move txn's request carry `key` followed by a put on a lease
/// with `ignore_value` set (PutRequest: key=1, lease=3 varint,
/// ignore_value=5 -> bytes 0x28 0x01)? Only the move (and an extend with
/// another TTL) writes that.
fn is_move_of(key: &[u8], bytes: &[u8]) -> bool {
    let mut from = 0;
    while let Some(i) = bytes[from..]
        .windows(key.len())
        .position(|w| w == key)
        .map(|i| i + from)
    {
        let rest = &bytes[i + key.len()..];
        if rest.first() == Some(&0x18) {
            let mut j = 1;
            while j < rest.len() && rest[j] & 0x80 != 0 {
                j += 1;
            }
            if rest.get(j + 1..j + 3) == Some(&[0x28, 0x01][..]) {
                return true;
            }
        }
        from = i + 1;
    }
    false
}

/// A grant of the same owner through a second client whose move is
/// applied but whose reply is lost: the client answers an error, but must
/// not revoke the lease it just granted, which now carries the owner's
/// live key. Revoking it would end the named lease the owner held
/// (through client 1) and give the owner's retry another token. The key
/// keeps its create revision, and the owner's retry through client 2 gets
/// the same token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_of_a_move_never_ends_the_owners_live_lease() {
    let prefix = unique("lostmove");
    let c1 = client(&prefix).await;
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let c2 = client_at(proxy.port(), &prefix, 1500).await;
    let owner = OwnerToken::random();
    let t = granted(Lease::grant(&*c1, "job", &owner, TTL).await);
    let key = format!("{prefix}lease/job").into_bytes();
    let k = key.clone();
    proxy.deliver_late(
        move |b| is_move_of(&k, b),
        Duration::from_millis(50),
        Duration::from_millis(400),
    );
    // Once the move is held, nothing else of client 2's passes: its retries
    // on a new connection fail too, and the grant answers an error.
    let (r, ()) = tokio::join!(Lease::grant(&*c2, "job", &owner, TTL), async {
        let end = Instant::now() + Duration::from_secs(3);
        while proxy.held() == 0 && Instant::now() < end {
            sleep(Duration::from_millis(2)).await;
        }
        proxy.blackhole();
    });
    assert_eq!(proxy.delivered(), 1, "the move was not delivered: {r:?}");
    assert!(r.is_err(), "the grant with a lost reply answered {r:?}");
    proxy.heal();
    sleep(Duration::from_millis(1500)).await;
    let kv = lease_kv(&prefix, "job").await;
    assert!(
        kv.as_ref()
            .is_some_and(|kv| kv.create_revision() as u64 == t),
        "the owner's live lease (token {t}) ended by a failed grant through client 2: {kv:?}"
    );
    // The owner's retry through client 2 gets the same token.
    assert_eq!(granted(Lease::grant(&*c2, "job", &owner, TTL).await), t);
    assert!(Lease::revoke(&*c2, "job", &owner).await.unwrap());
}

/// The same owner granted concurrently through two clients, many rounds:
/// one token, the key on exactly one of the two leases, only that
/// client's renewal succeeds, nobody else gets in, nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_grants_of_one_owner_through_two_clients() {
    let prefix = unique("concurrent");
    let (c1, c2, c3) = (
        client(&prefix).await,
        client(&prefix).await,
        client(&prefix).await,
    );
    let mut last = 0;
    for round in 0..20 {
        let name = format!("job{round}");
        let owner = OwnerToken::random();
        if round % 2 == 1 {
            // Half the rounds with the key already there (both move).
            granted(Lease::grant(&*c3, &name, &owner, TTL).await);
        }
        let (a, b) = tokio::join!(
            Lease::grant(&*c1, &name, &owner, TTL),
            Lease::grant(&*c2, &name, &owner, TTL)
        );
        let (a, b) = (granted(a), granted(b));
        assert_eq!(a, b, "round {round}: two tokens for one owner");
        assert!(a > last, "round {round}: token {a} after {last}");
        last = a;
        let kv = lease_kv(&prefix, &name).await.unwrap();
        assert_eq!(kv.create_revision() as u64, a);
        refused(
            Lease::grant(&*c3, &name, &OwnerToken::random(), TTL).await,
            "another owner",
        );
        let r1 = Lease::renew(&*c1, &name, &owner, TTL).await.unwrap();
        let r2 = Lease::renew(&*c2, &name, &owner, TTL).await.unwrap();
        assert!(
            r1 ^ r2,
            "round {round}: renewals through client 1 {r1}, client 2 {r2}"
        );
        let after = lease_kv(&prefix, &name).await.unwrap();
        assert_eq!(after.lease(), kv.lease(), "round {round}: the key moved");
        assert!(lease_state(kv.lease()).await.0 > 0);
        let (holder, other) = if r1 { (&c1, &c2) } else { (&c2, &c1) };
        assert!(Lease::revoke(&**holder, &name, &owner).await.unwrap());
        assert!(!Lease::revoke(&**other, &name, &owner).await.unwrap());
        assert!(!Lease::revoke(&*c3, &name, &owner).await.unwrap());
        assert!(lease_kv(&prefix, &name).await.is_none());
    }
    assert!(all_keys(&prefix).await.is_empty());
}

/// Neither client ever ends a lease carrying the other's next claim: after
/// a move, release through client 2 (its lease becomes a spare) and a lock
/// of client 2 on that spare; then client 1's stale renew, revoke and
/// grant of the owner. And the mirror: client 1 releases first and locks
/// on its spare; client 2's stale renew and revoke follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_calls_of_either_client_never_end_the_others_next_claim() {
    let prefix = unique("stale");
    let (c1, c2, c3) = (
        client(&prefix).await,
        client(&prefix).await,
        client(&prefix).await,
    );
    for mirror in [false, true] {
        let job = format!("job-{mirror}");
        let x = format!("x-{mirror}");
        let owner = OwnerToken::random();
        let t = granted(Lease::grant(&*c1, &job, &owner, TTL).await);
        assert_eq!(granted(Lease::grant(&*c2, &job, &owner, TTL).await), t);
        let (first, stale) = if mirror { (&c1, &c2) } else { (&c2, &c1) };
        assert!(Lease::revoke(&**first, &job, &owner).await.unwrap());
        let holder = OwnerToken::random();
        granted(Lock::try_acquire(&**first, &x, &holder, TTL).await);
        let lock_lease = claim_keys(&prefix, "lock", &x).await[0].lease();
        assert!(!Lease::renew(&**stale, &job, &owner, TTL).await.unwrap());
        assert!(!Lease::revoke(&**stale, &job, &owner).await.unwrap());
        // A grant of the owner anew through the stale client: a new token.
        let again = granted(Lease::grant(&**stale, &job, &owner, TTL).await);
        assert!(again > t);
        assert!(Lease::revoke(&**stale, &job, &owner).await.unwrap());
        sleep(Duration::from_millis(700)).await;
        let keys = claim_keys(&prefix, "lock", &x).await;
        assert_eq!(
            keys.iter().map(|k| k.lease()).collect::<Vec<_>>(),
            vec![lock_lease],
            "mirror {mirror}: the lock on the other client's spare is gone"
        );
        refused(
            Lock::try_acquire(&*c3, &x, &OwnerToken::random(), TTL).await,
            "a third client while the lock lives",
        );
        assert!(Lock::release(&**first, &x, &holder).await.unwrap());
    }
    assert!(all_keys(&prefix).await.is_empty());
}

/// Grants of one owner bouncing between two clients (each grant moves the
/// key, each loser's renewal says lost and ends its own lease): the token
/// stays, every lease but the carrier ends, and a release ends it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_bouncing_between_two_clients_leaks_no_lease() {
    let prefix = unique("bounce");
    let (c1, c2) = (client(&prefix).await, client(&prefix).await);
    let owner = OwnerToken::random();
    let t = granted(Lease::grant(&*c1, "job", &owner, TTL).await);
    let mut seen = vec![lease_kv(&prefix, "job").await.unwrap().lease()];
    for i in 0..6 {
        let (now, then) = if i % 2 == 0 { (&c2, &c1) } else { (&c1, &c2) };
        // A renewal-then-grant through `now` (its own entry, if any, is
        // stale: renew says lost, the grant moves the key).
        assert_eq!(granted(Lease::grant(&**now, "job", &owner, TTL).await), t);
        let kv = lease_kv(&prefix, "job").await.unwrap();
        assert!(
            !seen.contains(&kv.lease()),
            "the key went back to an old lease"
        );
        seen.push(kv.lease());
        assert!(!Lease::renew(&**then, "job", &owner, TTL).await.unwrap());
        assert!(Lease::renew(&**now, "job", &owner, TTL).await.unwrap());
    }
    let carrier = *seen.last().unwrap();
    assert!(
        eventually(Duration::from_secs(3), || {
            let seen = seen.clone();
            async move {
                for id in &seen[..seen.len() - 1] {
                    if lease_state(*id).await.0 > 0 {
                        return false;
                    }
                }
                true
            }
        })
        .await,
        "an old lease of the bounced key still lives"
    );
    assert!(lease_state(carrier).await.0 > 0);
    assert!(Lease::revoke(&*c1, "job", &owner).await.unwrap());
    assert!(lease_kv(&prefix, "job").await.is_none());
}

// ---------------------------------------------------------------------
// Compare::lease on every extend: legitimate holders keep renewing
// ---------------------------------------------------------------------

/// A lock whose attempt's reply was lost (the write landed on a spare),
/// adopted by the retry, then extended with the same TTL, another TTL
/// (moving the key) and back, and an election renewed likewise: every
/// renewal of the holder succeeds, the token never changes, and the
/// moved-from leases end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopted_and_moved_claims_keep_renewing() {
    let prefix = unique("adopt");
    let proxy = FaultProxy::start(etcd::shared().client_port());
    let c1 = client_at(proxy.port(), &prefix, 1500).await;
    let c3 = client(&prefix).await;
    // A spare of this TTL, so the next attempt is one txn.
    let warm = OwnerToken::random();
    granted(Lock::try_acquire(&*c1, "warm", &warm, TTL).await);
    assert!(Lock::release(&*c1, "warm", &warm).await.unwrap());
    let owner = OwnerToken::random();
    let dir = format!("{prefix}lock/x/").into_bytes();
    proxy.deliver_late(
        move |b| b.windows(dir.len()).any(|w| w == dir.as_slice()),
        Duration::from_millis(50),
        Duration::from_millis(400),
    );
    let (r, ()) = tokio::join!(Lock::try_acquire(&*c1, "x", &owner, TTL), async {
        let end = Instant::now() + Duration::from_secs(3);
        while proxy.held() == 0 && Instant::now() < end {
            sleep(Duration::from_millis(2)).await;
        }
        proxy.blackhole();
    });
    assert!(r.is_err(), "the attempt with a lost reply answered {r:?}");
    assert_eq!(proxy.delivered(), 1);
    proxy.heal();
    let keys = claim_keys(&prefix, "lock", "x").await;
    assert_eq!(keys.len(), 1, "the lost attempt's write did not land");
    let t = granted(Lock::try_acquire(&*c1, "x", &owner, TTL).await);
    assert_eq!(t, keys[0].create_revision() as u64, "not adopted");
    for ttl in [
        TTL,
        TTL,
        Duration::from_secs(20),
        Duration::from_secs(20),
        TTL,
    ] {
        assert!(
            Lock::extend(&*c1, "x", &owner, ttl).await.unwrap(),
            "the holder's extend ({ttl:?}) failed"
        );
        let now = claim_keys(&prefix, "lock", "x").await;
        assert_eq!(now.len(), 1);
        assert_eq!(now[0].create_revision() as u64, t);
        assert!(
            lease_state(now[0].lease()).await.0 > 0,
            "the key's lease ended"
        );
        refused(
            Lock::try_acquire(&*c3, "x", &OwnerToken::random(), TTL).await,
            "another owner",
        );
    }
    assert!(Lock::release(&*c1, "x", &owner).await.unwrap());
    // An election: renew, renew with another TTL, renew again.
    let cand = OwnerToken::random();
    let term = granted(Election::try_campaign(&*c1, "e", "me", &cand, TTL).await);
    for ttl in [TTL, Duration::from_secs(20), Duration::from_secs(20), TTL] {
        assert!(Election::renew(&*c1, "e", &cand, ttl).await.unwrap());
        let keys = claim_keys(&prefix, "election", "e").await;
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].create_revision() as u64, term);
    }
    assert!(Election::resign(&*c1, "e", &cand).await.unwrap());
    assert!(all_keys(&prefix).await.is_empty());
}

/// Guards with the watchdog at a short TTL, extended to another TTL and
/// back while the watchdog runs (locks, named leases, leadership): never
/// lost, never another holder, the key's create revision constant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_guards_extended_to_other_ttls_stay_held() {
    let prefix = unique("watchdog");
    let (c1, c3) = (client(&prefix).await, client(&prefix).await);
    let coord = c1.coord();
    let short = Duration::from_secs(2);
    let mut lock = coord
        .locks()
        .unwrap()
        .try_acquire("x", short)
        .await
        .unwrap()
        .unwrap();
    lock.keep_alive();
    let mut lease = coord
        .leases()
        .unwrap()
        .grant("job", short)
        .await
        .unwrap()
        .unwrap();
    lease.keep_alive();
    let lock_rev = claim_keys(&prefix, "lock", "x").await[0].create_revision();
    let lease_rev = lease_kv(&prefix, "job").await.unwrap().create_revision();
    for (i, ttl) in [3, 2, 4, 2].into_iter().enumerate() {
        let ttl = Duration::from_secs(ttl);
        lock.extend(ttl).await.unwrap();
        lease.extend(ttl).await.unwrap();
        sleep(Duration::from_millis(2500)).await;
        assert!(lock.is_valid(), "step {i}: the lock guard is not valid");
        assert!(lease.is_valid(), "step {i}: the lease guard is not valid");
        let keys = claim_keys(&prefix, "lock", "x").await;
        assert_eq!(keys.len(), 1, "step {i}");
        assert_eq!(keys[0].create_revision(), lock_rev, "step {i}");
        assert_eq!(
            lease_kv(&prefix, "job").await.unwrap().create_revision(),
            lease_rev,
            "step {i}"
        );
        refused(
            Lock::try_acquire(&*c3, "x", &OwnerToken::random(), short).await,
            "another lock owner",
        );
        refused(
            Lease::grant(&*c3, "job", &OwnerToken::random(), short).await,
            "another lease owner",
        );
    }
    lock.release().await.unwrap();
    lease.release().await.unwrap();
    assert!(all_keys(&prefix).await.is_empty());
}

/// Two extends of one lock at once through its client (a raw-trait caller
/// renewing from two tasks), one with the lock's TTL, one with another:
/// whatever each answers, an extend that answered `true` must leave the
/// lock held on the server. Without one call per claim at a time in a
/// client (`same_owner_one_client.rs`), the same-TTL extend, whose check
/// also compares the key's lease, found the key moved by the other
/// extend, answered false and dropped the entry, revoking the entry's
/// lease, which by then was the one the other extend moved the key to (it
/// answered true): the key was gone and another owner got the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_extends_never_answer_true_for_a_removed_lock() {
    let prefix = unique("extends");
    let (c1, c3) = (client(&prefix).await, client(&prefix).await);
    let mut bad = Vec::new();
    for round in 0..40u64 {
        let name = format!("x{round}");
        let owner = OwnerToken::random();
        granted(Lock::try_acquire(&*c1, &name, &owner, TTL).await);
        let other = Duration::from_secs(20 + round % 3);
        let delay = Duration::from_micros(round * 100);
        let (a, b) = tokio::join!(Lock::extend(&*c1, &name, &owner, other), async {
            sleep(delay).await;
            Lock::extend(&*c1, &name, &owner, TTL).await
        });
        let (a, b) = (a.unwrap(), b.unwrap());
        sleep(Duration::from_millis(300)).await;
        let keys = claim_keys(&prefix, "lock", &name).await;
        let held = keys.len() == 1 && lease_state(keys[0].lease()).await.0 > 0;
        if (a || b) && !held {
            // The name is free to others while the owner was just told it
            // holds it for 20 s or more.
            let other = Lock::try_acquire(&*c3, &name, &OwnerToken::random(), TTL).await;
            bad.push((round, a, b, matches!(other, Ok(Attempt::Granted(_)))));
            let _ = Lock::force_release(&*c3, &name).await;
        }
        let _ = Lock::release(&*c1, &name, &owner).await;
    }
    assert!(
        bad.is_empty(),
        "rounds (round, other-TTL extend, same-TTL extend, another owner granted) answered \
         true with the lock gone: {bad:?}"
    );
}

// ---------------------------------------------------------------------
// Release of an owner only queued or pending here
// ---------------------------------------------------------------------

/// Waits that queued, then were cancelled or timed out, run a release
/// that also looks the owner up in the queue: it must delete only that
/// waiter's own key, never the holder's nor another waiter's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_and_timed_out_waits_remove_only_their_own_place() {
    let prefix = unique("waits");
    let (c1, c2, c3) = (
        client(&prefix).await,
        client(&prefix).await,
        client(&prefix).await,
    );
    let holder = c2
        .coord()
        .locks()
        .unwrap()
        .try_acquire("x", TTL)
        .await
        .unwrap()
        .unwrap();
    // A waiter through client 3, queued (a live waiter: a raw place in
    // line nobody waits on is swept after 2 s).
    let locks3 = c3.coord().locks().unwrap();
    let w3 = tokio::spawn(async move { locks3.acquire("x", TTL, Duration::from_secs(60)).await });
    assert!(
        eventually(Duration::from_secs(5), || async {
            claim_keys(&prefix, "lock", "x").await.len() == 2
        })
        .await
    );
    let before = claim_keys(&prefix, "lock", "x").await;
    assert_eq!(before.len(), 2);
    let names = |kvs: &[KeyValue]| {
        kvs.iter()
            .map(|kv| {
                let which = if kv.key() == before[0].key() {
                    "holder"
                } else if kv.key() == before[1].key() {
                    "w3"
                } else {
                    "other"
                };
                format!("{which}@{}", kv.create_revision())
            })
            .collect::<Vec<_>>()
    };
    let locks1 = c1.coord().locks().unwrap();
    for round in 0..3 {
        // Cancelled mid-wait.
        let r = timeout(
            Duration::from_millis(1500),
            locks1.acquire("x", TTL, Duration::from_secs(20)),
        )
        .await;
        assert!(r.is_err(), "round {round}: got {r:?}");
        // Timed out.
        let r = locks1.acquire("x", TTL, Duration::from_millis(1200)).await;
        assert!(r.is_err(), "round {round}: got {r:?}");
        assert!(
            eventually(Duration::from_secs(3), || async {
                claim_keys(&prefix, "lock", "x").await.len() == 2
            })
            .await,
            "round {round}: keys {:?}",
            names(&claim_keys(&prefix, "lock", "x").await)
        );
        let keys = claim_keys(&prefix, "lock", "x").await;
        assert_eq!(names(&keys), names(&before), "round {round}");
        assert!(holder.is_valid());
    }
    let th = holder.fencing_token();
    holder.release().await.unwrap();
    // The queued waiter through client 3 is next.
    let g = timeout(Duration::from_secs(5), w3)
        .await
        .expect("the queued waiter was not woken")
        .unwrap()
        .unwrap();
    assert!(g.fencing_token() > th);
    g.release().await.unwrap();
    assert!(all_keys(&prefix).await.is_empty());
}

/// One owner `o` queued through client 2 behind holder `x`, and `y`
/// queued behind `o`; then a release of `o` through client 1, which either
/// queued `o` too (`c1_queued`: the queued-owner path, revoke then
/// `release_unknown`) or has no record of it (the unknown-owner path).
/// A release by owner through another client frees only a held claim:
/// `o` keeps its place through client 2, is granted after `x`, and `y`
/// after `o`. Were `o`'s key in client 2's queue deleted, then after `x`
/// left, client 2's handoff (claim/handoff.rs), which trusts its own key to die
/// only with its own lease or release, would grant `o` on a key that no
/// longer exists while `y`, the real head, is granted too: two holders.
async fn owner_queued_through_two_clients(c1_queued: bool) {
    let prefix = unique("queued2");
    let (c1, c2, c3) = (
        client(&prefix).await,
        client(&prefix).await,
        client(&prefix).await,
    );
    let x = OwnerToken::random();
    let tx = granted(Lock::try_acquire(&*c3, "x", &x, TTL).await);
    let (o, y) = (OwnerToken::random(), OwnerToken::random());
    refused(Lock::try_acquire(&*c2, "x", &o, TTL).await, "o first");
    refused(Lock::try_acquire(&*c2, "x", &o, TTL).await, "o queued");
    if c1_queued {
        refused(Lock::try_acquire(&*c1, "x", &o, TTL).await, "o first (1)");
        refused(Lock::try_acquire(&*c1, "x", &o, TTL).await, "o queued (1)");
    }
    refused(Lock::try_acquire(&*c3, "x", &y, TTL).await, "y first");
    refused(Lock::try_acquire(&*c3, "x", &y, TTL).await, "y queued");
    let n = if c1_queued { 4 } else { 3 };
    assert_eq!(claim_keys(&prefix, "lock", "x").await.len(), n);
    // o held nowhere: false. Client 1's own place (if any) is gone;
    // client 2's place is its waiting acquire's and stays (a release by
    // owner through another client frees a held claim only).
    assert!(!Lock::release(&*c1, "x", &o).await.unwrap());
    let owners: Vec<_> = claim_keys(&prefix, "lock", "x")
        .await
        .iter()
        .map(owner_of)
        .collect();
    assert_eq!(
        owners,
        vec![
            x.to_hex().into_bytes(),
            o.to_hex().into_bytes(),
            y.to_hex().into_bytes()
        ],
        "after the release of o through client 1"
    );
    assert!(Lock::release(&*c3, "x", &x).await.unwrap());
    // Client 2's watch of its predecessor sees x deleted.
    sleep(Duration::from_millis(300)).await;
    let a_o = Lock::try_acquire(&*c2, "x", &o, TTL).await.unwrap();
    let a_y = Lock::try_acquire(&*c3, "x", &y, TTL).await.unwrap();
    let keys = claim_keys(&prefix, "lock", "x").await;
    assert!(
        !(matches!(a_o, Attempt::Granted(_)) && matches!(a_y, Attempt::Granted(_))),
        "two holders: o through client 2 {a_o:?} (its key was deleted), y through client 3 \
         {a_y:?}; keys now {:?}",
        keys.iter()
            .map(owner_of)
            .map(String::from_utf8)
            .collect::<Vec<_>>()
    );
    // o, first in line through client 2, holds; y waits behind it.
    let Attempt::Granted(to) = a_o else {
        panic!("o, first in line through client 2, was refused: {a_o:?}")
    };
    assert!(to.get() > tx);
    assert!(matches!(a_y, Attempt::Held { .. }), "{a_y:?}");
    assert!(Lock::release(&*c2, "x", &o).await.unwrap());
    sleep(Duration::from_millis(300)).await;
    let Attempt::Granted(ty) = Lock::try_acquire(&*c3, "x", &y, TTL).await.unwrap() else {
        panic!("y, first in line after o, was refused")
    };
    assert!(ty > to);
    assert!(Lock::release(&*c3, "x", &y).await.unwrap());
    assert!(all_keys(&prefix).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_queued_through_two_clients_released_through_one_where_it_queued() {
    owner_queued_through_two_clients(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_queued_through_another_client_released_through_one_without_record() {
    owner_queued_through_two_clients(false).await;
}

/// A held owner retried through a second client with the fair attempt's
/// queueing armed (a refused try, then more): never queued behind itself,
/// never another token; its release there frees it; the first client's
/// stale extend and release then do nothing to the next holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_owner_retried_through_another_client_never_queues_behind_itself() {
    let prefix = unique("own-head");
    let (c1, c2, c3) = (
        client(&prefix).await,
        client(&prefix).await,
        client(&prefix).await,
    );
    let o = OwnerToken::random();
    let t = granted(Lock::try_acquire(&*c1, "x", &o, TTL).await);
    for i in 0..4 {
        match Lock::try_acquire(&*c2, "x", &o, TTL).await.unwrap() {
            Attempt::Granted(again) => assert_eq!(again.get(), t, "try {i}"),
            Attempt::Held { .. } => {}
        }
        assert_eq!(
            claim_keys(&prefix, "lock", "x").await.len(),
            1,
            "try {i}: the owner queued behind itself"
        );
    }
    // The same through client 2 with a waiting acquire's pattern: its
    // extend (it holds nothing there) is false and changes nothing.
    assert!(!Lock::extend(&*c2, "x", &o, TTL).await.unwrap());
    assert!(Lock::extend(&*c1, "x", &o, TTL).await.unwrap());
    assert!(Lock::release(&*c2, "x", &o).await.unwrap());
    assert!(claim_keys(&prefix, "lock", "x").await.is_empty());
    let n = OwnerToken::random();
    let tn = granted(Lock::try_acquire(&*c3, "x", &n, TTL).await);
    assert!(tn > t);
    assert!(!Lock::extend(&*c1, "x", &o, TTL).await.unwrap());
    assert!(!Lock::release(&*c1, "x", &o).await.unwrap());
    sleep(Duration::from_millis(500)).await;
    refused(
        Lock::try_acquire(&*c2, "x", &OwnerToken::random(), TTL).await,
        "a stale client 1 call freed the next holder",
    );
    assert!(Lock::release(&*c3, "x", &n).await.unwrap());
    assert!(all_keys(&prefix).await.is_empty());
}

/// An election's leader retried through a second client: Held (no other
/// term), its resign there ends the leadership, the first client's renew
/// is false and changes nothing for the next leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_leader_through_two_clients() {
    let prefix = unique("election");
    let (c1, c2, c3) = (
        client(&prefix).await,
        client(&prefix).await,
        client(&prefix).await,
    );
    let o = OwnerToken::random();
    let term = granted(Election::try_campaign(&*c1, "e", "a", &o, TTL).await);
    for _ in 0..3 {
        match Election::try_campaign(&*c2, "e", "a", &o, TTL)
            .await
            .unwrap()
        {
            Attempt::Granted(again) => assert_eq!(again.get(), term),
            Attempt::Held { .. } => {}
        }
    }
    assert_eq!(claim_keys(&prefix, "election", "e").await.len(), 1);
    assert!(Election::resign(&*c2, "e", &o).await.unwrap());
    assert!(Election::leader(&*c3, "e").await.unwrap().is_none());
    let n = OwnerToken::random();
    let t2 = granted(Election::try_campaign(&*c3, "e", "b", &n, TTL).await);
    assert!(t2 > term);
    assert!(!Election::renew(&*c1, "e", &o, TTL).await.unwrap());
    assert!(!Election::resign(&*c1, "e", &o).await.unwrap());
    let leader = Election::leader(&*c2, "e").await.unwrap().unwrap();
    assert_eq!(leader.term.get(), t2);
    assert!(Election::resign(&*c3, "e", &n).await.unwrap());
    assert!(all_keys(&prefix).await.is_empty());
}
