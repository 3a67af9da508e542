//! A lock's metadata lives in its claim's value: it ends with the grant
//! and writes no key of its own, extend keeps it exactly as long as the
//! claim, a retry by the holder keeps it, and a claim value coord does
//! not write is a store error that never shows it.

use crate::common;
use std::time::Duration;

use common::{SEC, granted, unique};
use conformance::testkit::redis::{self as kit, RedisServer};
use coord_core::{Attempt, Error, Lease, Lock, OwnerToken};
use coord_redis::Layout;
use tokio::time::sleep;

use super::{MS, backend_on, dbsize, dbsize_settles_at, get, one_holder, pttl};

/// A lock's metadata is part of its claim: no key of its own, the value a
/// grant without metadata writes is unchanged, and it is gone after a
/// release, after a force release and after the TTL (the key count comes
/// back to where it was); a later grant without metadata shows none.
#[tokio::test]
async fn lock_metadata_ends_with_its_grant_and_writes_no_key() {
    let server = RedisServer::start();
    let b = backend_on(&server.url(), Layout::Coord).await;
    let (me, other) = (OwnerToken::random(), OwnerToken::random());
    let key = "coord:lock:{m}";
    let meta = br#"{"host":"web-3","pid":4242}"#;
    let base = dbsize(&server);
    assert!(Lock::inspect(&b, "m").await.unwrap().holders.is_empty());

    // Without metadata: one key, `<owner>:<token>` as before.
    let t = granted(b.try_acquire("m", me.step(), 10 * SEC).await.unwrap());
    assert_eq!(dbsize(&server), base + 1);
    assert_eq!(get(&server, key).unwrap(), format!("{}:{t}", me.to_hex()));
    let h = one_holder(&Lock::inspect(&b, "m").await.unwrap()).clone();
    assert_eq!(
        (h.owner, h.token.get(), h.metadata, h.permits),
        (me, t, None, 1)
    );
    let left = h.remaining.expect("a PTTL");
    assert!(left <= 10 * SEC && left > 9 * SEC, "{left:?}");
    assert!(b.release("m", me.step()).await.unwrap());

    // With metadata: still one key, and inspect shows it.
    let t = granted(
        b.try_acquire_with_metadata("m", me.step(), 10 * SEC, meta)
            .await
            .unwrap(),
    );
    assert_eq!(dbsize(&server), base + 1, "metadata wrote a key of its own");
    let h = one_holder(&Lock::inspect(&b, "m").await.unwrap()).clone();
    assert_eq!((h.owner, h.token.get()), (me, t));
    assert_eq!(h.metadata.as_deref(), Some(&meta[..]));
    // Another owner is refused with the holder's PTTL, and changes nothing.
    match b
        .try_acquire_with_metadata("m", other.step(), 10 * SEC, b"{}")
        .await
        .unwrap()
    {
        Attempt::Held { expires_in } => assert!(expires_in.unwrap() > 9 * SEC),
        a => panic!("{a:?}"),
    }
    assert!(!b.release("m", other.step()).await.unwrap());
    assert_eq!(
        one_holder(&Lock::inspect(&b, "m").await.unwrap())
            .metadata
            .as_deref(),
        Some(&meta[..])
    );
    // Released: gone (the key, or a `=<token>` marker without it).
    assert!(b.release("m", me.step()).await.unwrap());
    assert!(Lock::inspect(&b, "m").await.unwrap().holders.is_empty());
    if let Some(v) = get(&server, key) {
        assert!(v.starts_with('=') && !v.contains('~'), "{v}");
    }
    // A later grant without metadata shows none.
    granted(b.try_acquire("m", other.step(), 10 * SEC).await.unwrap());
    assert_eq!(
        one_holder(&Lock::inspect(&b, "m").await.unwrap()).metadata,
        None
    );
    assert!(b.release("m", other.step()).await.unwrap());

    // Force release.
    granted(
        b.try_acquire_with_metadata("m", me.step(), 10 * SEC, meta)
            .await
            .unwrap(),
    );
    assert!(b.force_release("m").await.unwrap());
    assert!(Lock::inspect(&b, "m").await.unwrap().holders.is_empty());
    assert!(get(&server, key).is_none_or(|v| v.starts_with('=') && !v.contains('~')));

    // Expiry: the key count comes back.
    granted(
        b.try_acquire_with_metadata("m", me.step(), 200 * MS, meta)
            .await
            .unwrap(),
    );
    sleep(Duration::from_millis(300)).await;
    assert!(Lock::inspect(&b, "m").await.unwrap().holders.is_empty());
    assert_eq!(
        dbsize_settles_at(&server, base).await,
        base,
        "metadata outlived its grant"
    );
    // Its holder cannot extend or release it any more.
    assert!(!b.extend("m", me.step(), 10 * SEC).await.unwrap());
    assert!(!b.release("m", me.step()).await.unwrap());
    sleep(Duration::from_millis(50)).await;
    assert_eq!(dbsize(&server), base, "keys left behind");
}

/// Extending a lock (or renewing a lease) keeps its metadata exactly as
/// long as the claim: the same key, so the same TTL; once the extensions
/// stop, both end at the claim's TTL.
#[tokio::test]
async fn extend_keeps_metadata_exactly_as_long_as_the_claim() {
    let server = RedisServer::start();
    let b = backend_on(&server.url(), Layout::Coord).await;
    let me = OwnerToken::random();
    let meta = br#"{"job":"nightly"}"#;
    let base = dbsize(&server);
    let ttl = 800 * MS;
    let t = granted(
        b.try_acquire_with_metadata("x", me.step(), ttl, meta)
            .await
            .unwrap(),
    );
    let tl = granted(
        b.grant_with_metadata("x", me.step(), ttl, meta)
            .await
            .unwrap(),
    );
    for _ in 0..4 {
        sleep(Duration::from_millis(300)).await;
        assert!(b.extend("x", me.step(), ttl).await.unwrap());
        assert!(b.renew("x", me.step(), ttl).await.unwrap());
    }
    // 1.2 s after the grant of 800 ms, alive with its metadata and token.
    for (r, tok) in [
        (Lock::inspect(&b, "x").await.unwrap(), t),
        (Lease::inspect(&b, "x").await.unwrap(), tl),
    ] {
        let h = one_holder(&r);
        assert_eq!(h.token.get(), tok);
        assert_eq!(h.metadata.as_deref(), Some(&meta[..]));
        assert!(h.remaining.unwrap() > 400 * MS, "{:?}", h.remaining);
    }
    assert_eq!(dbsize(&server), base + 2, "one key per claim");
    let (lk, ls) = ("coord:lock:{x}", "coord:lease:{x}");
    assert!(pttl(&server, lk) > 400 && pttl(&server, ls) > 400);
    // A longer extension moves both together (one key).
    assert!(b.extend("x", me.step(), 10 * SEC).await.unwrap());
    let h = one_holder(&Lock::inspect(&b, "x").await.unwrap()).clone();
    assert!(h.remaining.unwrap() > 9 * SEC);
    assert_eq!(h.metadata.as_deref(), Some(&meta[..]));
    assert!(b.extend("x", me.step(), 200 * MS).await.unwrap());
    assert!(b.renew("x", me.step(), 200 * MS).await.unwrap());
    sleep(Duration::from_millis(300)).await;
    assert!(Lock::inspect(&b, "x").await.unwrap().holders.is_empty());
    assert!(Lease::inspect(&b, "x").await.unwrap().holders.is_empty());
    assert_eq!(
        dbsize_settles_at(&server, base).await,
        base,
        "metadata outlived its claim"
    );
}

/// A retry by the holder (a lost reply) keeps the grant as it is: the
/// same token and the FIRST metadata, with or without new metadata, also
/// on a claim marked as waited for; the retry refreshes the TTL.
#[tokio::test]
async fn a_retry_by_the_holder_keeps_its_metadata() {
    let server = RedisServer::start();
    let b = backend_on(&server.url(), Layout::Coord).await;
    let me = OwnerToken::random();
    let key = "coord:lock:{r}";
    let first = br#"{"n":1}"#;
    let t = granted(
        b.try_acquire_with_metadata("r", me.step(), 5 * SEC, first)
            .await
            .unwrap(),
    );
    let again = b
        .try_acquire_with_metadata("r", me.step(), 10 * SEC, br#"{"n":2}"#)
        .await
        .unwrap();
    assert_eq!(granted(again), t);
    assert_eq!(
        granted(b.try_acquire("r", me.step(), 10 * SEC).await.unwrap()),
        t
    );
    let h = one_holder(&Lock::inspect(&b, "r").await.unwrap()).clone();
    assert_eq!(
        h.metadata.as_deref(),
        Some(&first[..]),
        "the retry replaced it"
    );
    assert!(
        h.remaining.unwrap() > 9 * SEC,
        "the retry refreshed the TTL"
    );

    // Marked as waited for (what a refused attempt of a client with local
    // waiters does): the holder's retries, extend, inspect and release
    // still read it.
    let v = get(&server, key).unwrap();
    server.command(&["SET", key, &format!("{v}*"), "KEEPTTL"]);
    assert_eq!(
        granted(b.try_acquire("r", me.step(), 10 * SEC).await.unwrap()),
        t
    );
    let again = b
        .try_acquire_with_metadata("r", me.step(), 10 * SEC, b"{}")
        .await
        .unwrap();
    assert_eq!(granted(again), t);
    assert!(b.extend("r", me.step(), 10 * SEC).await.unwrap());
    let h = one_holder(&Lock::inspect(&b, "r").await.unwrap()).clone();
    assert_eq!(
        (h.token.get(), h.metadata.as_deref()),
        (t, Some(&first[..]))
    );
    assert!(b.release("r", me.step()).await.unwrap());
    assert!(Lock::inspect(&b, "r").await.unwrap().holders.is_empty());

    // Metadata of any bytes (the core sends JSON; the store keeps bytes),
    // including the value's own separators and an empty one.
    for m in [&b"~*:=~"[..], b"", b"\x00\xff~", b"*"] {
        let t = granted(
            b.try_acquire_with_metadata("r", me.step(), 5 * SEC, m)
                .await
                .unwrap(),
        );
        let h = one_holder(&Lock::inspect(&b, "r").await.unwrap()).clone();
        assert_eq!((h.token.get(), h.metadata.as_deref()), (t, Some(m)));
        assert_eq!(
            granted(b.try_acquire("r", me.step(), 5 * SEC).await.unwrap()),
            t
        );
        assert!(b.release("r", me.step()).await.unwrap());
    }
}

/// A claim key holding a value coord does not write is a store error
/// (never a panic), and the error shows no part of the value.
#[tokio::test]
async fn a_foreign_claim_value_is_a_store_error_without_the_value() {
    let server = kit::server();
    let b = backend_on(&server.url(), Layout::Coord).await;
    let name = unique("foreign");
    let key = format!("coord:lock:{{{name}}}");
    let secret = "0123456789abcdef0123456789abcdef";
    for v in [
        "plain".to_string(),
        format!("{secret}:notanumber"),
        format!("{secret}:12~unterminated"),
        format!("notahexowner{secret}:12"),
    ] {
        server.command(&["SET", &key, &v, "PX", "10000"]);
        match Lock::inspect(&b, &name).await {
            Err(Error::Store { message, .. }) => {
                assert!(!message.contains(secret), "{message}");
                assert!(!message.contains("notahex"), "{message}");
            }
            other => panic!("{v}: expected a store error, got {other:?}"),
        }
    }
    server.command(&["DEL", &key]);
}
