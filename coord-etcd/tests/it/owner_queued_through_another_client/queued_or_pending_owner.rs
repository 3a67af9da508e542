//! Releases of an owner only queued or pending through this client: a
//! cancelled or timed-out wait removes only its own place, a release frees
//! the owner's claim held through another client but never its place in
//! another client's queue, a held owner retried through another client
//! never queues behind itself, and an election's leader retried through a
//! second client.

use crate::claim_support;
use std::time::Duration;

use coord_core::{Attempt, Election, Lock, OwnerToken};
use etcd_client::KeyValue;
use tokio::time::{sleep, timeout};

use claim_support::{all_keys, claim_keys, client, granted, owner_of, unique};

use super::{TTL, eventually, refused};

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
    let tx = granted(Lock::try_acquire(&*c3, "x", x.step(), TTL).await);
    let (o, y) = (OwnerToken::random(), OwnerToken::random());
    refused(Lock::try_acquire(&*c2, "x", o.step(), TTL).await, "o first");
    refused(
        Lock::try_acquire(&*c2, "x", o.step(), TTL).await,
        "o queued",
    );
    if c1_queued {
        refused(
            Lock::try_acquire(&*c1, "x", o.step(), TTL).await,
            "o first (1)",
        );
        refused(
            Lock::try_acquire(&*c1, "x", o.step(), TTL).await,
            "o queued (1)",
        );
    }
    refused(Lock::try_acquire(&*c3, "x", y.step(), TTL).await, "y first");
    refused(
        Lock::try_acquire(&*c3, "x", y.step(), TTL).await,
        "y queued",
    );
    let n = if c1_queued { 4 } else { 3 };
    assert_eq!(claim_keys(&prefix, "lock", "x").await.len(), n);
    // o held nowhere: false. Client 1's own place (if any) is gone;
    // client 2's place is its waiting acquire's and stays (a release by
    // owner through another client frees a held claim only).
    assert!(!Lock::release(&*c1, "x", o.step()).await.unwrap());
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
    assert!(Lock::release(&*c3, "x", x.step()).await.unwrap());
    // Client 2's watch of its predecessor sees x deleted.
    sleep(Duration::from_millis(300)).await;
    let a_o = Lock::try_acquire(&*c2, "x", o.step(), TTL).await.unwrap();
    let a_y = Lock::try_acquire(&*c3, "x", y.step(), TTL).await.unwrap();
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
    assert!(Lock::release(&*c2, "x", o.step()).await.unwrap());
    sleep(Duration::from_millis(300)).await;
    let Attempt::Granted(ty) = Lock::try_acquire(&*c3, "x", y.step(), TTL).await.unwrap() else {
        panic!("y, first in line after o, was refused")
    };
    assert!(ty > to);
    assert!(Lock::release(&*c3, "x", y.step()).await.unwrap());
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
    let t = granted(Lock::try_acquire(&*c1, "x", o.step(), TTL).await);
    for i in 0..4 {
        match Lock::try_acquire(&*c2, "x", o.step(), TTL).await.unwrap() {
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
    assert!(!Lock::extend(&*c2, "x", o.step(), TTL).await.unwrap());
    assert!(Lock::extend(&*c1, "x", o.step(), TTL).await.unwrap());
    assert!(Lock::release(&*c2, "x", o.step()).await.unwrap());
    assert!(claim_keys(&prefix, "lock", "x").await.is_empty());
    let n = OwnerToken::random();
    let tn = granted(Lock::try_acquire(&*c3, "x", n.step(), TTL).await);
    assert!(tn > t);
    assert!(!Lock::extend(&*c1, "x", o.step(), TTL).await.unwrap());
    assert!(!Lock::release(&*c1, "x", o.step()).await.unwrap());
    sleep(Duration::from_millis(500)).await;
    refused(
        Lock::try_acquire(&*c2, "x", OwnerToken::random().step(), TTL).await,
        "a stale client 1 call freed the next holder",
    );
    assert!(Lock::release(&*c3, "x", n.step()).await.unwrap());
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
    let term = granted(Election::try_campaign(&*c1, "e", "a", o.step(), TTL).await);
    for _ in 0..3 {
        match Election::try_campaign(&*c2, "e", "a", o.step(), TTL)
            .await
            .unwrap()
        {
            Attempt::Granted(again) => assert_eq!(again.get(), term),
            Attempt::Held { .. } => {}
        }
    }
    assert_eq!(claim_keys(&prefix, "election", "e").await.len(), 1);
    assert!(Election::resign(&*c2, "e", o.step()).await.unwrap());
    assert!(Election::leader(&*c3, "e").await.unwrap().is_none());
    let n = OwnerToken::random();
    let t2 = granted(Election::try_campaign(&*c3, "e", "b", n.step(), TTL).await);
    assert!(t2 > term);
    assert!(!Election::renew(&*c1, "e", o.step(), TTL).await.unwrap());
    assert!(!Election::resign(&*c1, "e", o.step()).await.unwrap());
    let leader = Election::leader(&*c2, "e").await.unwrap().unwrap();
    assert_eq!(leader.term.get(), t2);
    assert!(Election::resign(&*c3, "e", n.step()).await.unwrap());
    assert!(all_keys(&prefix).await.is_empty());
}
