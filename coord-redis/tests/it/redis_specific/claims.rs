//! Claims on one server: the PHP class's `SET NX` lock blocks a coord
//! lock (and coord never deletes it), a release by another owner never
//! deletes a lock, and leases, elections and barriers work.

use crate::common;

use common::{SEC, backend, granted, php_backend, unique};
use conformance::testkit::redis::{self as kit, Resp};
use coord_core::{Attempt, Barrier, Election, Error, FencingSource, Lease, Lock, OwnerToken};

#[tokio::test]
async fn php_php_set_nx_blocks_a_coord_lock_and_coord_never_deletes_it() {
    let server = kit::server();
    let b = php_backend(&server.url()).await;
    let name = unique("order_process");
    let php_token = "0123456789abcdef0123456789abcdef";

    // What PHP's RedisLock::acquire sends.
    let reply = server.command(&["SET", &name, php_token, "NX", "EX", "30"]);
    assert_eq!(reply, Resp::Simple("OK".into()));

    let me = OwnerToken::random();
    match b.try_acquire(&name, me.step(), 10 * SEC).await.unwrap() {
        Attempt::Held { expires_in } => {
            let left = expires_in.expect("the PTTL of the PHP lock");
            assert!(left > 25 * SEC && left <= 30 * SEC, "{left:?}");
        }
        other => panic!("a PHP-held lock must block coord, got {other:?}"),
    }
    // coord's release and extend never touch a lock holding another token.
    assert!(!b.release(&name, me.step()).await.unwrap());
    assert!(!b.extend(&name, me.step(), 60 * SEC).await.unwrap());
    assert_eq!(server.command(&["GET", &name]).as_str(), Some(php_token));

    // The PHP release (its compare-and-delete) frees it; then coord gets it.
    let php_release = "if redis.call('get', KEYS[1]) == ARGV[1] then \
                       return redis.call('del', KEYS[1]) else return 0 end";
    let r = server.command(&["EVAL", php_release, "1", &name, php_token]);
    assert_eq!(r, Resp::Int(1));
    let token = granted(b.try_acquire(&name, me.step(), 10 * SEC).await.unwrap());

    // The key holds coord's owner token as 32 hex digits, as PHP's would,
    // with the TTL set; the fencing counter is the PHP class's key.
    assert_eq!(
        server.command(&["GET", &name]).as_str(),
        Some(me.to_hex().as_str())
    );
    let pttl = server.command(&["PTTL", &name]).as_int().unwrap();
    assert!(pttl > 9_000 && pttl <= 10_000, "{pttl}");
    let counter = server
        .command(&["GET", &format!("fencing_token_{name}")])
        .as_int()
        .unwrap();
    assert_eq!(counter as u64, token);

    // Now PHP is locked out by coord.
    let reply = server.command(&["SET", &name, php_token, "NX", "EX", "30"]);
    assert!(reply.is_nil(), "PHP's SET NX must fail, got {reply:?}");
    // And PHP's release with its own token does not delete coord's lock.
    let r = server.command(&["EVAL", php_release, "1", &name, php_token]);
    assert_eq!(r, Resp::Int(0));
    assert!(b.release(&name, me.step()).await.unwrap());
    assert!(server.command(&["GET", &name]).is_nil());

    // PHP's `INCR fencing_token_<resource>` and coord's fencing source
    // share the counter and keep it rising.
    let php_next = server
        .command(&["INCR", &format!("fencing_token_{name}")])
        .as_int()
        .unwrap() as u64;
    assert!(php_next > token);
    let next = b.next(&name).await.unwrap().get();
    assert!(next > php_next);
}

#[tokio::test]
async fn release_never_deletes_a_lock_holding_another_token() {
    let b = backend(&kit::url()).await;
    let name = unique("foreign");
    let (a, c) = (OwnerToken::random(), OwnerToken::random());
    let t = granted(b.try_acquire(&name, a.step(), 10 * SEC).await.unwrap());
    assert!(matches!(
        b.try_acquire(&name, c.step(), 10 * SEC).await.unwrap(),
        Attempt::Held {
            expires_in: Some(_)
        }
    ));
    assert!(!b.release(&name, c.step()).await.unwrap());
    assert!(!b.extend(&name, c.step(), 20 * SEC).await.unwrap());
    // Idempotent retry by the holder: the same token.
    assert_eq!(
        granted(b.try_acquire(&name, a.step(), 10 * SEC).await.unwrap()),
        t
    );
    assert!(b.release(&name, a.step()).await.unwrap());
    assert!(!b.release(&name, a.step()).await.unwrap());
    // Extend never resurrects.
    assert!(!b.extend(&name, a.step(), 10 * SEC).await.unwrap());
    let t2 = granted(b.try_acquire(&name, c.step(), 10 * SEC).await.unwrap());
    assert!(t2 > t);
    assert!(b.force_release(&name).await.unwrap());
    assert!(!b.force_release(&name).await.unwrap());
}

#[tokio::test]
async fn lease_election_barrier_basics() {
    let b = backend(&kit::url()).await;
    let (x, y) = (OwnerToken::random(), OwnerToken::random());

    let lease = unique("lease");
    let t = granted(b.grant(&lease, x.step(), 5 * SEC).await.unwrap());
    assert!(matches!(
        b.grant(&lease, y.step(), 5 * SEC).await.unwrap(),
        Attempt::Held { .. }
    ));
    let left = b.remaining(&lease).await.unwrap().unwrap();
    assert!(left <= 5 * SEC && left > 4 * SEC);
    assert!(Lease::renew(&b, &lease, x.step(), 8 * SEC).await.unwrap());
    assert!(!Lease::renew(&b, &lease, y.step(), 8 * SEC).await.unwrap());
    assert!(b.revoke(&lease, x.step()).await.unwrap());
    assert_eq!(b.remaining(&lease).await.unwrap(), None);
    assert!(granted(b.grant(&lease, y.step(), 5 * SEC).await.unwrap()) > t);

    let el = unique("election");
    assert_eq!(b.leader(&el).await.unwrap(), None);
    let t1 = granted(
        b.try_campaign(&el, "alice", x.step(), 5 * SEC)
            .await
            .unwrap(),
    );
    assert!(matches!(
        b.try_campaign(&el, "bob", y.step(), 5 * SEC).await.unwrap(),
        Attempt::Held { .. }
    ));
    let l = b.leader(&el).await.unwrap().unwrap();
    assert_eq!((l.candidate.as_str(), l.term.get()), ("alice", t1));
    assert!(Election::renew(&b, &el, x.step(), 5 * SEC).await.unwrap());
    assert!(!b.resign(&el, y.step()).await.unwrap());
    assert!(b.resign(&el, x.step()).await.unwrap());
    let t2 = granted(b.try_campaign(&el, "bob", y.step(), 5 * SEC).await.unwrap());
    assert!(t2 > t1);
    assert_eq!(b.leader(&el).await.unwrap().unwrap().candidate, "bob");

    let bar = unique("barrier");
    let a1 = b
        .arrive(&bar, 2, "p1", &coord_core::OwnerToken::random())
        .await
        .unwrap();
    assert!(!a1.complete);
    assert_eq!(
        b.arrive(&bar, 2, "p1", &coord_core::OwnerToken::random())
            .await
            .unwrap(),
        a1
    );
    let err = b
        .arrive(&bar, 3, "p2", &coord_core::OwnerToken::random())
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        Error::InvalidArgument {
            field: "parties",
            ..
        }
    ));
    assert!(!b.is_complete(&bar, a1.generation).await.unwrap());
    let a2 = b
        .arrive(&bar, 2, "p2", &coord_core::OwnerToken::random())
        .await
        .unwrap();
    assert!(a2.complete && a2.generation == a1.generation);
    assert!(b.is_complete(&bar, a1.generation).await.unwrap());
    let id3 = coord_core::OwnerToken::random();
    assert!(!b.withdraw(&bar, a1.generation, "p1", &id3).await.unwrap());
    let a3 = b.arrive(&bar, 2, "p1", &id3).await.unwrap();
    assert_eq!(a3.generation, a1.generation + 1);
    assert!(b.withdraw(&bar, a3.generation, "p1", &id3).await.unwrap());
    // After the withdrawal the generation is empty: another party count is fine.
    assert!(
        !b.arrive(&bar, 3, "p1", &coord_core::OwnerToken::random())
            .await
            .unwrap()
            .complete
    );
}
