//! The primitives beside locks: fencing tokens strictly increase,
//! elections campaign, lead, resign and wake, barriers keep generations,
//! limiters admit exactly the limit across clients, and named leases are
//! granted, renewed, revoked and expire.

use std::time::Duration;

use coord_core::{
    Algorithm, Attempt, Barrier, Election, Error, FencingSource, Lease, Limiter, OwnerToken, Quota,
};
use coord_etcd::EtcdBackend;
use tokio::time::{sleep, timeout};

use super::{backend, granted, ttl};

#[tokio::test]
async fn fencing_tokens_strictly_increase() {
    let a = backend().await;
    let b = backend().await;
    let mut last = 0;
    for i in 0..20 {
        let src: &EtcdBackend = if i % 2 == 0 { &a } else { &b };
        let t = src.next("fence-res").await.unwrap().get();
        assert!(t > last);
        last = t;
    }
}

#[tokio::test]
async fn election_campaign_leader_resign_and_wakeups() {
    let a = backend().await;
    let b = backend().await;
    let name = "elect";
    let t = ttl(&a) * 2;
    let (o1, o2) = (OwnerToken::random(), OwnerToken::random());
    assert_eq!(a.leader(name).await.unwrap(), None);
    let term1 = granted(a.try_campaign(name, "alice", o1.step(), t).await.unwrap());
    assert_eq!(
        granted(a.try_campaign(name, "alice", o1.step(), t).await.unwrap()),
        term1
    );
    let w = Election::subscribe(&*b, name).await.unwrap();
    assert!(matches!(
        b.try_campaign(name, "bob", o2.step(), t).await.unwrap(),
        Attempt::Held { .. }
    ));
    let l = a.leader(name).await.unwrap().unwrap();
    assert_eq!((l.candidate.as_str(), l.term.get()), ("alice", term1));
    assert!(Election::renew(&*a, name, o1.step(), t).await.unwrap());
    let notified = w.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    assert!(a.resign(name, o1.step()).await.unwrap());
    timeout(Duration::from_secs(3), notified)
        .await
        .expect("the watch wakes the other candidate");
    let term2 = granted(b.try_campaign(name, "bob", o2.step(), t).await.unwrap());
    assert!(term2 > term1);
    assert_eq!(b.leader(name).await.unwrap().unwrap().candidate, "bob");
    assert!(!Election::renew(&*a, name, o1.step(), t).await.unwrap());
    assert!(b.resign(name, o2.step()).await.unwrap());
    assert_eq!(b.leader(name).await.unwrap(), None);
}

#[tokio::test]
async fn barrier_generations_idempotence_and_party_mismatch() {
    let a = backend().await;
    let b = backend().await;
    let name = "barrier";
    let w = Barrier::subscribe(&*b, name).await.unwrap();
    let r1 = a
        .arrive(name, 2, "p1", &coord_core::OwnerToken::random())
        .await
        .unwrap();
    assert!(!r1.complete);
    assert_eq!(
        a.arrive(name, 2, "p1", &coord_core::OwnerToken::random())
            .await
            .unwrap(),
        r1
    );
    let e = b
        .arrive(name, 3, "p2", &coord_core::OwnerToken::random())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert!(!a.is_complete(name, r1.generation).await.unwrap());
    let notified = w.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    let r2 = b
        .arrive(name, 2, "p2", &coord_core::OwnerToken::random())
        .await
        .unwrap();
    assert!(r2.complete);
    assert_eq!(r2.generation, r1.generation);
    timeout(Duration::from_secs(3), notified)
        .await
        .expect("completion wakes waiters");
    assert!(a.is_complete(name, r1.generation).await.unwrap());
    // Next generation; withdraw before it completes.
    let id3 = coord_core::OwnerToken::random();
    let r3 = a.arrive(name, 2, "p1", &id3).await.unwrap();
    assert_eq!(r3.generation, r1.generation + 1);
    assert!(a.withdraw(name, r3.generation, "p1", &id3).await.unwrap());
    assert!(!a.withdraw(name, r1.generation, "p1", &id3).await.unwrap());
}

#[tokio::test]
async fn limiters_admit_exactly_the_limit_across_clients() {
    let a = backend().await;
    let b = backend().await;
    for alg in Algorithm::ALL {
        let q = Quota::new(10, Duration::from_secs(30), alg);
        let key = format!("limit-{alg:?}");
        let mut admitted = 0;
        let mut tasks = Vec::new();
        for i in 0..16 {
            let be = if i % 2 == 0 { a.clone() } else { b.clone() };
            let key = key.clone();
            tasks.push(tokio::spawn(
                async move { be.check(&key, &q, 1).await.unwrap() },
            ));
        }
        for t in tasks {
            let d = t.await.unwrap();
            if d.allowed {
                admitted += 1;
            } else {
                assert!(d.retry_after > Duration::ZERO);
            }
        }
        assert_eq!(admitted, 10, "{alg:?}");
    }
}

#[tokio::test]
async fn named_leases_grant_renew_remaining_revoke_and_expire() {
    let a = backend().await;
    let b = backend().await;
    let name = "worker-7";
    let t = ttl(&a) * 2;
    let (o1, o2) = (OwnerToken::random(), OwnerToken::random());
    let tok = granted(a.grant(name, o1.step(), t).await.unwrap());
    assert_eq!(granted(a.grant(name, o1.step(), t).await.unwrap()), tok);
    assert!(matches!(
        b.grant(name, o2.step(), t).await.unwrap(),
        Attempt::Held { .. }
    ));
    let left = b.remaining(name).await.unwrap().expect("live");
    assert!(left <= t, "{left:?}");
    let mine = a.remaining(name).await.unwrap().expect("live");
    assert!(mine <= t && mine > t / 2, "{mine:?}");
    assert!(Lease::renew(&*a, name, o1.step(), t * 2).await.unwrap());
    assert!(!Lease::renew(&*b, name, o2.step(), t).await.unwrap());
    assert!(!b.revoke(name, o2.step()).await.unwrap());
    assert!(a.revoke(name, o1.step()).await.unwrap());
    assert_eq!(b.remaining(name).await.unwrap(), None);
    // Expiry without renew; renewing afterwards resurrects nothing.
    let t1 = ttl(&a);
    granted(b.grant(name, o2.step(), t1).await.unwrap());
    sleep(t1 + Duration::from_millis(300)).await;
    assert!(!Lease::renew(&*b, name, o2.step(), t1).await.unwrap());
    assert_eq!(a.remaining(name).await.unwrap(), None);
    granted(a.grant(name, o1.step(), t1).await.unwrap());
    assert!(a.revoke(name, o1.step()).await.unwrap());
}
