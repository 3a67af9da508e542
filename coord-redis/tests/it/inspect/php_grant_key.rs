//! The PHP layout keeps a lock's metadata in the grant key beside the
//! claim, which holds the bare owner token.

use crate::common;
use std::time::Duration;

use common::{SEC, granted};
use conformance::testkit::redis::RedisServer;
use coord_core::{Error, Lock, OwnerToken};
use coord_redis::Layout;
use tokio::time::sleep;

use super::{MS, backend_on, dbsize, get, one_holder, pttl};

/// When `key` expires, in Unix milliseconds: two keys given the same
/// expiry compare equal however long apart they are read.
fn pexpiretime(server: &RedisServer, key: &str) -> i64 {
    server.command(&["PEXPIRETIME", key]).as_int().unwrap()
}

/// The PHP layout: the claim keeps the bare owner token the PHP class
/// compares, the metadata goes in coord's grant key beside it (no extra
/// key), both end together (release, extend, expiry, force release); a
/// PHP holder is shown with its token as owner, fencing token 0 and no
/// metadata, even when a coord grant key was left behind by a claim
/// deleted under it.
#[tokio::test]
async fn php_layout_keeps_metadata_in_the_grant_key() {
    let server = RedisServer::start();
    let b = backend_on(&server.url(), Layout::Php).await;
    let me = OwnerToken::random();
    let name = "order_process_7";
    let grant = "coord:lock:{order_process_7}:grant";
    let meta = br#"{"host":"web-3"}"#;
    let t = granted(b.try_acquire(name, me.step(), 10 * SEC).await.unwrap());
    let plain_keys = dbsize(&server);
    assert_eq!(get(&server, grant).unwrap(), t.to_string());
    let h = one_holder(&Lock::inspect(&b, name).await.unwrap()).clone();
    assert_eq!((h.owner, h.token.get(), h.metadata), (me, t, None));
    assert!(b.release(name, me.step()).await.unwrap());

    let t = granted(
        b.try_acquire_with_metadata(name, me.step(), 800 * MS, meta)
            .await
            .unwrap(),
    );
    assert_eq!(
        dbsize(&server),
        plain_keys,
        "metadata wrote a key of its own"
    );
    assert_eq!(
        get(&server, name).unwrap(),
        me.to_hex(),
        "what PHP compares"
    );
    let h = one_holder(&Lock::inspect(&b, name).await.unwrap()).clone();
    assert_eq!((h.owner, h.token.get()), (me, t));
    assert_eq!(h.metadata.as_deref(), Some(&meta[..]));
    // A retry keeps it; extend keeps it as long as the claim.
    let again = b
        .try_acquire_with_metadata(name, me.step(), 800 * MS, b"{}")
        .await
        .unwrap();
    assert_eq!(granted(again), t);
    assert_eq!(
        granted(b.try_acquire(name, me.step(), 800 * MS).await.unwrap()),
        t
    );
    for _ in 0..3 {
        sleep(Duration::from_millis(300)).await;
        assert!(b.extend(name, me.step(), 800 * MS).await.unwrap());
        let (a, g) = (pexpiretime(&server, name), pexpiretime(&server, grant));
        assert!(
            (a - g).abs() <= 2,
            "claim expires at {a} ms, grant key at {g} ms"
        );
        assert!(pttl(&server, name) > 400, "the extend kept the claim");
    }
    let h = one_holder(&Lock::inspect(&b, name).await.unwrap()).clone();
    assert_eq!(h.metadata.as_deref(), Some(&meta[..]));
    assert!(b.extend(name, me.step(), 200 * MS).await.unwrap());
    sleep(Duration::from_millis(300)).await;
    assert!(Lock::inspect(&b, name).await.unwrap().holders.is_empty());
    assert!(get(&server, grant).is_none(), "metadata outlived the claim");

    // Release and force release.
    granted(
        b.try_acquire_with_metadata(name, me.step(), 10 * SEC, meta)
            .await
            .unwrap(),
    );
    assert!(b.release(name, me.step()).await.unwrap());
    assert!(get(&server, grant).is_none() && get(&server, name).is_none());
    granted(
        b.try_acquire_with_metadata(name, me.step(), 10 * SEC, meta)
            .await
            .unwrap(),
    );
    assert!(b.force_release(name).await.unwrap());
    assert!(get(&server, grant).is_none() && get(&server, name).is_none());

    // A PHP holder.
    let php = "00112233445566778899aabbccddeeff";
    server.command(&["SET", name, php, "NX", "EX", "30"]);
    let h = one_holder(&Lock::inspect(&b, name).await.unwrap()).clone();
    assert_eq!(h.owner.to_hex(), php);
    assert_eq!((h.token.get(), h.metadata.clone()), (0, None));
    assert!(h.remaining.unwrap() > 29 * SEC);
    server.command(&["DEL", name]);
    // A coord grant deleted under it (by hand), then PHP takes the name:
    // the grant key left behind is not shown for PHP's holder.
    granted(
        b.try_acquire_with_metadata(name, me.step(), 10 * SEC, meta)
            .await
            .unwrap(),
    );
    server.command(&["DEL", name]);
    server.command(&["SET", name, php, "NX", "EX", "30"]);
    let h = one_holder(&Lock::inspect(&b, name).await.unwrap()).clone();
    assert_eq!(
        (h.owner.to_hex(), h.token.get(), h.metadata),
        (php.into(), 0, None)
    );
    // A PHP token that is not 32 hex digits: a store error, no panic.
    server.command(&["SET", name, "not-hex", "EX", "30"]);
    assert!(matches!(
        Lock::inspect(&b, name).await,
        Err(Error::Store { .. })
    ));
}
