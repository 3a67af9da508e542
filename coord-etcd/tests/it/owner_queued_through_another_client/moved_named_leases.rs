//! Named leases moved by a grant through a second client: the move keeps
//! the token and metadata and leaks nothing, `remaining` never exceeds the
//! moved key's lease, a lost reply of a move never ends the owner's live
//! lease, and grants bouncing between two clients never end the other's
//! claim or leak a lease.

use crate::claim_support;
use std::time::Duration;

use conformance::testkit::etcd;
use conformance::testkit::proxy::FaultProxy;
use coord_core::{Lease, Lock, OwnerToken};
use tokio::time::{Instant, sleep};

use claim_support::{all_keys, claim_keys, client, client_at, granted, unique};

use super::{TTL, eventually, lease_kv, lease_state, refused};

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
    let t = granted(Lease::grant_with_metadata(&*c1, "job", owner.step(), TTL, b"{\"m\":1}").await);
    let before = lease_kv(&prefix, "job").await.expect("the key");
    let l1 = before.lease();
    let t2 =
        granted(Lease::grant_with_metadata(&*c2, "job", owner.step(), TTL, b"{\"m\":2}").await);
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
        Lease::grant(&*c3, "job", OwnerToken::random().step(), TTL).await,
        "another owner while the moved lease lives",
    );
    // Client 1: lost at its renewal; its lease ends (it was its own).
    assert!(!Lease::renew(&*c1, "job", owner.step(), TTL).await.unwrap());
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
    assert!(Lease::renew(&*c2, "job", owner.step(), TTL).await.unwrap());
    assert!(
        Lease::renew(&*c2, "job", owner.step(), Duration::from_secs(20))
            .await
            .unwrap()
    );
    assert!(Lease::renew(&*c2, "job", owner.step(), TTL).await.unwrap());
    let kv = lease_kv(&prefix, "job").await.unwrap();
    assert_eq!(kv.create_revision() as u64, t);
    assert_eq!(kv.value(), before.value());
    assert!(Lease::revoke(&*c2, "job", owner.step()).await.unwrap());
    assert!(!Lease::revoke(&*c1, "job", owner.step()).await.unwrap());
    assert!(lease_kv(&prefix, "job").await.is_none());
    for id in [l1, l2, kv.lease()] {
        let (_, keys) = lease_state(id).await;
        assert!(keys.is_empty(), "lease {id:x} still carries {keys:?}");
    }
    let next = granted(Lease::grant(&*c1, "job", OwnerToken::random().step(), TTL).await);
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
    let t = granted(Lease::grant(&*c1, "job", owner.step(), TTL).await);
    assert_eq!(
        granted(Lease::grant(&*c2, "job", owner.step(), short).await),
        t
    );
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
    assert!(!Lease::renew(&*c1, "job", owner.step(), TTL).await.unwrap());
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
    let t = granted(Lease::grant(&*c1, "job", owner.step(), TTL).await);
    let key = format!("{prefix}lease/job").into_bytes();
    let k = key.clone();
    proxy.deliver_late(
        move |b| is_move_of(&k, b),
        Duration::from_millis(50),
        Duration::from_millis(400),
    );
    // Once the move is held, nothing else of client 2's passes: its retries
    // on a new connection fail too, and the grant answers an error.
    let (r, ()) = tokio::join!(Lease::grant(&*c2, "job", owner.step(), TTL), async {
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
    assert_eq!(
        granted(Lease::grant(&*c2, "job", owner.step(), TTL).await),
        t
    );
    assert!(Lease::revoke(&*c2, "job", owner.step()).await.unwrap());
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
            granted(Lease::grant(&*c3, &name, owner.step(), TTL).await);
        }
        let (a, b) = tokio::join!(
            Lease::grant(&*c1, &name, owner.step(), TTL),
            Lease::grant(&*c2, &name, owner.step(), TTL)
        );
        let (a, b) = (granted(a), granted(b));
        assert_eq!(a, b, "round {round}: two tokens for one owner");
        assert!(a > last, "round {round}: token {a} after {last}");
        last = a;
        let kv = lease_kv(&prefix, &name).await.unwrap();
        assert_eq!(kv.create_revision() as u64, a);
        refused(
            Lease::grant(&*c3, &name, OwnerToken::random().step(), TTL).await,
            "another owner",
        );
        let r1 = Lease::renew(&*c1, &name, owner.step(), TTL).await.unwrap();
        let r2 = Lease::renew(&*c2, &name, owner.step(), TTL).await.unwrap();
        assert!(
            r1 ^ r2,
            "round {round}: renewals through client 1 {r1}, client 2 {r2}"
        );
        let after = lease_kv(&prefix, &name).await.unwrap();
        assert_eq!(after.lease(), kv.lease(), "round {round}: the key moved");
        assert!(lease_state(kv.lease()).await.0 > 0);
        let (holder, other) = if r1 { (&c1, &c2) } else { (&c2, &c1) };
        assert!(Lease::revoke(&**holder, &name, owner.step()).await.unwrap());
        assert!(!Lease::revoke(&**other, &name, owner.step()).await.unwrap());
        assert!(!Lease::revoke(&*c3, &name, owner.step()).await.unwrap());
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
        let t = granted(Lease::grant(&*c1, &job, owner.step(), TTL).await);
        assert_eq!(
            granted(Lease::grant(&*c2, &job, owner.step(), TTL).await),
            t
        );
        let (first, stale) = if mirror { (&c1, &c2) } else { (&c2, &c1) };
        assert!(Lease::revoke(&**first, &job, owner.step()).await.unwrap());
        let holder = OwnerToken::random();
        granted(Lock::try_acquire(&**first, &x, holder.step(), TTL).await);
        let lock_lease = claim_keys(&prefix, "lock", &x).await[0].lease();
        assert!(
            !Lease::renew(&**stale, &job, owner.step(), TTL)
                .await
                .unwrap()
        );
        assert!(!Lease::revoke(&**stale, &job, owner.step()).await.unwrap());
        // A grant of the owner anew through the stale client: a new token.
        let again = granted(Lease::grant(&**stale, &job, owner.step(), TTL).await);
        assert!(again > t);
        assert!(Lease::revoke(&**stale, &job, owner.step()).await.unwrap());
        sleep(Duration::from_millis(700)).await;
        let keys = claim_keys(&prefix, "lock", &x).await;
        assert_eq!(
            keys.iter().map(|k| k.lease()).collect::<Vec<_>>(),
            vec![lock_lease],
            "mirror {mirror}: the lock on the other client's spare is gone"
        );
        refused(
            Lock::try_acquire(&*c3, &x, OwnerToken::random().step(), TTL).await,
            "a third client while the lock lives",
        );
        assert!(Lock::release(&**first, &x, holder.step()).await.unwrap());
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
    let t = granted(Lease::grant(&*c1, "job", owner.step(), TTL).await);
    let mut seen = vec![lease_kv(&prefix, "job").await.unwrap().lease()];
    for i in 0..6 {
        let (now, then) = if i % 2 == 0 { (&c2, &c1) } else { (&c1, &c2) };
        // A renewal-then-grant through `now` (its own entry, if any, is
        // stale: renew says lost, the grant moves the key).
        assert_eq!(
            granted(Lease::grant(&**now, "job", owner.step(), TTL).await),
            t
        );
        let kv = lease_kv(&prefix, "job").await.unwrap();
        assert!(
            !seen.contains(&kv.lease()),
            "the key went back to an old lease"
        );
        seen.push(kv.lease());
        assert!(
            !Lease::renew(&**then, "job", owner.step(), TTL)
                .await
                .unwrap()
        );
        assert!(
            Lease::renew(&**now, "job", owner.step(), TTL)
                .await
                .unwrap()
        );
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
    assert!(Lease::revoke(&*c1, "job", owner.step()).await.unwrap());
    assert!(lease_kv(&prefix, "job").await.is_none());
}
